package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/login"
)

// tokenCommand prints a signed token for --sub.
func tokenCommand(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("popsub token", stderr)
	sub := fs.String("sub", "", "the token's subject (required)")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	secretOf := secretFlag(fs, "secret", "POPSUB_SECRET",
		"the broker's secret")
	publish := fs.String("publish", "", "topic filters it may publish to, "+
		"comma-separated (default: every ordinary topic)")
	subscribe := fs.String("subscribe", "", "topic filters it may "+
		"subscribe to, comma-separated (default: every ordinary topic)")
	if _, err := parseInterleaved(fs, args); err != nil {
		return err
	}
	secret := secretOf("")
	switch {
	case *sub == "":
		return errors.New("token needs --sub NAME")
	case secret == "":
		return errors.New("token needs the broker's secret: --secret or " +
			"POPSUB_SECRET")
	case len(secret) < minSecretBytes:
		return shortSecret("the secret", len(secret))
	case *ttl <= 0:
		return errors.New("--ttl must be greater than zero")
	}
	var claims popsub.Claims
	claims.Subject = *sub
	claims.IssuedAt = jwt.NewNumericDate(time.Now())
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(*ttl))
	claims.Publish, claims.Subscribe = splitList(*publish),
		splitList(*subscribe)
	tok, err := claims.Sign([]byte(secret))
	if err != nil {
		return fmt.Errorf("sign token: %w", err)
	}
	fmt.Fprintln(stdout, tok)
	return nil
}

// hashPasswordCommand reads one line, the password, from stdin and prints
// its hash for a [users.NAME] password_hash entry. The password is never
// taken as an argument, where shell history and ps would see it.
func hashPasswordCommand(args []string, stdin io.Reader, stdout,
	stderr io.Writer) error {
	fs := newFlagSet("popsub hash-password", stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: popsub hash-password < FILE\n\n"+
			"Reads a password, one line, on standard input and prints its\n"+
			"hash for a [users.NAME] password_hash entry of the config file.")
	}
	if positional, err := parseInterleaved(fs, args); err != nil {
		return err
	} else if len(positional) > 0 {
		return errors.New("hash-password reads the password on standard " +
			"input, never as an argument, where ps and history would see it")
	}
	fmt.Fprintln(stderr, "password (one line on stdin):")
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && line == "" {
		return errors.New("no password on stdin")
	}
	password := strings.TrimRight(line, "\r\n")
	if password == "" {
		return errors.New("the password is empty")
	}
	hash, err := login.Hash(password)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, hash)
	return nil
}
