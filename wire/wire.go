// Package wire holds PopSub's protocol as a client sees it: the frames a
// client sends (Frame), the frames the broker sends back (Received; and
// Reply, as the broker encodes those that are not deliveries), the
// payload of a dead letter (DeadLetter), and the events of the x-ray on
// $sys/events (Event); and the broker's way of reading and writing the
// busiest frames by hand: a publish or an ack in the common shape (Scan),
// a message (AppendMessage), and, for a frame that does not decode, what
// is wrong with it in the protocol's words (Explain). It imports no other
// package of PopSub's, so that any Go client can decode with it, the
// playground's included, and a test holds the hand-written frames to the
// fields encoding/json would give. docs/protocol.md says what each field
// means.
package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"iter"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Frame is any frame a client sends, with "type" saying which. Pointers
// mark fields whose absence means something else than their zero value:
// "after":0 asks for everything after seq 0, a missing "after" for
// nothing special.
type Frame struct {
	Type       string          `json:"type"`                  // every frame
	Token      string          `json:"token,omitempty"`       // auth
	Client     string          `json:"client,omitempty"`      // auth: a display name
	Batch      bool            `json:"batch,omitempty"`       // auth: opt into batches
	Username   string          `json:"username,omitempty"`    // login
	Password   string          `json:"password,omitempty"`    // login
	Topic      string          `json:"topic,omitempty"`       // most frames
	Payload    json.RawMessage `json:"payload,omitempty"`     // publish
	MessageID  string          `json:"message_id,omitempty"`  // publish, ack
	MessageIDs []string        `json:"message_ids,omitempty"` // ack, many at once
	Seq        *uint64         `json:"seq,omitempty"`         // ack, all up to seq
	QoS        int             `json:"qos,omitempty"`         // publish
	After      *uint64         `json:"after,omitempty"`       // subscribe
	Last       *uint64         `json:"last,omitempty"`        // subscribe
	Durable    string          `json:"durable,omitempty"`     // subscribe
	Group      string          `json:"group,omitempty"`       // subscribe: a work queue
	DelayMS    *int64          `json:"delay_ms,omitempty"`    // nak, publish: wait first
	DeliverAt  *int64          `json:"deliver_at,omitempty"`  // publish: deliver then (Unix ms)
	Dead       bool            `json:"dead,omitempty"`        // nak: dead-letter it now
	Reason     string          `json:"reason,omitempty"`      // nak: why, for the dead letter
	TTLMS      *int64          `json:"ttl_ms,omitempty"`      // publish: deliver only until then
}

// Received is any frame the broker sends: a delivery ("message"), a
// reply to a client's frame (authenticated, subscribed, published,
// pong, …), or an error. Fields that do not apply are zero.
type Received struct {
	Type string `json:"type"`
	// Sub and Conn answer auth: the token's subject, and the
	// connection's number in the x-ray's events. Token answers login.
	Sub   string `json:"sub"`
	Conn  uint64 `json:"conn"`
	Token string `json:"token"`
	// Code and Message explain an error; Reason why a subscription
	// ended ("unsubscribed" after a durable name was taken over).
	Code    string `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	// Topic, Payload, Timestamp (Unix ms), MessageID, QoS, Seq and
	// Attempt describe a delivery; Seq is also a subscription's head
	// and a confirm's place in the log.
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	Timestamp int64           `json:"timestamp"`
	MessageID string          `json:"message_id"`
	QoS       int             `json:"qos"`
	Seq       uint64          `json:"seq"`
	Attempt   int             `json:"attempt"`
	// ExpiresAt (Unix ms) is when a delivery published with ttl_ms stops
	// being delivered; 0 for none. DeliverAt is when a delayed message is
	// due: on $delayed/<topic>, where it waits, and on its topic once sent.
	ExpiresAt int64 `json:"expires_at"`
	DeliverAt int64 `json:"deliver_at"`
	// Recovered is false when a subscription asked for messages the log
	// no longer keeps; Duplicate is true when a publish repeated a
	// message_id the topic still had.
	Recovered *bool `json:"recovered"`
	Duplicate bool  `json:"duplicate"`
	// Missed counts, in a "skipped" frame, the messages up to Seq that
	// left the log before a subscriber the log overtook had them. Filter
	// names the wildcard subscription such a frame is for, when Topic is
	// one the wildcard covers; "" for the subscription to Topic.
	Missed uint64 `json:"missed"`
	Filter string `json:"filter"`
}

// Reply is a frame the broker sends that is not a delivery, as it
// encodes one: Received's fields, the zero ones left out.
type Reply struct {
	Type      string  `json:"type"`
	Sub       string  `json:"sub,omitempty"`
	Conn      uint64  `json:"conn,omitempty"` // its number in $sys/events
	Token     string  `json:"token,omitempty"`
	Code      string  `json:"code,omitempty"`
	Message   string  `json:"message,omitempty"`
	Topic     string  `json:"topic,omitempty"`
	MessageID string  `json:"message_id,omitempty"`
	Seq       *uint64 `json:"seq,omitempty"`
	Recovered *bool   `json:"recovered,omitempty"`
	Duplicate bool    `json:"duplicate,omitempty"`
	Reason    string  `json:"reason,omitempty"`
	Missed    uint64  `json:"missed,omitempty"` // skipped: messages gone
	Filter    string  `json:"filter,omitempty"` // skipped: a wildcard's
}

// DeadLetter is the payload of a message on $dead/<topic>: a delivery
// that went unacked through its last retry.
type DeadLetter struct {
	Topic      string          `json:"topic"`      // where it was published
	MessageID  string          `json:"message_id"` // its id there
	Seq        uint64          `json:"seq"`        // its seq there
	Payload    json.RawMessage `json:"payload"`    // what it said
	Reason     string          `json:"reason"`     // why it is here
	Attempts   int             `json:"attempts"`   // deliveries tried
	Subscriber string          `json:"subscriber"` // the token's subject
	Client     string          `json:"client"`     // its client name, if any
}

// Objects yields the objects of one frame: the frame itself, or, from a
// client that opted into batches ("batch":true), each of its non-blank
// lines. A publisher then pays for one frame, and one system call, per
// batch of publishes rather than per message.
func Objects(frame []byte, batch bool) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		if !batch {
			yield(frame)
			return
		}
		for line := range bytes.Lines(frame) {
			if len(bytes.TrimSpace(line)) > 0 && !yield(line) {
				return
			}
		}
	}
}

// BearerToken returns the token of an "Authorization: Bearer TOKEN"
// header's value, or "": the broker's WebSocket upgrade and the HTTP
// gateway read it alike.
func BearerToken(authorization string) string {
	scheme, token, _ := strings.Cut(authorization, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// AppendMessage appends a message frame, as the broker delivers it at
// attempt. It is written by hand because a broker runs it once per
// publish and once per retry, and encoding/json costs several times as
// much. Field names are the original PopSub's, in its order, with seq
// and attempt added at the end, then deliver_at if not 0; an expires_at
// not 0 comes first, so that ExpiresAt finds it without a parse. Topic
// and id are escaped; the payload is copied as it is, because it is
// valid, compact JSON. Room for all of it is made at once, so the frame
// is one allocation.
func AppendMessage(buf []byte, topic, id string, payload []byte,
	timestamp int64, qos int, seq uint64, attempt int,
	expiresAt, deliverAt int64) []byte {
	buf = slices.Grow(buf, 128+len(topic)+len(id)+len(payload))
	buf = append(buf, `{"type":"message",`...)
	if expiresAt != 0 {
		buf = strconv.AppendInt(append(buf, expiresField...), expiresAt, 10)
		buf = append(buf, ',')
	}
	buf = AppendString(append(buf, `"topic":`...), topic)
	buf = append(append(buf, `,"payload":`...), payload...)
	buf = strconv.AppendInt(append(buf, `,"timestamp":`...), timestamp, 10)
	buf = AppendString(append(buf, `,"message_id":`...), id)
	buf = strconv.AppendInt(append(buf, `,"qos":`...), int64(qos), 10)
	buf = strconv.AppendUint(append(buf, `,"seq":`...), seq, 10)
	buf = strconv.AppendInt(append(buf, `,"attempt":`...), int64(attempt), 10)
	if deliverAt != 0 {
		buf = strconv.AppendInt(append(buf, `,"deliver_at":`...), deliverAt, 10)
	}
	return append(buf, '}')
}

// expiresField opens a message frame that has an expires_at.
const expiresField = `"expires_at":`

// ExpiresAt returns the expires_at of a message frame AppendMessage
// made, or 0 if it has none (or frame is another frame): a writer checks
// every frame it is about to send, so it reads no more than the frame's
// first field.
func ExpiresAt(frame []byte) int64 {
	rest, ok := bytes.CutPrefix(frame, []byte(`{"type":"message",`+
		expiresField))
	if !ok {
		return 0
	}
	end := bytes.IndexByte(rest, ',')
	at, err := strconv.ParseInt(string(rest[:max(end, 0)]), 10, 64)
	if err != nil {
		return 0
	}
	return at
}

// Expired reports whether frame is a message whose expires_at has passed:
// a socket drops it as its turn to be written comes, however long it
// waited (in an outbox, a replay, a retry).
func Expired(frame []byte) bool { return Past(ExpiresAt(frame)) }

// Past is the one rule of expiry: an expires_at, in Unix milliseconds,
// has passed once the clock reaches it; 0, no expires_at, never does.
// The clock is read only for a message that has one.
func Past(expiresAt int64) bool {
	return expiresAt != 0 && time.Now().UnixMilli() >= expiresAt
}

// AppendString appends s as a JSON string. s is valid UTF-8 (the broker
// checks every frame on arrival), so most strings need only their
// quotes; the rare one with a quote, a backslash or a control character
// goes through encoding/json, which escapes it.
func AppendString(buf []byte, s string) []byte {
	// A byte at a time, not a rune: no byte of a multi-byte character is
	// under 0x80, and decoding runes was 2 % of the broker's CPU with one
	// subscriber.
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' {
			quoted, _ := json.Marshal(s)
			return append(buf, quoted...)
		}
	}
	return append(append(append(buf, '"'), s...), '"')
}

// Topics follow MQTT's rules: levels separated by "/", "+" matches one
// level, "#" matches the rest and must come last, and a wildcard in the
// first level never matches a topic starting with "$".

// MaxTopicBytes is the longest topic name or filter, in bytes, not
// counting the prefix of a topic's dead letters' or delayed messages' log
// ($dead/ and $delayed/, or both): every topic has room for both.
const MaxTopicBytes = 256

// nameBytes is how long filter is, as MaxTopicBytes counts.
func nameBytes(filter string) int {
	filter = strings.TrimPrefix(filter, "$dead/")
	return len(strings.TrimPrefix(filter, "$delayed/"))
}

// ValidTopic explains why name cannot be published to, or returns "".
func ValidTopic(name string) string {
	if msg := ValidFilter(name); msg != "" || !IsWildcard(name) {
		return msg
	}
	return "wildcards are for subscriptions, not publishes"
}

// ValidFilter explains why filter cannot be subscribed to, or returns "".
// NUL is refused because durable keys use it as a separator.
func ValidFilter(filter string) string {
	switch {
	case filter == "":
		return "topic is missing or empty"
	case nameBytes(filter) > MaxTopicBytes:
		return "topic is longer than 256 bytes"
	case strings.ContainsRune(filter, 0):
		return "topic contains a NUL character"
	}
	// Wildcards must fill a level: "a+" or "#b" would be a typo that MQTT
	// refuses too, not a pattern. SplitSeq, not Split: every publish
	// comes through here, and it allocates nothing.
	afterHash := false
	for level := range strings.SplitSeq(filter, "/") {
		if afterHash {
			return "# must be the last level"
		}
		if strings.ContainsAny(level, "+#") && len(level) > 1 {
			return "a wildcard must fill a whole level"
		}
		afterHash = level == "#"
	}
	return ""
}

// IsWildcard reports whether filter has a + or # level. ValidFilter has
// already checked that a wildcard fills its level.
func IsWildcard(filter string) bool {
	return strings.ContainsAny(filter, "+#")
}

// Covers reports whether every topic that filter matches is also matched
// by grant. For a plain topic as filter, that is "grant matches topic",
// so one function routes messages and checks permissions.
func Covers(grant, filter string) bool {
	if strings.HasPrefix(filter, "$") && (strings.HasPrefix(grant, "+") ||
		strings.HasPrefix(grant, "#")) {
		return false
	}

	// Walk both level by level. "#" in the grant covers whatever is
	// left; in the filter it is covered only by a "#" in the grant.
	for {
		level, rest, more := strings.Cut(grant, "/")
		if level == "#" {
			return true
		}
		name, filterRest, filterMore := strings.Cut(filter, "/")
		if name == "#" || (level != "+" && level != name) {
			return false
		}
		if !filterMore {
			return !more || rest == "#"
		}
		if !more {
			return false
		}
		grant, filter = rest, filterRest
	}
}

// NewMessageID returns a random 128-bit message_id in hex, as the broker
// makes one for a publish that has none: unique without coordination,
// even across restarts. An id is not a secret, so it comes from
// math/rand/v2's generator (ChaCha8, seeded by the OS): an id costs 24 ns
// here, against 82 ns with crypto/rand, once per message.
func NewMessageID() string {
	var raw [16]byte
	binary.LittleEndian.PutUint64(raw[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(raw[8:], rand.Uint64())
	return hex.EncodeToString(raw[:])
}
