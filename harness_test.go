package popsub

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub/memlog"
	"github.com/popsub/popsub/wire"
)

// This file holds the test harness: a broker on 127.0.0.1, clients that
// speak the protocol over real WebSockets, and an in-memory Store.

// testSecret signs every token in the tests.
var testSecret = []byte("test-secret-that-is-at-least-32-bytes-long")

// quietLogger discards logs so test output stays readable.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// testServer is a broker served over HTTP on 127.0.0.1.
type testServer struct {
	t      *testing.T
	broker *Broker
	http   *httptest.Server
	url    string // ws://127.0.0.1:port/ws

	mu      sync.Mutex // guards clients
	clients []*client  // dialled through dial, closed by stop

	// opts are the broker's options; open opens its store again, for
	// restart, or is nil when the test brought a Store of its own.
	opts Options
	open func() Store
	wrap func(net.Listener) net.Listener
}

// startBroker serves a broker with opts. A nil Store means a fresh bbolt
// file in the test's temporary folder.
func startBroker(t *testing.T, opts Options) *testServer {
	t.Helper()
	return startBrokerOn(t, opts, nil)
}

// startBrokerSmallBuffers is startBroker with each server socket's send
// buffer fixed at 64 KiB. Linux grows it up to tcp_wmem's maximum, which
// differs between machines, and a test of a peer that does not read must
// not depend on how much the kernel absorbs for it.
func startBrokerSmallBuffers(t *testing.T, opts Options) *testServer {
	t.Helper()
	return startBrokerOn(t, opts, func(l net.Listener) net.Listener {
		return smallBuffers{l}
	})
}

// smallBuffers is a listener whose connections have small send buffers.
type smallBuffers struct{ net.Listener }

// Accept sets each new connection's send buffer to 64 KiB.
func (l smallBuffers) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetWriteBuffer(64 << 10)
	}
	return conn, err
}

// startBrokerOn serves a broker with opts on a listener that wrap, if
// not nil, wraps.
func startBrokerOn(t *testing.T, opts Options,
	wrap func(net.Listener) net.Listener) *testServer {
	t.Helper()
	var open func() Store
	switch {
	case opts.Store == nil && testStore != nil:
		open = testStore(t, opts)
	case opts.Store == nil:
		path := filepath.Join(t.TempDir(), "popsub.db")
		open = func() Store { return openBolt(t, path) }
	}
	ts := serve(t, opts, open, wrap)
	t.Cleanup(ts.stop)
	return ts
}

// serve starts a broker with opts, on a store open opens if opts has
// none, and serves it on a listener that wrap, if not nil, wraps.
func serve(t *testing.T, opts Options, open func() Store,
	wrap func(net.Listener) net.Listener) *testServer {
	t.Helper()
	if opts.Store == nil {
		opts.Store = open()
	}
	opts.Secret = testSecret
	if opts.Logger == nil {
		opts.Logger = quietLogger
	}
	b, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewUnstartedServer(b)
	if wrap != nil {
		srv.Listener = wrap(srv.Listener)
	}
	srv.Start()
	ts := &testServer{t: t, broker: b, http: srv,
		url:  "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws",
		opts: opts, open: open, wrap: wrap}
	ts.opts.Store = nil
	return ts
}

// restart stops the broker as SIGTERM does (Shutdown), and starts
// another on the same store, with the same options, on a new port. The
// test's clients are closed with the first broker.
func (ts *testServer) restart() *testServer {
	ts.t.Helper()
	if ts.open == nil {
		ts.t.Fatal("restart: the test brought its own Store")
	}
	ts.stop()
	next := serve(ts.t, ts.opts, ts.open, ts.wrap)
	ts.t.Cleanup(next.stop)
	return next
}

// stop drops the test's clients, then shuts the broker and the HTTP
// server down. The clients go first: a client that is not reading would
// make the broker wait for its close handshake. Safe to call twice.
func (ts *testServer) stop() {
	ts.mu.Lock()
	for _, c := range ts.clients {
		c.ws.CloseNow()
	}
	ts.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ts.broker.Shutdown(ctx)
	ts.http.Close()
}

// testStore, when set, makes the Store of a broker a test starts without
// one: engine_test.go sets it to run the behavioural tests again on NATS
// JetStream. Tests run one at a time, so a variable will do.
var testStore func(t *testing.T, opts Options) func() Store

// UseStore sets testStore, for engine_test.go (package popsub_test): f
// returns a function that opens one fresh log, the same one each time
// it is called, so that a test may restart its broker on it.
func UseStore(f func(t *testing.T, opts Options) func() Store) {
	testStore = f
}

// Behaviour lists the tests of what clients see, which must hold on any
// Store: engine_test.go runs them again on NATS JetStream. Every test that
// starts a broker on the run's engine (startBroker with no Store of its
// own) is listed here, or in oneEngine with the reason it is not:
// TestBehaviour_EveryTestIsListed holds the two lists to that.
var Behaviour = map[string]func(*testing.T){
	"TestGroups_OnTheRunsEngine":                                           TestGroups_OnTheRunsEngine,
	"TestBroker_BearerTokenAtTheUpgrade":                                   TestBroker_BearerTokenAtTheUpgrade,
	"TestBroker_RefusedPublishNamesItsMessageID":                           TestBroker_RefusedPublishNamesItsMessageID,
	"TestBroker_AcksArePerSubscriber":                                      TestBroker_AcksArePerSubscriber,
	"TestBroker_DeadLetters":                                               TestBroker_DeadLetters,
	"TestBroker_ReplayKeepsOriginalIdentity":                               TestBroker_ReplayKeepsOriginalIdentity,
	"TestBroker_SubscribeOptions":                                          TestBroker_SubscribeOptions,
	"TestBroker_ReplayHandOverHasNoGap":                                    TestBroker_ReplayHandOverHasNoGap,
	"TestBroker_IdempotentPublish":                                         TestBroker_IdempotentPublish,
	"TestBroker_SlowConsumers":                                             TestBroker_SlowConsumers,
	"TestBroker_BadFramesGetErrors":                                        TestBroker_BadFramesGetErrors,
	"TestBroker_Wildcards":                                                 TestBroker_Wildcards,
	"TestBroker_AWildcardThatNeverAcksIsToldWhyItIsCutOff":                 TestBroker_AWildcardThatNeverAcksIsToldWhyItIsCutOff,
	"TestBroker_AckForms":                                                  TestBroker_AckForms,
	"TestBroker_Batches":                                                   TestBroker_Batches,
	"TestBroker_FramesEveryLengthRight":                                    TestBroker_FramesEveryLengthRight,
	"TestBroker_OwnPublishComesBeforeItsConfirm":                           TestBroker_OwnPublishComesBeforeItsConfirm,
	"TestBroker_Permissions":                                               TestBroker_Permissions,
	"TestBroker_Limits":                                                    TestBroker_Limits,
	"TestBroker_BurstWithAStuckSubscriber":                                 TestBroker_BurstWithAStuckSubscriber,
	"TestEvents_EachTransitionEmitsExactlyOneEvent":                        TestEvents_EachTransitionEmitsExactlyOneEvent,
	"TestEvents_NeedAGrant":                                                TestEvents_NeedAGrant,
	"TestEvents_SnapshotShowsPendingDeliveries":                            TestEvents_SnapshotShowsPendingDeliveries,
	"TestBroker_Authentication":                                            TestBroker_Authentication,
	"TestBroker_ShutdownClosesClientsWith1001":                             TestBroker_ShutdownClosesClientsWith1001,
	"TestBroker_TokenExpiry":                                               TestBroker_TokenExpiry,
	"TestBroker_LogsHoldNoSecrets":                                         TestBroker_LogsHoldNoSecrets,
	"TestBroker_NoLeaksAfterManyConnections":                               TestBroker_NoLeaksAfterManyConnections,
	"TestBroker_StrangersInEveryOrder":                                     TestBroker_StrangersInEveryOrder,
	"TestBroker_LargeFramesTakeTurnsForTheirPlaces":                        TestBroker_LargeFramesTakeTurnsForTheirPlaces,
	"TestBroker_ARefreshToFewerGrantsEndsWhatTheyNoLongerAllow":            TestBroker_ARefreshToFewerGrantsEndsWhatTheyNoLongerAllow,
	"TestNak_DeadSendsItToDeadLettersWithItsReason":                        TestNak_DeadSendsItToDeadLettersWithItsReason,
	"TestNak_RefusesWhatItCannotDoAndChangesNothing":                       TestNak_RefusesWhatItCannotDoAndChangesNothing,
	"TestExpiry_TravelsWithTheMessageAndRefusesATTLThatPassed":             TestExpiry_TravelsWithTheMessageAndRefusesATTLThatPassed,
	"TestDeadLetters_TwoPlainSubscriptionsGiveUpEachItsOwn":                TestDeadLetters_TwoPlainSubscriptionsGiveUpEachItsOwn,
	"TestDelay_RefusesWhatItCannotDo":                                      TestDelay_RefusesWhatItCannotDo,
	"TestDelay_OnlyTheBrokerPublishesToADelayedLog":                        TestDelay_OnlyTheBrokerPublishesToADelayedLog,
	"TestDelay_SentWhenDueWithItsTimeOnEitherEngine":                       TestDelay_SentWhenDueWithItsTimeOnEitherEngine,
	"TestDelay_ARefusalNamesTheFirstRuleItBreaks":                          TestDelay_ARefusalNamesTheFirstRuleItBreaks,
	"TestOverlap_AnAckMovesADurableCursorBesideAWildcard":                  TestOverlap_AnAckMovesADurableCursorBesideAWildcard,
	"TestNak_ByIDHandsBackEveryDeliveryOfIt":                               TestNak_ByIDHandsBackEveryDeliveryOfIt,
	"TestDeadLetters_EveryTopicHasRoomForItsDeadLetters":                   TestDeadLetters_EveryTopicHasRoomForItsDeadLetters,
	"TestDelay_ARestartSendsNothingAgainPastTheTopicsCap":                  TestDelay_ARestartSendsNothingAgainPastTheTopicsCap,
	"TestDelay_WhatWaitsStaysOnDiskThroughARestart":                        TestDelay_WhatWaitsStaysOnDiskThroughARestart,
	"TestDelay_ABurstIsBoundedAsOnePublishIs":                              TestDelay_ABurstIsBoundedAsOnePublishIs,
	"TestDelay_WhatWaitsIsBoundedForATopicAndAToken":                       TestDelay_WhatWaitsIsBoundedForATopicAndAToken,
	"TestDelay_ADeliverAtKeepsItsMilliseconds":                             TestDelay_ADeliverAtKeepsItsMilliseconds,
	"TestDelay_DueTogetherTheyGoInTheOrderStored":                          TestDelay_DueTogetherTheyGoInTheOrderStored,
	"TestOverlap_AWildcardSaysSubscribedBeforeItsFirstMessage":             TestOverlap_AWildcardSaysSubscribedBeforeItsFirstMessage,
	"TestBroker_ADurableNameStartsWhereItWasSubscribed":                    TestBroker_ADurableNameStartsWhereItWasSubscribed,
	"TestOverlap_ABurstPastTheCapIsSaidToTheTopicAndTheWildcard":           TestOverlap_ABurstPastTheCapIsSaidToTheTopicAndTheWildcard,
	"TestTopics_OneNeverPublishedToIsForgottenWhenItsLastSubscriptionEnds": TestTopics_OneNeverPublishedToIsForgottenWhenItsLastSubscriptionEnds,
	"TestTopics_AForgottenTopicBeginsAgainAndOneWithAMessageGoesOn":        TestTopics_AForgottenTopicBeginsAgainAndOneWithAMessageGoesOn,
	"TestTopics_FirstPublishesRacingForgetsLoseNothing":                    TestTopics_FirstPublishesRacingForgetsLoseNothing,
	"TestTopics_AConnectionHoldsAtMostMaxSubscriptions":                    TestTopics_AConnectionHoldsAtMostMaxSubscriptions,
	"TestTopics_TheBrokerHoldsAtMostMaxTopics":                             TestTopics_TheBrokerHoldsAtMostMaxTopics,
}

// oneEngine names the tests that start a broker on the run's engine but
// do not run again on JetStream, and why.
var oneEngine = map[string]string{
	"TestGroups_ShareMessagesEachAckedOnce":                          groupsRefused,
	"TestGroups_AMemberThatDoesNotAckLosesItsJobsToTheOthers":        groupsRefused,
	"TestGroups_AMemberThatLeavesHandsOnItsJobsAtOnce":               groupsRefused,
	"TestGroups_KeepTheirPlaceWhenEveryMemberHasLeft":                groupsRefused,
	"TestGroups_AJobLeftWhileAMemberJoinsReachesIt":                  groupsRefused,
	"TestGroups_EachGroupAndEachSubscriberGetsEverything":            groupsRefused,
	"TestGroups_RefusedWhereTheyCannotWork":                          groupsRefused,
	"TestGroups_AMemberThatDoesNotAckIsGivenNoMoreThanItsWindow":     groupsRefused,
	"TestNak_InAGroupGoesToAnotherMember":                            groupsRefused,
	"TestOverlap_AGroupBesideAWildcardRedoesNoAckedJobAfterARestart": groupsRefused,
	"TestGroups_QoS0JobsBesideAFullWindowNeverStopTheGroup":          groupsRefused,
	"TestOverlap_ARevokedMemberHandsOnItsJobsBesideAWildcard":        groupsRefused,
	"TestGroups_ABacklogPastTheLogsCapIsSkippedAndSaid":              groupsRefused,
	"TestBroker_LoginBesideGuessersOverSockets": "a login never " +
		"touches the log",
	"TestBroker_FloodsAreBounded": "it bounds the test process's heap, " +
		"and on JetStream the NATS server runs in that process and " +
		"holds the flood itself",
	"TestTopics_AnEmptiedTopicIsForgottenAndItsSeqsGoOnPastTheFloor": noForgets,
	"TestTopics_ATopicWithACursorIsNeverForgotten":                   noForgets,
	"TestTopics_AnEmptiedDelayedLogIsForgotten":                      noForgets,
	"TestTopics_PublishesRacingTheTTLsForgetsGiveNoSeqTwice":         noForgets,
	"TestTopics_APublisherWaitingForItsSeqsHoldsItsTopic": "on a shared " +
		"log no publisher waits for a reservation of seqs",
}

// noForgets is why the tests of forgetting a topic that had a message run
// on bbolt only: a shared log is no Forgetter, and keeps such a topic.
const noForgets = "a shared log keeps a topic that had a message"

// groupsRefused is why the work queue tests run on bbolt only: a shared
// log refuses groups, which TestGroups_OnTheRunsEngine checks there.
const groupsRefused = "groups are refused on a shared log"

// OpenBolt opens a bbolt store: package boltstore's Open, which
// boltstore_hook_test.go sets before any test runs. boltstore imports
// this package, so these tests, inside it, cannot import boltstore; a
// test file outside it can, and hands the function in.
var OpenBolt func(path string, logger *slog.Logger) (Store, error)

// openBolt opens a bbolt store or fails the test.
func openBolt(t testing.TB, path string) Store {
	t.Helper()
	store, err := OpenBolt(path, quietLogger)
	if err != nil {
		t.Fatalf("OpenBolt: %v", err)
	}
	return store
}

// token signs a one-hour token for sub.
func token(t *testing.T, sub string) string {
	t.Helper()
	tok, err := NewToken(testSecret, sub, time.Hour)
	if err != nil {
		t.Fatalf("NewToken: %v", err)
	}
	return tok
}

// got is any frame the broker sends: the protocol's own type, which a
// test holds to the broker's encoders (wire_test.go).
type got = wire.Received

// client is one test client on a real WebSocket.
type client struct {
	t    *testing.T
	name string
	ws   *websocket.Conn
}

// dialRaw opens a WebSocket to url without authenticating.
func dialRaw(t *testing.T, url, name string) *client {
	t.Helper()
	return dialRawWith(t, url, name, nil)
}

// dialRawWith is dialRaw with options for the WebSocket library.
func dialRawWith(t *testing.T, url, name string,
	options *websocket.DialOptions) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, options)
	if err != nil {
		t.Fatalf("%s: dial: %v", name, err)
	}
	ws.SetReadLimit(4 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return &client{t: t, name: name, ws: ws}
}

// dial connects as sub and authenticates with a token for every
// ordinary topic.
func (ts *testServer) dial(sub string) *client {
	ts.t.Helper()
	return ts.dialWith(sub, Claims{})
}

// dialWith connects as sub with the grants in claims.
func (ts *testServer) dialWith(sub string, claims Claims) *client {
	ts.t.Helper()
	return ts.dialOptions(sub, claims, nil)
}

// dialStuck connects as sub with a 16 KiB receive buffer, for a client
// that will stop reading: how much it absorbs is then the test's choice,
// not the machine's.
func (ts *testServer) dialStuck(sub string) *client {
	ts.t.Helper()
	dial := func(ctx context.Context, network, address string) (net.Conn,
		error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, address)
		if tcp, ok := conn.(*net.TCPConn); ok {
			tcp.SetReadBuffer(16 << 10)
		}
		return conn, err
	}
	transport := &http.Transport{DialContext: dial}
	return ts.dialOptions(sub, Claims{}, &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: transport}})
}

// dialOptions connects as sub with claims' grants and the library's
// options.
func (ts *testServer) dialOptions(sub string, claims Claims,
	options *websocket.DialOptions) *client {
	ts.t.Helper()
	claims.Subject = sub
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	tok, err := claims.Sign(testSecret)
	if err != nil {
		ts.t.Fatal(err)
	}
	c := dialRawWith(ts.t, ts.url, sub, options)
	ts.mu.Lock()
	ts.clients = append(ts.clients, c)
	ts.mu.Unlock()
	c.send(map[string]any{"type": "auth", "token": tok})
	c.expect("authenticated")
	return c
}

// send writes v as one JSON text frame.
func (c *client) send(v any) {
	c.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		c.t.Fatalf("%s: marshal: %v", c.name, err)
	}
	record(c.t, true, data)
	c.sendRaw(websocket.MessageText, data)
}

// sendUndescribed sends v, a frame the protocol refuses on purpose, and
// leaves it out of the frames held to docs/asyncapi.json.
func (c *client) sendUndescribed(v any) {
	c.t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		c.t.Fatalf("%s: marshal: %v", c.name, err)
	}
	c.sendRaw(websocket.MessageText, data)
}

// sendRaw writes one frame as it is.
func (c *client) sendRaw(typ websocket.MessageType, data []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.ws.Write(ctx, typ, data); err != nil {
		c.t.Fatalf("%s: write: %v", c.name, err)
	}
}

// next reads the next frame, failing the test after ten seconds.
func (c *client) next() got {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(),
		10*time.Second)
	defer cancel()
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		c.t.Fatalf("%s: read: %v", c.name, err)
	}
	record(c.t, false, data)
	var g got
	if err := json.Unmarshal(data, &g); err != nil {
		c.t.Fatalf("%s: frame %s: %v", c.name, data, err)
	}
	return g
}

// expect reads the next frame and checks its type.
func (c *client) expect(typ string) got {
	c.t.Helper()
	g := c.next()
	if g.Type != typ {
		c.t.Fatalf("%s: got frame %+v, want type %q", c.name, g, typ)
	}
	return g
}

// expectError reads the next frame and checks it is an error with code.
func (c *client) expectError(code string) got {
	c.t.Helper()
	g := c.expect("error")
	if g.Code != code {
		c.t.Fatalf("%s: got error %q (%s), want %q", c.name, g.Code,
			g.Message, code)
	}
	return g
}

// quiet proves nothing else is queued for c: a ping's pong comes next.
func (c *client) quiet() {
	c.t.Helper()
	c.send(map[string]any{"type": "ping"})
	c.expect("pong")
}

// subscribe subscribes with extra fields and returns the reply.
func (c *client) subscribe(topic string, extra map[string]any) got {
	c.t.Helper()
	f := map[string]any{"type": "subscribe", "topic": topic}
	for k, v := range extra {
		f[k] = v
	}
	c.send(f)
	return c.expect("subscribed")
}

// publish publishes payload; for QoS 1 it waits for and returns the
// confirm.
func (c *client) publish(topic string, payload any, qos int,
	id string) got {
	c.t.Helper()
	f := map[string]any{"type": "publish", "topic": topic,
		"payload": payload, "qos": qos}
	if id != "" {
		f["message_id"] = id
	}
	c.send(f)
	if qos == 0 {
		return got{}
	}
	return c.expect("published")
}

// ack acknowledges one message.
func (c *client) ack(g got) {
	c.t.Helper()
	c.send(map[string]any{"type": "ack", "message_id": g.MessageID,
		"topic": g.Topic})
}

// closeStatus reads until the connection ends and returns its close code.
func (c *client) closeStatus() websocket.StatusCode {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(),
		20*time.Second)
	defer cancel()
	for {
		_, _, err := c.ws.Read(ctx)
		if err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

// expectClose checks that the connection closes with code.
func (c *client) expectClose(code websocket.StatusCode) {
	c.t.Helper()
	if status := c.closeStatus(); status != code {
		c.t.Fatalf("%s: closed with %d, want %d", c.name, status, code)
	}
}

// messages reads n deliveries and returns them.
func (c *client) messages(n int) []got {
	c.t.Helper()
	list := make([]got, 0, n)
	for range n {
		list = append(list, c.expect("message"))
	}
	return list
}

// seqs lists the seq of each delivery.
func seqs(list []got) []uint64 {
	out := make([]uint64, len(list))
	for i, g := range list {
		out[i] = g.Seq
	}
	return out
}

// span returns the seqs from first to last inclusive.
func span(first, last uint64) []uint64 {
	var out []uint64
	for s := first; s <= last; s++ {
		out = append(out, s)
	}
	return out
}

// wantSeqs fails unless list holds exactly the seqs want.
func wantSeqs(t *testing.T, list []got, want []uint64) {
	t.Helper()
	if got := seqs(list); !slices.Equal(got, want) {
		t.Fatalf("got seqs %v, want %v", got, want)
	}
}

// connected counts the broker's connections authenticated as sub.
func (ts *testServer) connected(sub string) int {
	n := 0
	for _, c := range ts.broker.connectionList() {
		c.mu.Lock()
		if c.subject == sub {
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// watchOutboxes samples every connection's outbox until the test ends,
// and returns a function that reports the largest it saw.
func watchOutboxes(t *testing.T, b *Broker) func() int {
	var peak atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for _, c := range b.connectionList() {
				n := int64(c.outbox.Bytes())
				if n > peak.Load() {
					peak.Store(n)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return func() int { return int(peak.Load()) }
}

// pendingCount is how many unacked deliveries the broker holds in all.
func pendingCount(b *Broker) int {
	n := 0
	for _, c := range b.connectionList() {
		c.mu.Lock()
		n += c.inflight
		c.mu.Unlock()
	}
	return n
}

// memoryStore is a Store kept in memory (package memlog, which the lab's
// disk keeps its contents in too): it proves the broker needs no more of
// a store than the interface says.
type memoryStore = memlog.Store[*Message]

// newMemoryStore returns an empty memoryStore.
func newMemoryStore() *memoryStore { return memlog.New(placeOf) }

// placeOf tells memlog where m goes, and, for a message that waits in
// a $delayed log, when it is due and who sent it with which id, as
// boltstore's index of them says (memlog then is a DueIndex as it is).
func placeOf(m *Message) memlog.Record {
	log, seq := m.Releases()
	r := memlog.Record{Topic: m.Topic, Seq: m.Seq, Size: len(m.Payload),
		Releases: log, Released: seq}
	if strings.HasPrefix(m.Topic, DelayedPrefix) {
		r.DeliverAt, r.Publisher, r.ID = m.DeliverAt, m.publisher, m.ID
	}
	return r
}

// jwtTime converts a time for a token's claims.
func jwtTime(at time.Time) *jwt.NumericDate {
	return jwt.NewNumericDate(at)
}

// countGoroutines counts the goroutines of this process but the NATS
// server's.
func countGoroutines() int {
	// On JetStream the NATS server runs in this process, shared by every
	// test, and starts and ends goroutines of its own on its own time:
	// they are not the broker's to leak, and are not counted.
	stacks := make([]byte, 1<<20)
	for {
		n := runtime.Stack(stacks, true)
		if n < len(stacks) {
			stacks = stacks[:n]
			break
		}
		stacks = make([]byte, 2*len(stacks))
	}
	count := 0
	for _, stack := range bytes.Split(stacks, []byte("\n\n")) {
		if !bytes.Contains(stack, []byte("github.com/nats-io/nats-server")) {
			count++
		}
	}
	return count
}

// waitFor polls cond for up to ten seconds: for states that settle after
// sockets close, where there is no event to wait on.
func waitFor(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for "+format, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
