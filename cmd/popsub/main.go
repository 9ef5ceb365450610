// Command popsub runs the PopSub broker and talks to it.
//
//	popsub serve                      run the broker (alias: server)
//	popsub token --sub NAME           print a signed token
//	popsub hash-password              hash a password (read from stdin)
//	                                  for a [users.NAME] config entry
//	popsub client                     the original's demo: auth, subscribe
//	                                  "chat", publish, print what arrives
//	popsub client sub TOPIC           print deliveries as JSON lines, ack
//	popsub client pub TOPIC PAYLOAD   publish; with --qos 1, wait for the
//	                                  confirm
//	popsub client frames              type frames at the broker, a line
//	                                  each (alice → {…}), and see every
//	                                  frame each connection gets
//	popsub bench                      load a server: throughput, losses,
//	                                  latency, server CPU and memory
//	popsub chaos                      run brokers under faults and check
//	                                  every promise the protocol makes
//	popsub db check|salvage           report damage in a database, and
//	                                  copy what is readable to a new one
//	popsub lab --out DIR              write the lab (the broker in a
//	                                  page) as static files
//
// Every flag can also be set from the environment (POPSUB_ADDR, …);
// a flag wins over the environment, which wins over the default.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"syscall"
)

// usage is printed for -h and for an unknown command.
const usage = `usage: popsub <command> [flags]

commands:
  serve (or server)          run the broker
  token --sub NAME           print a signed token
  hash-password              read a password on stdin, print its hash
  client                     the original's demo session
  client sub TOPIC           print deliveries as JSON lines, acking QoS 1
  client pub TOPIC PAYLOAD   publish a message (--qos 1 waits for confirm)
  client frames              type frames, "alice → {...}" a line, and see
                             what each connection gets (--check: compare
                             with the input's "alice ← {...}" lines)
  bench                      load a server and report speed and losses
  chaos                      run brokers under faults, check the promises
  db check --db FILE         report what a database holds, and damage
  db salvage --db FILE --to NEW
                             copy every readable record to a new file
  lab --out DIR              write the lab page (the real broker, in the
                             browser) as files any static server serves

Run 'popsub <command> -h' for its flags.
`

// main runs the command until it finishes or SIGINT/SIGTERM arrives.
func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt,
		syscall.SIGTERM)
	defer stop()

	// POPSUB_CPUPROFILE=FILE profiles a server's whole run, for
	// docs/performance.md; go tool pprof reads the file. Only serve
	// profiles, so that popsub bench, whose child server inherits the
	// variable, profiles the server and not itself.
	serving := len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "serve")
	if path := os.Getenv("POPSUB_CPUPROFILE"); path != "" && serving {
		if f, err := os.Create(path); err == nil {
			pprof.StartCPUProfile(f)
			defer pprof.StopCPUProfile()
		}
	}
	// POPSUB_TRACE=FILE records an execution trace of the same run, for
	// where time goes while nothing is on a CPU (go tool trace).
	if path := os.Getenv("POPSUB_TRACE"); path != "" && serving {
		if f, err := os.Create(path); err == nil {
			trace.Start(f)
			defer trace.Stop()
		}
	}
	// POPSUB_MEMPROFILE=FILE writes, when the server stops, where it
	// allocated over its whole run (go tool pprof -sample_index=
	// alloc_space reads it).
	if path := os.Getenv("POPSUB_MEMPROFILE"); path != "" && serving {
		defer writeAllocs(path)
	}
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "popsub:", err)
		pprof.StopCPUProfile()
		trace.Stop()
		os.Exit(1)
	}
}

// run dispatches to a command. It is main without the process around it,
// so tests can call it.
func run(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "serve", "server":
		return serve(ctx, args[1:], stdout, stderr)
	case "token":
		return tokenCommand(args[1:], stdout, stderr)
	case "hash-password":
		return hashPasswordCommand(args[1:], os.Stdin, stdout, stderr)
	case "client":
		return clientCommand(ctx, args[1:], stdout, stderr)
	case "bench":
		return benchCommand(ctx, args[1:], stdout, stderr)
	case "chaos":
		return chaosCommand(ctx, args[1:], stdout, stderr)
	case "db":
		return dbCommand(args[1:], stdout, stderr)
	case "lab":
		return labCommand(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// env returns the environment variable name, or fallback when unset.
func env(name, fallback string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return fallback
}

// parseInterleaved parses flags that may come before, between or after
// positional arguments (popsub client pub TOPIC PAYLOAD --qos 1), and
// returns the positional ones. "--" ends the flags, and a negative
// number is a value, not a flag: pub chat -5 publishes -5.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for len(args) > 0 {
		switch {
		case args[0] == "--":
			return append(positional, args[1:]...), nil
		case negativeNumber.MatchString(args[0]):
			positional, args = append(positional, args[0]), args[1:]
			continue
		}
		if err := fs.Parse(flagsUpTo(args)); err != nil {
			return nil, err
		}
		args = args[len(flagsUpTo(args))-fs.NArg():]
		if fs.NArg() > 0 {
			positional, args = append(positional, args[0]), args[1:]
		}
	}
	return positional, nil
}

// secretFlag declares a flag for a secret or a token. Its default, from
// the environment variable or a fallback the caller gives (a config
// file's), is looked up only when the flag is read, after parsing: a
// default in the flag itself would be printed by -h for anyone to see.
func secretFlag(fs *flag.FlagSet, name, variable, usage string) func(
	fallback string) string {
	value := fs.String(name, "", usage+" ("+variable+")")
	return func(fallback string) string {
		if *value != "" {
			return *value
		}
		return env(variable, fallback)
	}
}

// negativeNumber matches an argument such as -5 or -0.5.
var negativeNumber = regexp.MustCompile(`^-[0-9.]`)

// flagsUpTo is args up to the first "--" or negative number.
func flagsUpTo(args []string) []string {
	for i, arg := range args {
		if arg == "--" || negativeNumber.MatchString(arg) {
			return args[:i]
		}
	}
	return args
}

// newFlagSet returns a flag set that reports errors to stderr.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// writeAllocs writes the allocations profile to path, for
// POPSUB_MEMPROFILE.
func writeAllocs(path string) {
	if f, err := os.Create(path); err == nil {
		pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
	}
}
