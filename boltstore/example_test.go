package boltstore_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/popsub/popsub/boltstore"
)

// A second process on the same file is refused within a second, with a
// message that says why.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "popsub-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "popsub.db")
	first, _ := boltstore.Open(path, nil)
	defer first.Close()
	_, err := boltstore.Open(path, nil)
	fmt.Println(strings.Replace(err.Error(), path, "popsub.db", 1))
	// Output:
	// open popsub.db: database is in use by another process
}
