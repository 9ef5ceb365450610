package gateway

import (
	"fmt"
	"os"
	"testing"

	"github.com/popsub/popsub/docs/asyncapi"
)

// frames are the frames these tests send and receive: over the
// WebSocket, as an HTTP publish's answer, and as a Server-Sent Event's
// data. Once every test has run, TestMain holds them to the protocol's
// machine-readable description, docs/asyncapi.json: one it does not
// describe fails the run.
var frames asyncapi.Recorder

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		problems, err := frames.Check(nil)
		if err != nil {
			problems = append(problems, err.Error())
		}
		for _, problem := range problems {
			fmt.Fprintln(os.Stderr, "docs/asyncapi.json:", problem)
			code = 1
		}
	}
	os.Exit(code)
}
