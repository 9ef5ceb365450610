package popsub

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/popsub/popsub/wire"
)

// The broker reads frames into wire.Frame itself, and keeps encoders of
// its own for what it sends, tuned for its hot path; package wire is what
// every client decodes with. This test holds the two to the same fields,
// by JSON name and kind.

// jsonFields maps each JSON name of struct type t to its field's kind,
// pointers followed.
func jsonFields(t reflect.Type) map[string]reflect.Kind {
	fields := map[string]reflect.Kind{}
	for field := range t.Fields() {
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		kind := field.Type
		for kind.Kind() == reflect.Pointer {
			kind = kind.Elem()
		}
		fields[name] = kind.Kind()
	}
	return fields
}

// sameFields fails unless a and b name the same fields with the same
// kinds.
func sameFields(t *testing.T, what string, a, b map[string]reflect.Kind) {
	t.Helper()
	if !maps.Equal(a, b) {
		t.Errorf("%s differ:\n  the broker's: %v\n  wire's:       %v", what,
			slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b)))
		for name, kind := range a {
			if other, ok := b[name]; ok && other != kind {
				t.Errorf("%s: field %q is %v here and %v in wire", what,
					name, kind, other)
			}
		}
	}
}

func TestWire_FramesTheBrokerSendsAreTheOnesClientsRead(t *testing.T) {
	// What the broker sends: its replies, and its deliveries, which its
	// hand-written encoder makes.
	sent := jsonFields(reflect.TypeFor[reply]())
	m := &Message{Topic: "t", ID: "id", Seq: 1, Timestamp: 1, QoS: 1,
		Payload: json.RawMessage(`{"a":1}`), ExpiresAt: 2, DeliverAt: 3}
	var delivery map[string]any
	if err := json.Unmarshal(appendDelivery(nil, m, 1), &delivery); err != nil {
		t.Fatal(err)
	}
	received := jsonFields(reflect.TypeFor[wire.Received]())
	for name := range delivery {
		// The encoder writes JSON numbers and values: its kinds are
		// wire's by construction, so only its names are compared.
		if _, ok := sent[name]; !ok {
			sent[name] = received[name]
		}
		if _, ok := received[name]; !ok {
			t.Errorf("a delivery has %q, which wire.Received lacks", name)
		}
	}
	sameFields(t, "the frames the broker sends", sent, received)
}
