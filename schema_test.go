package popsub

import (
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/popsub/popsub/docs/asyncapi"
)

// This file holds every frame the tests send and receive to the
// protocol's machine-readable description, docs/asyncapi.json: the
// harness records each one (record), and once every test has run,
// TestMain validates them all (validateRecorded). A frame the document
// does not describe, a field it does not name or a value of the wrong
// kind, fails the run, naming the test that saw it. A test that sends a
// frame the protocol refuses on purpose sends it with sendUndescribed.

// recorded are the frames the tests saw, for validateRecorded.
var recorded asyncapi.Recorder

// record keeps a frame a test's client sent (fromUs) or received.
func record(t testing.TB, fromUs bool, data []byte) {
	recorded.Add(t.Name(), "", fromUs, data)
}

// validateRecorded validates every recorded frame and says what fails.
func validateRecorded() error {
	problems, err := recorded.Check(nil)
	if err != nil {
		return fmt.Errorf("docs/asyncapi.json: %w", err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d frames docs/asyncapi.json does not describe:"+
			"\n%s", len(problems), strings.Join(problems, "\n"))
	}
	return nil
}

// The document describes every frame the protocol has, and nothing
// else: a frame of an unknown type, an unknown field or a value of the
// wrong kind fails, on either side.
func TestAsyncAPI_DescribesTheFramesAndNothingElse(t *testing.T) {
	client, broker, err := asyncapi.Schemas()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		schema *jsonschema.Schema
		frame  string
		ok     bool
	}{
		{client, `{"type":"publish","topic":"jobs","payload":{"n":1},"qos":1,"message_id":"a"}`, true},
		{client, `{"type":"ack","topic":"jobs","seq":3}`, true},
		{client, `{"type":"dance"}`, false},
		{client, `{"type":"ping","extra":1}`, false},
		{client, `{"type":"publish","topic":"jobs","qos":2}`, false},
		{client, `{"type":"subscribe","topic":"jobs","after":"1"}`, false},
		{broker, `{"type":"message","topic":"t","payload":1,"timestamp":1,"message_id":"m","qos":0,"seq":1,"attempt":1}`, true},
		{broker, `{"type":"message","topic":"t","payload":1}`, false},
		{broker, `{"type":"published","topic":"t","message_id":"m","seq":1,"secret":true}`, false},
		{broker, `{"type":"publish","topic":"t"}`, false},
	} {
		if err := asyncapi.Validate(c.schema, []byte(c.frame)); (err == nil) != c.ok {
			t.Errorf("%s: valid %v, want %v (%v)", c.frame, err == nil, c.ok, err)
		}
	}
}
