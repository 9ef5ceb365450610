package popsub

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub/internal/logbuf"
	"github.com/popsub/popsub/login"
	"github.com/popsub/popsub/socket"
	"github.com/popsub/popsub/wire"
)

// These tests cover what a broker on an open socket must do when clients
// are hostile, broken, slow or gone.

func TestBroker_Permissions(t *testing.T) {
	ts := startBroker(t, Options{})
	sensor := ts.dialWith("sensor", Claims{Publish: []string{"sensors/#"},
		Subscribe: []string{"sensors/+/config"}})
	operator := ts.dialWith("operator", Claims{
		Subscribe: []string{"#", "$dead/#"}})
	anyone := ts.dial("anyone")

	cases := []struct {
		name  string
		who   *client
		frame map[string]any
		code  string // "" means allowed
	}{
		{"a publish inside the grant is allowed", sensor,
			map[string]any{"type": "publish", "topic": "sensors/a/temp",
				"payload": 1, "qos": 1}, ""},
		{"a publish outside the grant is forbidden", sensor,
			map[string]any{"type": "publish", "topic": "chat",
				"payload": 1}, "forbidden"},
		{"a subscribe inside the grant is allowed", sensor,
			map[string]any{"type": "subscribe",
				"topic": "sensors/a/config"}, ""},
		{"a filter wider than the grant is forbidden", sensor,
			map[string]any{"type": "subscribe", "topic": "sensors/#"},
			"forbidden"},
		{"# does not grant $dead topics", anyone,
			map[string]any{"type": "subscribe", "topic": "$dead/jobs"},
			"forbidden"},
		{"an explicit grant allows $dead topics", operator,
			map[string]any{"type": "subscribe", "topic": "$dead/jobs"}, ""},
		{"no token may publish to $sys without a grant", operator,
			map[string]any{"type": "publish", "topic": "$sys/events",
				"payload": 1}, "forbidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.who.t = t
			tc.who.send(tc.frame)
			if tc.code != "" {
				tc.who.expectError(tc.code)
			} else if g := tc.who.next(); g.Type == "error" {
				t.Fatalf("got error %+v, want it allowed", g)
			}
			tc.who.quiet()
		})
	}
}

func TestCovers_Grants(t *testing.T) {
	cases := []struct {
		grant, filter string
		want          bool
	}{
		{"sensors/#", "sensors/+/temp", true},
		{"sensors/#", "sensors/#", true},
		{"sensors/+", "sensors/#", false},
		{"sensors/+/temp", "sensors/+/temp", true},
		{"sensors/a/temp", "sensors/+/temp", false},
		{"#", "$sys/events", false},
		{"$sys/#", "$sys/events", true},
		{"+/#", "a/b", true},
	}
	for _, tc := range cases {
		if got := wire.Covers(tc.grant, tc.filter); got != tc.want {
			t.Errorf("wire.Covers(%q, %q) = %v, want %v", tc.grant, tc.filter,
				got, tc.want)
		}
	}
}

func TestBroker_TokenExpiry(t *testing.T) {
	t.Run("an expired session is closed with 4003", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ps := startPipeBroker(t, Options{})
			defer ps.stop()
			c := ps.dial("alice")
			c.authenticate(tokenUntil(t, "alice",
				time.Now().Add(2*time.Second)))
			c.expectError("token_expired")
			c.expectClose(CloseTokenExpired)
		})
	})
	t.Run("a reconnect with the expired token is refused, never served",
		func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ps := startPipeBroker(t, Options{
					FeatureOptions: FeatureOptions{PingInterval: time.Hour}})
				defer ps.stop()
				token := tokenUntil(t, "alice", time.Now().Add(time.Minute))
				c := ps.dial("alice")
				c.authenticate(token)
				c.subscribe("news", map[string]any{"durable": "d"})
				time.Sleep(time.Minute) // then the leeway, in the read
				c.expectError("token_expired")
				c.expectClose(CloseTokenExpired)

				// In the auth frame, and as a Bearer token on the upgrade:
				// an error and 4001, and nothing of the durable name.
				ps.dialAs("bob").publish("news", "for alice", 1, "n1")
				again := ps.dial("alice")
				again.send(map[string]any{"type": "auth", "token": token})
				again.expectError("auth_failed")
				again.expectClose(CloseAuthFailed)
				bearer, _, err := websocket.Dial(context.Background(),
					"ws://pipe/ws", &websocket.DialOptions{
						HTTPClient: ps.client, HTTPHeader: http.Header{
							"Authorization": {"Bearer " + token}}})
				if err != nil {
					t.Fatal(err)
				}
				defer bearer.CloseNow()
				if _, data, err := bearer.Read(context.Background()); err != nil ||
					!strings.Contains(string(data), "auth_failed") {
					t.Fatalf("with a Bearer token: %s, %v", data, err)
				}
				if _, _, err := bearer.Read(context.Background()); websocket.
					CloseStatus(err) != CloseAuthFailed {
					t.Fatalf("with a Bearer token: %v, want a close with 4001",
						err)
				}
			})
		})
	t.Run("a fresh auth extends the session", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ps := startPipeBroker(t, Options{
				FeatureOptions: FeatureOptions{PingInterval: 2 * time.Hour}})
			defer ps.stop()
			c := ps.dial("alice")
			c.authenticate(tokenUntil(t, "alice",
				time.Now().Add(time.Minute)))
			c.authenticate(tokenUntil(t, "alice", time.Now().Add(time.Hour)))
			time.Sleep(30 * time.Minute)
			c.quiet()
		})
	})
	t.Run("an exp centuries away is a session that lasts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ps := startPipeBroker(t, Options{
				FeatureOptions: FeatureOptions{PingInterval: 2 * time.Hour}})
			defer ps.stop()
			c := ps.dial("alice")
			far := time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
			c.authenticate(tokenUntil(t, "alice", far))
			time.Sleep(time.Hour)
			c.quiet()
		})
	})
	t.Run("an exp written as a string is refused", func(t *testing.T) {
		ts := startBroker(t, Options{})
		exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
		token, err := jwt.NewWithClaims(jwt.SigningMethodHS256,
			jwt.MapClaims{"sub": "alice", "exp": exp}).SignedString(testSecret)
		if err != nil {
			t.Fatal(err)
		}
		c := dialRaw(t, ts.url, "alice")
		c.send(map[string]any{"type": "auth", "token": token})
		c.expectError("auth_failed")
		c.expectClose(CloseAuthFailed)
	})
	t.Run("a fresh auth for another subject is refused, and the session "+
		"keeps its token", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ps := startPipeBroker(t, Options{
				FeatureOptions: FeatureOptions{PingInterval: 2 * time.Hour}})
			defer ps.stop()
			c := ps.dial("alice")
			c.authenticate(tokenUntil(t, "alice", time.Now().Add(time.Hour)))
			c.send(map[string]any{"type": "auth",
				"token": tokenUntil(t, "mallory", time.Now().Add(2*time.Hour))})
			if g := c.expectError("auth_failed"); !strings.Contains(
				g.Message, "another subject's") {
				t.Fatalf("refusal says %q", g.Message)
			}
			c.send(map[string]any{"type": "auth", "token": "not-a-token"})
			c.expectError("auth_failed")
			c.quiet()

			// Alice's own hour still runs, and ends as it would have.
			time.Sleep(59 * time.Minute)
			c.quiet()
			time.Sleep(time.Minute) // an hour since: the leeway is left
			c.quiet()
			c.expectError("token_expired")
			c.expectClose(CloseTokenExpired)
		})
	})
	t.Run("a fresh token's grants take effect at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ps := startPipeBroker(t, Options{
				FeatureOptions: FeatureOptions{PingInterval: 2 * time.Hour}})
			defer ps.stop()
			c := ps.dial("alice")
			narrow := Claims{Publish: []string{"alice/#"}}
			narrow.Subject, narrow.ExpiresAt = "alice",
				jwtTime(time.Now().Add(time.Hour))
			tok, err := narrow.Sign(testSecret)
			if err != nil {
				t.Fatal(err)
			}
			c.authenticate(tok)
			c.send(map[string]any{"type": "publish", "topic": "news",
				"payload": 1})
			c.expectError("forbidden")
			c.authenticate(tokenUntil(t, "alice", time.Now().Add(time.Hour)))
			c.publish("news", 1, 1, "")
		})
	})
}

func TestBroker_KeepaliveClosesSilentPeers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps := startPipeBroker(t, Options{
			AckTimeout:     time.Hour,
			FeatureOptions: FeatureOptions{PingInterval: 10 * time.Second},
		})
		defer ps.stop()
		publisher := ps.dial("publisher")
		publisher.authenticate(tokenUntil(t, "p", time.Now().Add(time.Hour)))
		tok := tokenUntil(t, "worker", time.Now().Add(time.Hour))
		worker := ps.dial("worker")
		worker.authenticate(tok)
		worker.subscribe("jobs", map[string]any{"durable": "w"})
		publisher.publish("jobs", 1, 1, "job-1")
		worker.expect("message")

		// Nobody reads now, so nobody answers a ping: within two
		// intervals the broker closes both, and the durable name is free.
		time.Sleep(25 * time.Second)
		synctest.Wait()
		if n := len(ps.broker.connectionList()); n != 0 {
			t.Fatalf("open connections = %d, want 0", n)
		}
		again := ps.dial("worker")
		again.authenticate(tok)
		again.subscribe("jobs", map[string]any{"durable": "w"})
		if g := again.expect("message"); g.MessageID != "job-1" {
			t.Fatalf("resumed with %+v, want job-1 again", g)
		}
	})
}

// loginUsers has one user, alice, whose password is "correct horse";
// the hash uses few iterations to keep tests fast.
func loginUsers(t *testing.T) map[string]User {
	hash, err := login.HashAt("correct horse", 1000)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]User{"alice": {PasswordHash: hash,
		Publish: []string{"alice/#"}}}
}

func TestBroker_Login(t *testing.T) {
	// In fake time: the throttle's holds pass at once, and a hash takes
	// no time off the auth timeout, however slow the machine.
	synctest.Test(t, func(t *testing.T) {
		ps := startPipeBroker(t, Options{
			FeatureOptions: FeatureOptions{Users: loginUsers(t)}})
		defer ps.stop()
		c := ps.dial("alice")

		// A wrong password gets invalid credentials; the connection stays.
		c.send(map[string]any{"type": "login", "username": "alice",
			"password": "wrong"})
		if g := c.expectError("invalid_credentials"); g.Message !=
			"invalid credentials" {
			t.Fatalf("message = %q", g.Message)
		}

		// An unknown user gets the same answer.
		c.send(map[string]any{"type": "login", "username": "bob",
			"password": "x"})
		c.expectError("invalid_credentials")

		// The right password gets a token with the user's grants.
		c.send(map[string]any{"type": "login", "username": "alice",
			"password": "correct horse"})
		var reply struct{ Type, Token string }
		_, data, err := c.ws.Read(context.Background())
		record(t, false, data)
		if err != nil || json.Unmarshal(data, &reply) != nil ||
			reply.Type != "login_response" {
			t.Fatalf("got %s, %v; want login_response", data, err)
		}
		c.authenticate(reply.Token)
		c.publish("alice/notes", "hi", 1, "")
		c.send(map[string]any{"type": "publish", "topic": "bob/notes",
			"payload": 1})
		c.expectError("forbidden")
	})
}

// attacker is the address the login floods below come from.
const attacker = "203.0.113.9"

// floodLogins opens sockets connections from attacker, each sending five
// wrong guesses at alice's password as fast as the broker reads them,
// and reading whatever comes back, until the broker closes it.
func floodLogins(ps *pipeServer, sockets int) {
	guess := []byte(`{"type":"login","username":"alice","password":"guess"}`)
	for i := range sockets {
		guesser := ps.dialFrom(fmt.Sprint("stranger-", i), attacker)
		go func() {
			for range 5 {
				err := guesser.ws.Write(context.Background(),
					websocket.MessageText, guess)
				if err != nil {
					return
				}
			}
		}()
		go func() {
			for {
				if _, _, err := guesser.ws.Read(context.Background()); err != nil {
					return
				}
			}
		}()
	}
}

// failuresOf is how many wrong guesses the broker has hashed and counted
// against key.
func failuresOf(b *Broker, key string) int {
	return b.logins.Count(key)
}

func TestBroker_LoginUnderAttack(t *testing.T) {
	login := map[string]any{"type": "login", "username": "alice",
		"password": "correct horse"}
	t.Run("the user logs in at once from another address",
		func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ps := startPipeBroker(t, Options{
					AuthTimeout:    2 * time.Second,
					FeatureOptions: FeatureOptions{Users: loginUsers(t)},
				})
				defer ps.stop()
				floodLogins(ps, 8)
				synctest.Wait()
				alice := ps.dialFrom("alice", "198.51.100.7")
				start := time.Now()
				alice.send(login)
				alice.expect("login_response")
				if waited := time.Since(start); waited != 0 {
					t.Fatalf("alice waited %v, want no wait", waited)
				}
			})
		})
	t.Run("further guesses whose answers would come too late cost no hash",
		func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ps := startPipeBroker(t, Options{
					AuthTimeout:    2 * time.Second,
					FeatureOptions: FeatureOptions{Users: loginUsers(t)},
				})
				defer ps.stop()
				floodLogins(ps, 64)
				time.Sleep(3 * time.Second)
				synctest.Wait()

				// Each socket's first guess is hashed: it might be the
				// user. Of the further ones, holds of 0, 250, 500 and
				// 1,000 ms fit in the two seconds; hashing every guess
				// would count 320.
				if n := failuresOf(ps.broker, "addr:"+attacker); n > 64+5 {
					t.Fatalf("%d guesses hashed, want at most 69", n)
				}
			})
		})
	t.Run("from the attacker's address the user logs in at once",
		func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ps := startPipeBroker(t, Options{
					FeatureOptions: FeatureOptions{Users: loginUsers(t)}})
				defer ps.stop()
				floodLogins(ps, 8)
				synctest.Wait()
				during := ps.dialFrom("alice", attacker)
				start := time.Now()
				during.send(login)
				during.expect("login_response")
				if waited := time.Since(start); waited != 0 {
					t.Fatalf("alice waited %v, want no wait", waited)
				}
			})
		})
}

func TestLoginThrottle_SlowsGuessesNeverTheUser(t *testing.T) {
	// answered counts the wrong answers guessers get in a minute of
	// fake time, each guessing on a connection of its own.
	answered := func(t *testing.T, guessers int) (int, time.Duration) {
		var n atomic.Int64
		var slowest time.Duration
		synctest.Test(t, func(t *testing.T) {
			users := loginUsers(t)
			opts, _ := Options{
				Secret: testSecret, FeatureOptions: FeatureOptions{Users: users}}.ready()
			b := &Broker{opts: opts, logger: quietLogger}
			b.startLogins()
			b.logins = login.NewGate(1, nil, users) // one hash at a time
			var wg sync.WaitGroup
			for range guessers {
				c := &connection{broker: b, remote: "203.0.113.9:4000",
					done: make(chan struct{})}
				wg.Go(func() {
					for start := time.Now(); time.Since(start) < time.Minute; {
						c.login(frame{Username: "alice", Password: "guess"}, nil)
						n.Add(1)
					}
				})
			}
			// The real user, from the same address, mid-attack.
			time.Sleep(30 * time.Second)
			c := &connection{broker: b, remote: "203.0.113.9:5000",
				done: make(chan struct{})}
			start := time.Now()
			r := c.login(frame{Username: "alice", Password: "correct horse"},
				nil)
			slowest = time.Since(start)
			if r.Type != "login_response" {
				t.Errorf("the real user got %+v, want a token", r)
			}
			wg.Wait()
		})
		return int(n.Load()), slowest
	}

	t.Run("one guesser is slowed to one answer per four seconds",
		func(t *testing.T) {
			n, _ := answered(t, 1)
			if n > 25 {
				t.Fatalf("%d answers in a minute, want at most 25", n)
			}
		})
	t.Run("sixteen sockets get no more answers than one",
		func(t *testing.T) {
			one, _ := answered(t, 1)
			many, wait := answered(t, 16)
			t.Logf("one guesser: %d answers; sixteen: %d", one, many)
			if many > one+16 {
				t.Fatalf("16 guessers got %d answers, one got %d", many, one)
			}
			if wait != 0 {
				t.Fatalf("the real user waited %v under attack, want 0", wait)
			}
		})
}

func TestBroker_Limits(t *testing.T) {
	t.Run("connections over the cap get HTTP 503 before the upgrade",
		func(t *testing.T) {
			ts := startBroker(t, Options{
				FeatureOptions: FeatureOptions{MaxConnections: 2}})
			ts.dial("one")
			ts.dial("two")
			ctx, cancel := context.WithTimeout(context.Background(),
				5*time.Second)
			defer cancel()
			_, resp, err := websocket.Dial(ctx, ts.url, nil)
			if err == nil || resp == nil ||
				resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("third dial: %v, %v; want HTTP 503", resp, err)
			}
		})
	t.Run("publishing faster than the rate gets rate_limited",
		func(t *testing.T) {
			// One publish every two seconds, a burst of one: the second
			// is refused unless two seconds pass between them.
			ts := startBroker(t, Options{
				FeatureOptions: FeatureOptions{PublishRate: 0.5}})
			c := ts.dial("chatty")
			c.publish("chat", 1, 1, "")
			c.send(map[string]any{"type": "publish", "topic": "chat",
				"payload": 1})
			c.expectError("rate_limited")
			c.quiet()
		})
	t.Run("a large frame before auth closes with 1009", func(t *testing.T) {
		ts := startBroker(t, Options{})
		c := dialRaw(t, ts.url, "stranger")
		c.send(map[string]any{"type": "auth",
			"token": strings.Repeat("x", 9000)})
		c.expectClose(websocket.StatusMessageTooBig)
	})
	t.Run("a foreign browser origin is refused", func(t *testing.T) {
		ts := startBroker(t, Options{})
		ctx, cancel := context.WithTimeout(context.Background(),
			5*time.Second)
		defer cancel()
		header := http.Header{"Origin": {"https://evil.example"}}
		_, resp, err := websocket.Dial(ctx, ts.url,
			&websocket.DialOptions{HTTPHeader: header})
		if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("foreign origin: %v, %v; want HTTP 403", resp, err)
		}
	})
	t.Run("an allowed foreign origin is accepted", func(t *testing.T) {
		ts := startBroker(t, Options{
			FeatureOptions: FeatureOptions{OriginPatterns: []string{"app.example"}}})
		ctx, cancel := context.WithTimeout(context.Background(),
			5*time.Second)
		defer cancel()
		header := http.Header{"Origin": {"https://app.example"}}
		ws, _, err := websocket.Dial(ctx, ts.url,
			&websocket.DialOptions{HTTPHeader: header})
		if err != nil {
			t.Fatalf("allowed origin refused: %v", err)
		}
		ws.CloseNow()
	})
}

func TestBroker_LogsHoldNoSecrets(t *testing.T) {
	var logs logbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs,
		&slog.HandlerOptions{Level: slog.LevelDebug}))
	ts := startBroker(t, Options{
		Logger: logger, FeatureOptions: FeatureOptions{Users: loginUsers(t)}})

	good := token(t, "alice")
	bad := good[:len(good)-4] + "AAAA"
	c := ts.dial("alice")
	c.send(map[string]any{"type": "login", "username": "alice",
		"password": "correct horse"})
	c.expect("login_response")
	c.send(map[string]any{"type": "login", "username": "alice",
		"password": "hunter2-not-it"})
	c.expectError("invalid_credentials")
	refused := dialRaw(t, ts.url, "mallory")
	refused.send(map[string]any{"type": "auth", "token": bad})
	refused.expectClose(CloseAuthFailed)
	ts.stop()

	for _, secret := range []string{good, bad, string(testSecret),
		"correct horse", "hunter2-not-it", good[strings.LastIndex(good,
			".")+1:]} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("logs contain a secret %q:\n%s", secret, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "auth failed") {
		t.Fatalf("logs lack the auth failure:\n%s", logs.String())
	}
}

func TestBroker_NoLeaksAfterManyConnections(t *testing.T) {
	before := countOpenFiles(t)
	goroutines := countGoroutines()
	ts := startBroker(t, Options{})
	for i := range 1000 {
		c := ts.dial("visitor")
		c.subscribe("lobby", nil)
		if i%2 == 0 {
			c.ws.Close(websocket.StatusNormalClosure, "")
		} else {
			c.ws.CloseNow()
		}
	}
	ts.stop()
	waitFor(t, func() bool { return countGoroutines() <= goroutines+2 },
		"goroutines to return to %d, have %d", goroutines,
		countGoroutines())
	waitFor(t, func() bool { return countOpenFiles(t) <= before+2 },
		"open files to return to %d, have %d", before, countOpenFiles(t))
}

// countOpenFiles counts this process's open file descriptors.
// countOpenFiles counts this process's open files, leaving out a
// JetStream server's message blocks: on the JetStream engine the test's
// nats-server runs in this process, and it keeps a new stream's blocks
// open after the broker that made the stream has gone.
func countOpenFiles(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd on this system")
	}
	n := 0
	for _, e := range entries {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		if !strings.Contains(target, "/jetstream/") {
			n++
		}
	}
	return n
}

func TestBroker_LeavingStopsTheExpiryTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps := startPipeBroker(t, Options{})
		defer ps.stop()
		c := ps.dial("alice")
		c.authenticate(tokenUntil(t, "alice", time.Now().Add(24*time.Hour)))
		c.quiet()
		connections := ps.broker.connectionList()
		if len(connections) != 1 {
			t.Fatalf("%d connections, want 1", len(connections))
		}

		// A timer left running would hold the connection, and its
		// outbox, in memory for the token's remaining day.
		c.ws.CloseNow()
		synctest.Wait()
		if connections[0].expiry.Stop() {
			t.Fatal("the expiry timer was still running after the client left")
		}
	})
}

// panickyStore panics when a cursor is read, which the broker does on the
// reader's goroutine for a durable subscribe: a stand-in for any bug met
// while handling one client's frame.
type panickyStore struct{ *memoryStore }

// Cursor panics.
func (panickyStore) Cursor(key string) (uint64, bool, error) {
	panic("a bug in the store")
}

func TestBroker_PanicCostsOnlyThatConnection(t *testing.T) {
	var logs logbuf.Buffer
	ts := startBroker(t, Options{Store: panickyStore{newMemoryStore()},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	bystander := ts.dial("bystander")
	bystander.subscribe("news", nil)

	// The connection whose frame met the bug ends; the broker, and
	// every other client's session, goes on.
	unlucky := ts.dial("unlucky")
	unlucky.send(map[string]any{"type": "subscribe", "topic": "jobs",
		"durable": "worker"})
	if status := unlucky.closeStatus(); status != -1 {
		t.Fatalf("unlucky closed with %d, want an abrupt close", status)
	}
	ts.dial("publisher").publish("news", "still here", 1, "")
	if g := bystander.expect("message"); string(g.Payload) != `"still here"` {
		t.Fatalf("bystander got %s", g.Payload)
	}
	waitFor(t, func() bool { return ts.broker.open.Load() == 2 },
		"the unlucky connection to leave the count")
	if !strings.Contains(logs.String(), "panic serving a connection") {
		t.Fatalf("the panic was not logged:\n%s", logs.String())
	}
}

// TestBroker_BearerTokenAtTheUpgrade checks that a client that can set
// headers may authenticate with its upgrade request, and that a bad
// token there is refused as a bad auth frame would be.
func TestBroker_BearerTokenAtTheUpgrade(t *testing.T) {
	ts := startBroker(t, Options{})
	header := func(token string) *websocket.DialOptions {
		return &websocket.DialOptions{HTTPHeader: http.Header{
			"Authorization": {"Bearer " + token}}}
	}
	alice := dialRawWith(t, ts.url, "alice", header(token(t, "alice")))
	if g := alice.expect("authenticated"); g.Sub != "alice" {
		t.Fatalf("authenticated as %q", g.Sub)
	}
	alice.subscribe("news", nil)
	alice.publish("news", 1, 0, "n-1")
	alice.expect("message")
	// The session lifts the 8 KiB limit a stranger's frames have, as an
	// auth frame's does.
	large := strings.Repeat("x", 16<<10)
	alice.publish("news", large, 0, "n-2")
	if g := alice.expect("message"); g.MessageID != "n-2" {
		t.Fatalf("got %+v, want the 16 KiB message n-2", g)
	}

	mallory := dialRawWith(t, ts.url, "mallory", header("not-a-token"))
	mallory.expectError("auth_failed")
	mallory.expectClose(CloseAuthFailed)
}

// TestBroker_RefusedPublishNamesItsMessageID checks that every refusal of
// a publish names the publisher's message_id, so a client with several
// publishes in flight knows which one was refused.
func TestBroker_RefusedPublishNamesItsMessageID(t *testing.T) {
	ts := startBroker(t, Options{
		FeatureOptions: FeatureOptions{PublishRate: 1}})
	c := ts.dialWith("sensor", Claims{Publish: []string{"sensors/#"}})
	c.send(map[string]any{"type": "publish", "topic": "chat", "payload": 1,
		"qos": 1, "message_id": "m-1"})
	if g := c.expectError("forbidden"); g.MessageID != "m-1" {
		t.Errorf("forbidden names %q, want m-1", g.MessageID)
	}
	c.send(map[string]any{"type": "publish", "topic": "sensors/a",
		"payload": 1, "qos": 1, "message_id": "m-2"})
	c.expect("published")
	c.send(map[string]any{"type": "publish", "topic": "sensors/a",
		"payload": 1, "qos": 1, "message_id": "m-3"})
	if g := c.expectError("rate_limited"); g.MessageID != "m-3" {
		t.Errorf("rate_limited names %q, want m-3", g.MessageID)
	}
	c.send(map[string]any{"type": "publish", "topic": "sensors/+",
		"payload": 1, "message_id": "m-4"})
	if g := c.expectError("invalid_topic"); g.MessageID != "m-4" {
		t.Errorf("invalid_topic names %q, want m-4", g.MessageID)
	}
}

// TestBroker_StrangersInEveryOrder sends seeded random frames from eight
// connections at once, in orders no well-behaved client uses: frames
// before auth, auth again, malformed JSON, fields of the wrong type,
// subscribes, acks and unsubscribes for things never delivered, joined
// frames, binary frames and abrupt closes (the gateway's test does the
// same to HTTP publishes and streams). Meanwhile a witness publishes at
// QoS 1 on a topic of its own. The broker must never panic (it logs
// "panic serving a connection" and drops only that connection, which
// would hide the bug), must still serve a new client, and the witness
// must read every confirmed message once, in seq order, with no gap.
func TestBroker_StrangersInEveryOrder(t *testing.T) {
	var logs logbuf.Buffer
	ts := startBroker(t, Options{AckTimeout: time.Minute,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	witness := ts.dial("witness")
	witness.subscribe("witness", map[string]any{"last": 0})
	publisher := ts.dial("witness-publisher")

	tok := token(t, "stranger")
	var strangers sync.WaitGroup
	for i := range 8 {
		strangers.Go(func() {
			r := rand.New(rand.NewPCG(uint64(i), 23))
			for range 12 {
				strangerSession(ts, r, tok)
			}
		})
	}
	const confirmed = 200
	var first uint64
	for i := range confirmed {
		g := publisher.publish("witness", i, 1, "")
		if i == 0 {
			first = g.Seq
		}
	}
	strangers.Wait()

	for i, g := range witness.messages(confirmed) {
		if g.Seq != first+uint64(i) || string(g.Payload) != strconv.Itoa(i) ||
			g.Attempt != 1 {
			t.Fatalf("witness delivery %d is seq %d, payload %s, attempt %d",
				i, g.Seq, g.Payload, g.Attempt)
		}
	}
	witness.quiet()
	ts.dial("newcomer").quiet()
	if strings.Contains(logs.String(), "panic") {
		t.Fatalf("a stranger made the broker panic:\n%s", logs.String())
	}
}

// strangerSession is one connection of random frames, some carrying
// tok: it may never authenticate, may never read, and may leave without
// a close.
func strangerSession(ts *testServer, r *rand.Rand, tok string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, ts.url, nil)
	if err != nil {
		ts.t.Errorf("stranger: dial: %v", err)
		return
	}
	defer ws.CloseNow()
	if r.IntN(5) > 0 {
		go func() {
			for {
				if _, _, err := ws.Read(ctx); err != nil {
					return
				}
			}
		}()
	}
	if r.IntN(4) > 0 {
		ws.Write(ctx, websocket.MessageText,
			[]byte(`{"type":"auth","token":"`+tok+`"}`))
	}
	for range r.IntN(60) {
		typ := websocket.MessageText
		if r.IntN(50) == 0 {
			typ = websocket.MessageBinary
		}
		if ws.Write(ctx, typ, []byte(strangerFrame(r, tok))) != nil {
			return // the broker closed it, as it may
		}
	}
	if r.IntN(2) == 0 {
		ws.Close(websocket.StatusNormalClosure, "")
	}
}

// strangerFrame is one random frame, or several joined by newlines.
func strangerFrame(r *rand.Rand, tok string) string {
	pick := func(choices ...string) string { return choices[r.IntN(len(choices))] }
	topic := pick("a", "a/b", "a/+", "#", "+/b", "$sys/events", "$dead/a",
		"", "a//b", "a/#/b", " a", strings.Repeat("t", 300))
	id := pick(`"m-1"`, `"m-2"`, `""`, `5`, `null`)
	switch r.IntN(9) {
	case 0:
		return pick(`{"type":"auth","token":"`+tok+`"}`,
			`{"type":"auth","token":"bad"}`, `{"type":"login"}`,
			`{"type":"auth","token":"`+tok+`","batch":true}`)
	case 1, 2:
		return `{"type":"subscribe","topic":"` + topic + `"` + pick("",
			`,"last":0`, `,"after":3`, `,"after":-1`, `,"last":"x"`,
			`,"durable":"d"`, `,"group":"g"`, `,"group":"g","durable":"d"`,
			`,"after":1,"last":1`) + `}`
	case 3:
		return `{"type":"unsubscribe","topic":"` + topic + `"}`
	case 4, 5:
		return `{"type":"publish","topic":"` + topic + `","payload":` +
			pick(`1`, `{"k":[1]}`, `null`, `"`+strings.Repeat("z", 3000)+`"`,
				`[`) + `,"qos":` + pick("0", "1", "2", `"1"`, "1.5") +
			`,"message_id":` + id + `}`
	case 6:
		return pick(`{"type":"ack","message_id":`+id+`}`,
			`{"type":"ack","topic":"`+topic+`","seq":`+strconv.Itoa(r.IntN(9)-2)+`}`,
			`{"type":"ack","message_ids":["m-1",`+id+`],"topic":"a"}`)
	case 7:
		return pick(`{"type":"ping"}`, `{`, `[]`, `null`, ``, `{"type":1}`,
			`{"type":"nope"}`, `{"type":"ping"} x`, `{"type":"ping"}{}`)
	default:
		frames := make([]string, 1+r.IntN(8))
		for i := range frames {
			frames[i] = strangerFrame(r, tok)
		}
		return strings.Join(frames, "\n")
	}
}

func TestBroker_LargeFramesTakeTurnsForTheirPlaces(t *testing.T) {
	// With frames of up to largeFramesBytes, the broker has one place
	// for a large frame: while one publisher is halfway through sending
	// one, another's large frame waits, and its small frames do not.
	ts := startBroker(t, Options{MaxFrameBytes: largeFramesBytes})
	b := ts.broker
	if cap(b.largeFrames) != 1 {
		t.Fatalf("%d places, want 1", cap(b.largeFrames))
	}
	payload := `"` + strings.Repeat("x", 2*socket.LargeFrame) + `"`
	frame := []byte(`{"type":"publish","topic":"big","qos":1,` +
		`"message_id":"half","payload":` + payload + `}`)
	alice := ts.dial("alice")
	writer, err := alice.ws.Writer(context.Background(),
		websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	// The library sends what it has buffered only as its buffer fills:
	// all but the last 100 bytes is well past socket.LargeFrame on the wire.
	writer.Write(frame[:len(frame)-100])
	waitFor(t, func() bool { return len(b.largeFrames) == 1 },
		"alice's half frame to take the place")

	bob := ts.dial("bob")
	bob.publish("small", "fits", 1, "") // a small frame is not held up
	bob.send(map[string]any{"type": "publish", "topic": "big", "qos": 1,
		"message_id": "whole", "payload": json.RawMessage(payload)})
	done := make(chan got, 1)
	go func() { done <- bob.next() }()
	select {
	case g := <-done:
		t.Fatalf("bob's large frame was handled while alice held the "+
			"place: %+v", g)
	case <-time.After(200 * time.Millisecond):
	}
	writer.Write(frame[len(frame)-100:])
	writer.Close()
	if g := alice.expect("published"); g.MessageID != "half" {
		t.Fatalf("alice got %+v", g)
	}
	if g := <-done; g.Type != "published" || g.MessageID != "whole" {
		t.Fatalf("bob got %+v, want the confirm of his large frame", g)
	}
	waitFor(t, func() bool { return len(b.largeFrames) == 0 },
		"the place to be given back")
}

func TestBroker_LoginBesideGuessersOverSockets(t *testing.T) {
	// The synctest tests above, over real sockets from one address
	// (127.0.0.1): eight sockets keep guessing alice's password, and
	// dial again when closed; alice, on a fresh connection, gets her
	// token, not a 4001 for answers held for her address.
	ts := startBroker(t, Options{
		AuthTimeout:    2 * time.Second,
		FeatureOptions: FeatureOptions{Users: loginUsers(t)},
	})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	guess := []byte(`{"type":"login","username":"alice","password":"guess"}`)
	var guessers sync.WaitGroup
	for range 8 {
		guessers.Go(func() {
			for ctx.Err() == nil {
				ws, _, err := websocket.Dial(ctx, ts.url, nil)
				if err != nil {
					continue
				}
				for ws.Write(ctx, websocket.MessageText, guess) == nil {
					if _, _, err := ws.Read(ctx); err != nil {
						break
					}
				}
				ws.CloseNow()
			}
		})
	}
	defer guessers.Wait()
	defer stop()
	waitFor(t, func() bool {
		return failuresOf(ts.broker, "user:alice") >= 8
	}, "the guessers' answers to be held")
	alice := dialRaw(t, ts.url, "alice")
	alice.send(map[string]any{"type": "login", "username": "alice",
		"password": "correct horse"})
	alice.expect("login_response")
}
