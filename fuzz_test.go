package popsub

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fuzz targets for the places a stranger's bytes meet the broker's
// logic: frame parsing and topic matching. Their seed corpora run in
// every plain go test; go test -fuzz=FuzzFrame explores further.

// frameSeeds are frames of every shape, for the frame fuzz targets.
var frameSeeds = []string{
	`{"type":"auth","token":"x"}`,
	`{"type":"publish","topic":"a/b","payload":{"k":[1,2]},"qos":1}`,
	`{"type":"publish","topic":"a","payload":"\u2028\n","message_id":""}`,
	`{"type":"subscribe","topic":"a/+/#","after":18446744073709551615}`,
	`{"type":"ack","message_ids":["a","b"],"topic":"t","seq":3}`,
	`{"type":"publish","topic":"a","payload":1e999}`,
	`{"type":"subscribe","topic":"` + strings.Repeat("a/", 200) + `"}`,
	`{"type":`, `[]`, `null`, `{"type":null}`, `{"qos":-1}`,
	` { "type" : "ack" , "topic" : "t" , "seq" : 0 } `,
	`{"type":"publish","payload":[{"a":"]}"},"\""],"topic":"t"}`,
	`{"type":"auth","batch":true,"client":"é"}`, `{}`, `{"seq":01}`,
	`{"Type":"ping"}`, `{"type":"ping"}x`, `{"payload":"a"b}`,
}

func FuzzFrame(f *testing.F) {
	for _, seed := range frameSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		frame, problem := decodeFrame(data)
		if problem.Type != "" {
			return
		}
		validFilter(frame.Topic)
		m, problem := newMessage(frame)
		if problem.Type != "" {
			return
		}

		// Whatever a publisher sent, the delivery built from it must be
		// one line of valid JSON, or batching and clients would break.
		m.Seq, m.Timestamp = 1, 1
		delivery := appendDelivery(nil, m, 1)
		if !json.Valid(delivery) || strings.ContainsRune(string(delivery),
			'\n') {
			t.Fatalf("bad delivery %q from frame %q", delivery, data)
		}
	})
}

// FuzzScanFrame checks the hand-written reader against encoding/json:
// whatever frame it accepts, it reads exactly as encoding/json does.
func FuzzScanFrame(f *testing.F) {
	for _, seed := range frameSeeds {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Frames are checked for UTF-8 before they are decoded.
		if !utf8.Valid(data) {
			return
		}
		fast, ok := scanFrame(data)
		if !ok {
			return
		}
		var slow frame
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("scanFrame accepted %q, which encoding/json refuses: %v",
				data, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("frame %q: scanFrame read %+v, encoding/json %+v", data,
				fast, slow)
		}
	})
}

// FuzzScanValue checks the payload reader against json.Valid, both ways:
// what it accepts is valid JSON, and valid JSON but null it accepts.
func FuzzScanValue(f *testing.F) {
	for _, seed := range []string{
		`{"a":[1,-0.5e+3,"\u00e9\n\"",true,false,null,{}]}`, `"\ud800"`,
		`01`, `1.`, `[1,]`, `{"a"}`, `"\x"`, `[[[]]]`, ` 1 `, `-`, `1e`,
		`tru`, `null`, `"a` + "\t" + `b"`, `[1 2]`, `{"a":1,}`, `-0`,
		`1E+2`, `"\u12G4"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) {
			return
		}
		s := scanner{data: data}
		value, ok := s.value()
		s.space()
		whole := ok && s.pos == len(data)
		trimmed := bytes.Trim(data, " \t\n\r")
		if whole && (!json.Valid(value) || !bytes.Equal(value, trimmed)) {
			t.Fatalf("accepted %q as %q, which is not one JSON value", data,
				value)
		}
		if !whole && json.Valid(data) &&
			!bytes.Equal(trimmed, []byte("null")) {
			t.Fatalf("refused %q, which is valid JSON", data)
		}
	})
}

func FuzzCovers(f *testing.F) {
	for _, seed := range [][2]string{
		{"a/+/c", "a/b/c"}, {"#", "$sys/x"}, {"a/#", "a"}, {"+", ""},
		{"a//b", "a//b"}, {"$dead/#", "$dead/a/b"}, {"/", "/"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, grant, topic string) {
		Covers(grant, topic)
		if validTopic(topic) != "" {
			return
		}

		// Two properties any matcher must keep: a topic covers itself,
		// and # covers every topic that is not the broker's own.
		if !Covers(topic, topic) {
			t.Fatalf("%q does not cover itself", topic)
		}
		if !strings.HasPrefix(topic, "$") && !Covers("#", topic) {
			t.Fatalf("# does not cover %q", topic)
		}
	})
}

func TestScanFrame_TakesOnlyTheCommonShape(t *testing.T) {
	// The fast path must actually be taken for what clients send, or it
	// saves nothing; everything else must be left to encoding/json.
	fast := []string{
		`{"type":"publish","topic":"a/b","payload":{"k":[1,"]"]},"qos":1}`,
		`{"type":"ack","topic":"t","seq":18446744073709551615}`,
		` { "type" : "ack" , "topic" : "a/b" , "message_id" : "m" } `,
		`{"type":"publish","topic":"t","payload":"a \"quoted\" word"}`,
	}
	slow := []string{
		`{"type":"publish","topic":"a\/b","payload":1}`, // an escape
		`{"type":"ack","message_ids":["a"]}`,            // a list
		`{"type":"publish","topic":"t","payload":null}`, // null
		`{"type":"ack","topic":"t","seq":1.0}`,          // a float
		`{"type":"ack","topic":"t","seq":01}`,           // a leading zero
		`{"Type":"ping"}`,                               // another case
		`{"type":"ping","extra":1}`,                     // an unknown key
		`{"type":"ping"} {}`,                            // trailing data
		`{"type":"ack","seq":18446744073709551616}`,     // overflow
		`{"type":"auth","token":"x.y.z","batch":true}`,  // a rare frame
	}
	for _, data := range fast {
		if _, ok := scanFrame([]byte(data)); !ok {
			t.Errorf("scanFrame gave up on %s", data)
		}
	}
	for _, data := range slow {
		if _, ok := scanFrame([]byte(data)); ok {
			t.Errorf("scanFrame accepted %s", data)
		}
	}
}
