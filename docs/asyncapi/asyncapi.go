// Package asyncapi holds frames to PopSub's machine-readable protocol,
// docs/asyncapi.json: an AsyncAPI 3 document whose components give a
// JSON Schema for every frame a client sends and every frame the broker
// sends (over the WebSocket, as an HTTP publish's answer, or as a
// Server-Sent Event's data). The tests validate every frame they send
// and receive with it, and every frame the docs' sessions exchange: a
// frame, a field or a value the document does not describe fails them.
// github.com/santhosh-tekuri/jsonschema/v6 does the validating: a
// complete, well-kept implementation of JSON Schema 2020-12, where a
// hand-written checker would describe the protocol a second time.
package asyncapi

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/popsub/popsub/docs"
)

// url names the document inside the compiler; it is never fetched.
const url = "https://popsub.invalid/asyncapi.json"

// Schemas compiles the document's two frame schemas: any frame a client
// sends, and any frame the broker sends.
func Schemas() (client, broker *jsonschema.Schema, err error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(docs.AsyncAPI))
	if err != nil {
		return nil, nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(url, doc); err != nil {
		return nil, nil, err
	}
	client, err = c.Compile(url + "#/components/schemas/clientFrame")
	if err != nil {
		return nil, nil, err
	}
	broker, err = c.Compile(url + "#/components/schemas/brokerFrame")
	return client, broker, err
}

// Validate checks one frame against a schema from Schemas.
func Validate(schema *jsonschema.Schema, frame []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(frame))
	if err != nil {
		return err
	}
	return schema.Validate(v)
}

// Frame is one frame a test saw: where, on which client's connection,
// and which way it went.
type Frame struct {
	Where, Client string
	FromClient    bool
	Data          []byte
}

// A Recorder keeps the frames a test suite sends and receives, to be
// held to the document once it has run. It is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	frames []Frame
}

// Add keeps a frame, or each of a run joined by newlines.
func (r *Recorder) Add(where, client string, fromClient bool, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) > 0 { // an empty body is no frame
			r.frames = append(r.frames, Frame{where, client, fromClient,
				bytes.Clone(line)})
		}
	}
}

// Check validates every frame kept, each distinct one once, and returns
// what the document does not describe, a line each; excused, if not nil,
// may pass over frame i of frames (one shown being refused, say). With
// no frames kept (tests filtered by -run) there is nothing to say.
func (r *Recorder) Check(excused func(frames []Frame, i int) bool) (
	problems []string, err error) {
	client, broker, err := Schemas()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for i, f := range r.frames {
		schema, side := broker, "received"
		if f.FromClient {
			schema, side = client, "sent"
		}
		if seen[side+string(f.Data)] || excused != nil && excused(r.frames, i) {
			continue
		}
		seen[side+string(f.Data)] = true
		if err := Validate(schema, f.Data); err != nil {
			problems = append(problems, fmt.Sprintf("%s %s %s:\n%v", f.Where,
				side, f.Data, err))
		}
	}
	return problems, nil
}

// Distinct returns each distinct frame kept, by its side, once, with
// what the document says of it: nil, or why it does not describe it.
func (r *Recorder) Distinct() ([]Frame, []error, error) {
	client, broker, err := Schemas()
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var frames []Frame
	var verdicts []error
	seen := map[string]bool{}
	for _, f := range r.frames {
		schema, side := broker, "received"
		if f.FromClient {
			schema, side = client, "sent"
		}
		if !seen[side+string(f.Data)] {
			seen[side+string(f.Data)] = true
			frames = append(frames, f)
			verdicts = append(verdicts, Validate(schema, f.Data))
		}
	}
	return frames, verdicts, nil
}

// Len returns how many frames are kept.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.frames)
}
