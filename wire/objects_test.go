package wire

import (
	"encoding/json"
	"slices"
	"testing"
	"unicode/utf8"
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

// FuzzAppendString checks the hand-written string encoder against
// encoding/json: what it writes reads back as the string it was given.
func FuzzAppendString(f *testing.F) {
	for _, seed := range []string{"", "a/b", `"`, `\`, "\n\x00", "é\u2028",
		"\x7f"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		var got string
		quoted := AppendString([]byte("x"), s)
		if err := json.Unmarshal(quoted[1:], &got); err != nil || got != s {
			t.Fatalf("%q wrote %s, which reads %q (%v)", s, quoted[1:],
				got, err)
		}
	})
}
