package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/popsub/popsub/docs"
	"github.com/popsub/popsub/lab/page"
)

// labCommand writes the lab's page as static files: the broker runs in
// the page, so any static file server, or a docs site, serves it with
// no popsub process.
func labCommand(args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("lab", flag.ContinueOnError)
	flags.SetOutput(stderr)
	out := flags.String("out", "", "the folder to write the lab into")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		flags.Usage()
		return errors.New("lab: --out is required")
	}
	if err := page.Export(*out, docs.SourcePage); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	fmt.Fprintf(stdout, "wrote the lab to %s: serve the folder with any "+
		"static file server and open index.html\n", *out)
	return nil
}
