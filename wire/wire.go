// Package wire holds PopSub's protocol as a client sees it: the frames a
// client sends (Frame), the frames the broker sends back (Received), the
// payload of a dead letter (DeadLetter), and the events of the x-ray on
// $sys/events (Event); and the broker's way of reading a frame: by hand
// for the common shape (Scan), and, for one that does not decode, what
// is wrong with it in the protocol's words (Explain). It has no dependencies, so that any Go client can
// decode them, the playground's included, which is compiled to
// WebAssembly and cannot import the broker (its store, bbolt, does not
// build there). docs/protocol.md says what each field means; popsub.go
// keeps hand-tuned encoders of its own, and a test holds the two to the
// same fields.
package wire

import (
	"encoding/json"
	"strings"
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
	// Recovered is false when a subscription asked for messages the log
	// no longer keeps; Duplicate is true when a publish repeated a
	// message_id the topic still had.
	Recovered *bool `json:"recovered"`
	Duplicate bool  `json:"duplicate"`
	// Missed counts, in a "skipped" frame, the messages up to Seq that
	// left the log before a subscriber the log overtook had them.
	Missed uint64 `json:"missed"`
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
