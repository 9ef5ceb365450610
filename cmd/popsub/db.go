package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/popsub/popsub/boltstore"
)

// This file is popsub db: check a database, and salvage what a damaged
// one still holds into a new file (boltstore.Salvage, beside the layout
// it reads).

// dbUsage is printed for popsub db without a subcommand.
const dbUsage = `usage: popsub db check --db FILE
       popsub db salvage --db FILE --to NEW
`

// dbCommand runs popsub db check or popsub db salvage.
func dbCommand(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "check" && args[0] != "salvage") {
		fmt.Fprint(stderr, dbUsage)
		return errors.New("popsub db needs check or salvage")
	}
	fs := newFlagSet("popsub db "+args[0], stderr)
	path := fs.String("db", env("POPSUB_DB", "popsub.db"),
		"the database to read (POPSUB_DB)")
	to := fs.String("to", "", "salvage: the new file to write")
	if _, err := parseInterleaved(fs, args[1:]); err != nil {
		return err
	}
	if args[0] == "salvage" && *to == "" {
		return errors.New("salvage needs --to NEW, a file that does not " +
			"exist yet")
	}
	report, err := boltstore.Salvage(*path, *to)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, report)
	if args[0] == "check" && report.Damaged() {
		return fmt.Errorf("%s is damaged: 'popsub db salvage --db %[1]s "+
			"--to NEW' copies every readable record to NEW", *path)
	}
	return nil
}
