// Command gen writes ../source.html from ../popsub.go. It runs from the
// docs folder, through go generate.
package main

import (
	"fmt"
	"os"

	"github.com/popsub/popsub/docs/source"
)

// main renders the page, or exits with the reason.
func main() {
	src, err := os.ReadFile("../popsub.go")
	if err == nil {
		var page []byte
		page, err = source.Render("popsub.go", src)
		if err == nil {
			err = os.WriteFile("source.html", page, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
