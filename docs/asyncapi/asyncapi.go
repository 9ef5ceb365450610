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
