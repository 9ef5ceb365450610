package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/popsub/popsub"
)

// tokenCommand prints a signed token for --sub.
func tokenCommand(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("popsub token", stderr)
	sub := fs.String("sub", "", "the token's subject (required)")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	secret := fs.String("secret", env("POPSUB_SECRET", ""),
		"the broker's secret (POPSUB_SECRET)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	switch {
	case *sub == "":
		return errors.New("token needs --sub NAME")
	case *secret == "":
		return errors.New("token needs the broker's secret: --secret or " +
			"POPSUB_SECRET")
	case *ttl <= 0:
		return errors.New("--ttl must be greater than zero")
	}
	tok, err := popsub.NewToken([]byte(*secret), *sub, *ttl)
	if err != nil {
		return fmt.Errorf("sign token: %w", err)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
