// Package built gives tests the popsub command as a reader would run it:
// this checkout's cmd/popsub, built once per test process into a
// temporary folder. The tests that start brokers as processes (package
// bench's servers, package nemesis's brokers, the command's own) share
// it, so a test binary that is not popsub never pretends to be.
package built

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/popsub/popsub/wasmbuild"
)

// build is the one build, done on first use.
var build = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "popsub-built")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "popsub")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/popsub")
	cmd.Dir = wasmbuild.Root()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/popsub: %v\n%s", err, out)
	}
	return bin, nil
})

// Popsub returns the path of the built command, building it on first
// use, or the reason it did not build.
func Popsub() (string, error) { return build() }

// PopsubFor returns the built command, or fails t.
func PopsubFor(t testing.TB) string {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}
