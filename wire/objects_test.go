package wire

import (
	"slices"
	"testing"
)

func TestObjects_SplitsABatchFrameOnly(t *testing.T) {
	frame := []byte("{\"a\":1}\n\n  \n{\"b\":2}\n")
	var got []string
	for object := range Objects(frame, true) {
		got = append(got, string(object))
	}
	if want := []string{"{\"a\":1}\n", "{\"b\":2}\n"}; !slices.Equal(got, want) {
		t.Fatalf("batch: %q, want %q", got, want)
	}
	got = got[:0]
	for object := range Objects(frame, false) {
		got = append(got, string(object))
	}
	if len(got) != 1 || got[0] != string(frame) {
		t.Fatalf("no batch: %q, want the frame whole", got)
	}
	for range Objects(frame, true) {
		break // a caller that stops early is not called again
	}
}
