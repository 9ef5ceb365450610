package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/popsub/popsub/transcript"
)

// This file is popsub client frames: the tutorials' sessions, typed or
// pasted, run by package transcript, a line of input a step. A
// connection's token is the environment variable named for it in
// capitals (ALICE, as the tutorials' setups export), or else --token.
// With --check the input is a whole transcript: a frame that no ← line
// shows is a mistake too.

// framesCommand runs popsub client frames.
func framesCommand(ctx context.Context, args []string, stdin io.Reader,
	stdout, stderr io.Writer) error {
	var cf clientFlags
	fs := newFlagSet("popsub client frames", stderr)
	cf.add(fs)
	check := fs.Bool("check", false, "the input is a whole transcript: "+
		"a frame that no ← line shows is a mistake")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	options, err := cf.dialOptions()
	if err != nil {
		return err
	}
	s := transcript.NewSession(cf.url, func(name string) (string, error) {
		return tokenOf(name, cf.token(""))
	}, stdout)
	s.Options, s.Hint = options, refusalHint
	defer s.Close()
	problems := 0
	lines := bufio.NewScanner(stdin)
	lines.Buffer(nil, 4<<20)
	for lines.Scan() && ctx.Err() == nil {
		if err := s.Run(ctx, lines.Text()); err != nil {
			fmt.Fprintf(stderr, "popsub: line %d: %v\n", s.LineNumber(), err)
			problems++
		}
	}
	for _, unlisted := range s.Barrier(ctx) {
		if *check {
			fmt.Fprintf(stderr, "popsub: %s, which no line shows\n",
				unlisted)
			problems++
		}
	}
	if problems > 0 {
		return fmt.Errorf("%d lines did not go as written", problems)
	}
	return nil
}

// tokenOf is the token of the connection called name: the environment
// variable of its name in capitals, else fallback (--token,
// POPSUB_TOKEN).
func tokenOf(name, fallback string) (string, error) {
	variable := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
	if token := os.Getenv(variable); token != "" {
		return token, nil
	}
	if fallback != "" {
		return fallback, nil
	}
	return "", fmt.Errorf("%s has no token: export %s=$(go run "+
		"./cmd/popsub token --sub %s), or pass --token", name, variable, name)
}
