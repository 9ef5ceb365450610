// Command gen writes docs/source.html from popsub.go and the files beside
// it, and refreshes the
// quoted declarations in docs/*.md. It runs from the docs folder, through
// go generate.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/popsub/popsub/docs/source"
)

// main renders the page and the quotes, or exits with the reason.
func main() {
	if err := generate(); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

// generate does main's work.
func generate() error {
	files, err := source.Load("..")
	if err != nil {
		return err
	}
	page, err := source.Render(files)
	if err != nil {
		return err
	}
	if err := os.WriteFile("source.html", page, 0o644); err != nil {
		return err
	}
	paths, _ := filepath.Glob("*.md")
	for _, path := range paths {
		md, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		updated, _, err := source.UpdateQuotes(string(md), files)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
			return err
		}
	}
	return nil
}
