package main

import (
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/docs/asyncapi"
	"github.com/popsub/popsub/internal/logbuf"
	"github.com/popsub/popsub/transcript"
)

// This file runs the docs. Every fenced block in docs/*.md that shows a
// shell command or a client frame is marked runnable, and is executed
// here against a real server, so the docs cannot drift from the code:
//
//   - "sh serve": $ popsub serve [flags] starts the server (a later one
//     restarts it on the same database); its banner must match.
//   - "sh run": $ popsub … commands, each followed by its output (a
//     failing command prints "popsub: " and its error); "$ export
//     NAME=value" sets a variable for the commands after it, and the
//     value may be $(popsub …). Any other command (curl, node, echo)
//     runs in bash, in the tutorial's folder, with those variables.
//   - "browser": a page in Chromium, one step a line: open URL, type
//     "TEXT" into SELECTOR, click "LABEL" (a button's text), see
//     "TEXT" in SELECTOR (waits until it is there). $NAME in a line is
//     the variable's value.
//   - "toml file=NAME" (or any "LANG file=NAME"): the block is written to
//     NAME in the working folder, for the commands after it.
//   - "json frames": a session of named clients over WebSockets:
//     "alice → {…}" sends, "alice ← {…}" expects, "alice ✕ 4008"
//     expects the close code, and "alice ✕" alone closes alice's
//     connection. "TOKEN" stands for a valid token. A client
//     is authenticated before its first frame unless that frame is auth
//     or login, or its name starts with "stranger".
//
//   - "sh nats": "$ go install github.com/nats-io/nats-server/v2" builds
//     the NATS server go.mod pins, into a folder of the test's, and
//     "$ nats-server …" starts it there, on a free port, for the rest of
//     the file.
//   - "sh stop": stops the broker whose address the block names, as
//     Ctrl-C in its terminal would.
//
// In expected output "…" matches anything. The address 127.0.0.1:8080
// stands for the test server's, wherever it listens; a serve block with
// another --addr starts a second server beside it, and that address
// stands for the second's. 127.0.0.1:4222 stands for the NATS server's.

// fence is one fenced block of a Markdown file.
type fence struct {
	info  string   // what follows the opening backticks
	lines []string // the block's lines
	line  int      // where it starts, for messages
}

// fences returns the fenced blocks of Markdown text.
func fences(text string) []fence {
	var list []fence
	var current *fence
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case current == nil && strings.HasPrefix(trimmed, "```"):
			current = &fence{info: strings.TrimPrefix(trimmed, "```"),
				line: i + 1}
		case current != nil && trimmed == "```":
			list = append(list, *current)
			current = nil
		case current != nil:
			current.lines = append(current.lines, line)
		}
	}
	return list
}

// docServer is the server a Markdown file's blocks run against.
type docServer struct {
	t       *testing.T
	dir     string       // the file's working folder: databases go here
	address string       // host:port of the running server
	token   string       // the token serve printed, if it made one
	stop    func() error // stops the running server
	// session is the clients' frames session on the running broker;
	// block says where the block it runs now is, for docFrames.
	session *transcript.Session
	block   string
	// name is the file being run.
	name string
	// tutorial is set for the tutorials, which run in one folder one
	// after the other, and name each client's token in their setup.
	tutorial bool
	// others are the servers started with another --addr, by the
	// address the doc gives them.
	others map[string]*otherServer
	// natsBin is the folder go install put nats-server in; nats is the
	// address the NATS server listens on, once started.
	natsBin, nats string
	// page is the browser the "browser" blocks drive, once started.
	page context.Context
}

// otherServer is a second broker of a file, beside the default one.
type otherServer struct {
	address string       // where it really listens
	stop    func() error // stops it
}

// addresses maps each address a doc names to the one it stands for.
func (s *docServer) addresses() map[string]string {
	real := map[string]string{}
	if s.address != "" {
		real["127.0.0.1:8080"] = s.address
	}
	for named, other := range s.others {
		real[named] = other.address
	}
	if s.nats != "" {
		real["127.0.0.1:4222"] = s.nats
	}
	return real
}

// localize replaces the addresses a doc names with the real ones, in one
// pass: one at a time, a real port holding a named one (42221 holds 4222)
// would be replaced again.
func (s *docServer) localize(text string) string {
	var pairs []string
	for named, real := range s.addresses() {
		pairs = append(pairs, named, real)
	}
	return strings.NewReplacer(pairs...).Replace(text)
}

func TestDocs_EveryCommandAndFrameRuns(t *testing.T) {
	docs, _ := filepath.Abs("../../docs")
	paths, _ := filepath.Glob(filepath.Join(docs, "*.md"))
	if len(paths) == 0 {
		t.Fatal("no docs found")
	}
	t.Setenv("POPSUB_TOKEN", "")
	t.Setenv("POPSUB_SECRET", "")

	// The tutorials run as a reader follows them: in order, in one
	// folder, one terminal's variables carried from one to the next.
	t.Run("the tutorials in order", func(t *testing.T) {
		s := &docServer{t: t, dir: t.TempDir(), tutorial: true}
		t.Chdir(s.dir)
		for _, path := range paths {
			if name := filepath.Base(path); name[0] >= '1' && name[0] <= '9' {
				t.Run(name, func(t *testing.T) { s.file(t, path) })
			}
		}
	})
	for _, path := range paths {
		if name := filepath.Base(path); name[0] < '1' || name[0] > '9' {
			t.Run(name, func(t *testing.T) {
				s := &docServer{t: t, dir: t.TempDir()}
				t.Chdir(s.dir)
				s.file(t, path)
			})
		}
	}
	t.Run("every frame is in docs/asyncapi.json", checkDocFrames)
	t.Run("asyncapi-validator reads each frame as the Go validator does",
		crossCheckDocFrames)
}

// crossCheckDocFrames validates every distinct frame of the docs'
// sessions again with asyncapi-validator, an Ajv-based reading of the
// document written by other people, and fails where its verdict and the
// Go validator's differ: two readings that agree are a check of the
// document, not of one validator's reading of it.
func crossCheckDocFrames(t *testing.T) {
	tools := npmTools(t)
	frames, verdicts, err := docFrames.Distinct()
	if err != nil {
		t.Fatal(err)
	}
	type input struct {
		FromClient bool   `json:"fromClient"`
		Frame      string `json:"frame"`
	}
	var in []input
	for _, f := range frames {
		in = append(in, input{f.FromClient, string(f.Data)})
	}
	data, _ := json.Marshal(in)
	command := exec.Command(nodeBinary(t), filepath.Join(tools,
		"validate-frames.mjs"), "../../docs/asyncapi.json")
	command.Stdin = bytes.NewReader(data)
	out, err := command.Output()
	if err != nil {
		t.Fatalf("validate-frames.mjs: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(frames) {
		t.Fatalf("%d verdicts for %d frames", len(lines), len(frames))
	}
	for i, line := range lines {
		var v struct {
			OK    bool
			Error string
		}
		json.Unmarshal([]byte(line), &v)
		if v.OK != (verdicts[i] == nil) {
			t.Errorf("%s: %s: asyncapi-validator says valid %v (%s), the Go "+
				"validator %v (%v)", frames[i].Where, frames[i].Data, v.OK,
				v.Error, verdicts[i] == nil, verdicts[i])
		}
	}
	t.Logf("%d distinct frames, each read alike by both", len(frames))
}

// npmTools is the folder of the npm packages the tests check PopSub with
// (testdata/npm: the AsyncAPI project's parser, asyncapi-validator,
// eventsource), which .ci/run installs with npm ci. Without them a test
// is skipped on a developer's machine, and fails under CI=true.
func npmTools(t *testing.T) string {
	dir, err := filepath.Abs("../../testdata/npm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no npm packages in %s; .ci/run installs them with "+
				"npm ci", dir)
		}
		t.Skipf("no npm packages in %s (npm ci --prefix testdata/npm)", dir)
	}
	return dir
}

// TestAsyncAPI_TheProjectsOwnParserReadsTheDocument parses
// docs/asyncapi.json with @asyncapi/parser, the AsyncAPI project's own:
// no error and no warning, the latest version of the specification
// included.
func TestAsyncAPI_TheProjectsOwnParserReadsTheDocument(t *testing.T) {
	tools := npmTools(t)
	command := exec.Command(nodeBinary(t), filepath.Join(tools,
		"parse-asyncapi.mjs"), "../../docs/asyncapi.json")
	out, err := command.CombinedOutput()
	if err != nil {
		t.Fatalf("@asyncapi/parser: %v\n%s", err, out)
	}
	if len(bytes.TrimSpace(out)) > 0 {
		t.Logf("@asyncapi/parser's notes:\n%s", out)
	}
}

// docFrames are the frames the docs' sessions sent and received, held to
// the protocol's machine-readable description (package asyncapi): a
// block that shows a frame the document does not describe fails. A frame
// the broker refuses for its shape (bad_frame, missing_field,
// unknown_type, invalid_qos, invalid_topic), shown on purpose, is the
// one exception.
var docFrames asyncapi.Recorder

// checkDocFrames validates every frame the docs' sessions exchanged.
func checkDocFrames(t *testing.T) {
	if docFrames.Len() == 0 {
		t.Fatal("the docs' sessions exchanged no frames")
	}
	problems, err := docFrames.Check(refusedAsMalformed)
	if err != nil {
		t.Fatal(err)
	}
	for _, problem := range problems {
		t.Error(problem)
	}
}

// refusedAsMalformed reports whether frame i, a client's, got an error
// for its shape as the next frame its client received: a doc showing
// what a bad frame gets.
func refusedAsMalformed(frames []asyncapi.Frame, i int) bool {
	if !frames[i].FromClient {
		return false
	}
	for _, f := range frames[i+1:] {
		if f.Client == frames[i].Client && !f.FromClient {
			var reply struct{ Type, Code string }
			json.Unmarshal(f.Data, &reply)
			return reply.Type == "error" && (reply.Code == "bad_frame" ||
				reply.Code == "missing_field" ||
				reply.Code == "unknown_type" || reply.Code == "invalid_qos" ||
				reply.Code == "invalid_topic")
		}
	}
	return false
}

// file runs every block of the Markdown file at path. A tutorial after
// the first starts with a setup block, as a reader starts a new one.
func (s *docServer) file(t *testing.T, path string) {
	s.t, s.name = t, filepath.Base(path)
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	runnable := false
	for _, f := range fences(string(text)) {
		first := filepath.Base(path)[0] == '1'
		if !runnable && s.tutorial && !first && strings.HasPrefix(f.info,
			"sh ") && f.info != "sh setup" || f.info == "json frames" &&
			!runnable && s.tutorial && !first {
			t.Errorf("a tutorial opens with a setup block (sh setup), "+
				"not %q", f.info)
		}
		runnable = runnable || f.info == "json frames" ||
			strings.HasPrefix(f.info, "sh ")
		s.run(f)
	}
}

// run executes one block, or checks that it need not run.
func (s *docServer) run(f fence) {
	s.t.Helper()
	where := fmt.Sprintf("line %d", f.line)
	if _, name, ok := strings.Cut(f.info, " file="); ok {
		// A file may name the broker's address, which stands for the
		// test server's, as in the commands.
		text := s.localize(strings.Join(f.lines, "\n") + "\n")
		path := filepath.Join(s.dir, name)
		os.MkdirAll(filepath.Dir(path), 0o700)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			s.t.Fatal(err)
		}
		return
	}
	switch f.info {
	case "sh setup":
		s.setup(f.lines, where)
	case "sh nats":
		s.startNATS(f.lines, where)
	case "sh stop":
		s.stopNamed(f.lines, where)
	case "sh serve":
		s.serve(f.lines, where)
	case "sh run":
		s.ensure()
		s.shell(f.lines, where)
	case "json frames":
		s.ensure()
		s.frames(f.lines, where)
	case "browser":
		s.ensure()
		s.browse(f.lines, where)
	case "sh", "bash", "console", "json", "":
		if len(f.lines) > 0 {
			s.t.Errorf("%s: a %q block must be marked runnable (sh run, "+
				"sh serve or json frames)", where, f.info)
		}
	}
}

// commands returns the $ commands of a block that holds only those and
// # notes, such as a setup or a nats block.
func (s *docServer) commands(kind string, lines []string,
	where string) []string {
	var list []string
	for _, line := range lines {
		command, ok := strings.CutPrefix(line, "$ ")
		switch {
		case ok:
			list = append(list, command)
		case !strings.HasPrefix(line, "#") && strings.TrimSpace(line) != "":
			s.t.Fatalf("%s: a %s block holds $ commands and # notes, "+
				"not %q", where, kind, line)
		}
	}
	return list
}

// stopOther stops the broker a doc calls named, as Ctrl-C would.
func (s *docServer) stopOther(named, where string) {
	if err := s.others[named].stop(); err != nil {
		s.t.Fatalf("%s: stopping the broker on %s: %v", where, named, err)
	}
	delete(s.others, named)
}

// setup does what a tutorial's setup block says: the broker of the last
// one is stopped (its comment tells the reader to press Ctrl-C), files
// are removed, and variables set or unset.
func (s *docServer) setup(lines []string, where string) {
	s.endSession()
	if s.stop != nil {
		if err := s.stop(); err != nil {
			s.t.Fatalf("%s: stopping the last broker: %v", where, err)
		}
		s.stop = nil
	}
	for named := range s.others {
		s.stopOther(named, where)
	}
	// A new tutorial's broker listens where nothing has yet, as a
	// reader's new terminal would: twice under load the last tutorial's
	// address was still held when the next one's broker came to bind it.
	s.address = ""
	for _, command := range s.commands("setup", lines, where) {
		switch {
		case strings.HasPrefix(command, "export "):
			s.export(strings.TrimPrefix(command, "export "))
		case strings.HasPrefix(command, "unset "):
			os.Unsetenv(strings.TrimPrefix(command, "unset "))
		case strings.HasPrefix(command, "rm -f "):
			name := strings.TrimPrefix(command, "rm -f ")
			if strings.ContainsAny(name, "/*") {
				s.t.Fatalf("%s: rm -f takes a file of this folder", where)
			}
			os.Remove(filepath.Join(s.dir, name))
		default:
			s.t.Fatalf("%s: a setup block may export, unset and rm -f, "+
				"not %q", where, command)
		}
	}
}

// ensure starts a server with the defaults if no block has.
func (s *docServer) ensure() {
	if s.stop == nil {
		s.start(nil, nil, "default server")
	}
}

// serve restarts the server as the block says and checks its banner.
func (s *docServer) serve(lines []string, where string) {
	command, expected := "", []string{}
	for _, line := range lines {
		switch {
		case strings.HasPrefix(line, "$ export "):
			s.export(strings.TrimPrefix(line, "$ export "))
		case strings.HasPrefix(line, "$ "):
			command = strings.TrimPrefix(line, "$ ")
		default:
			expected = append(expected, line)
		}
	}
	args := words(s.t, command)
	if len(args) > 2 && args[0] == "go" && args[1] == "run" {
		args = append([]string{"popsub"}, args[3:]...)
	}
	if len(args) < 2 || args[0] != "popsub" || args[1] != "serve" {
		s.t.Fatalf("%s: a serve block runs popsub serve, not %q", where,
			command)
	}
	named := flagValue(args, "--addr")
	for i, arg := range args {
		if arg != named {
			args[i] = s.localize(arg)
		}
	}
	if named != "" && named != "127.0.0.1:8080" {
		s.startOther(named, args[2:], expected, where)
		return
	}
	s.start(args[2:], expected, where)
}

// flagValue returns the value after flag in args, or "".
func flagValue(args []string, flag string) string {
	for i, arg := range args {
		if arg == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// startOther starts (or restarts) the broker a doc calls named, beside
// the default one, and checks its banner.
func (s *docServer) startOther(named string, args, expected []string,
	where string) {
	if s.others == nil {
		s.others = map[string]*otherServer{}
	}
	real := keptAddress(s.t)
	if old := s.others[named]; old != nil {
		real = old.address
		s.stopOther(named, where)
	}
	for i, arg := range args {
		if arg == named {
			args[i] = real
		}
	}
	all := append(docServeArgs(), args...)
	banner, stop := startServeLines(s.t, all)
	other := &otherServer{stop: stop}
	for _, line := range banner {
		if rest, ok := strings.CutPrefix(line,
			"popsub listening on http://"); ok {
			other.address = strings.Fields(rest)[0]
		}
	}
	s.others[named] = other
	s.match(where+": popsub serve", expected, banner)
}

// stopNamed stops the broker whose address the block names.
func (s *docServer) stopNamed(lines []string, where string) {
	text := strings.Join(lines, "\n")
	for named := range s.others {
		if strings.Contains(text, named) {
			s.stopOther(named, where)
			return
		}
	}
	if strings.Contains(text, "127.0.0.1:8080") && s.stop != nil {
		if err := s.stop(); err != nil {
			s.t.Fatalf("%s: stopping 127.0.0.1:8080: %v", where, err)
		}
		s.stop = nil
		return
	}
	s.t.Fatalf("%s: a stop block names a running broker's address", where)
}

// startNATS runs a "sh nats" block: go install, then nats-server.
func (s *docServer) startNATS(lines []string, where string) {
	for _, command := range s.commands("nats", lines, where) {
		switch {
		case command == "go install github.com/nats-io/nats-server/v2":
			s.installNATS(where)
		case strings.HasPrefix(command, "nats-server "):
			s.runNATS(words(s.t, command)[1:], where)
		default:
			s.t.Fatalf("%s: a nats block installs and runs nats-server, "+
				"not %q", where, command)
		}
	}
}

// repository is the module's folder, found before a test changes folder.
var repository, _ = filepath.Abs("../..")

// installNATS builds nats-server as the reader does, from this module.
func (s *docServer) installNATS(where string) {
	s.natsBin = s.t.TempDir()
	install := exec.Command("go", "install",
		"github.com/nats-io/nats-server/v2")
	install.Dir = repository
	install.Env = append(os.Environ(), "GOBIN="+s.natsBin)
	if out, err := install.CombinedOutput(); err != nil {
		s.t.Fatalf("%s: go install nats-server: %v\n%s", where, err, out)
	}
}

// runNATS starts nats-server with args, on a free port, in the file's
// folder, and waits until it takes clients.
func (s *docServer) runNATS(args []string, where string) {
	if s.natsBin == "" {
		s.t.Fatalf("%s: nats-server runs after go install", where)
	}
	// A kept address: no other test here, restarting, takes its port.
	s.nats = keptAddress(s.t)
	_, port, _ := strings.Cut(s.nats, ":")
	for i, arg := range args {
		if arg == "4222" {
			args[i] = port
		}
	}
	server := exec.Command(filepath.Join(s.natsBin, "nats-server"), args...)
	server.Dir = s.dir
	if err := server.Start(); err != nil {
		s.t.Fatalf("%s: nats-server: %v", where, err)
	}
	s.t.Cleanup(func() {
		server.Process.Kill()
		server.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		conn, err := net.Dial("tcp", s.nats)
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: nats-server not listening on %s", where, s.nats)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// start runs serve with args on a free port, in the file's folder.
func (s *docServer) start(args, expected []string, where string) {
	if s.stop != nil {
		err := s.stop()
		s.stop = nil
		if err != nil {
			s.t.Fatalf("%s: stopping the last server: %v", where, err)
		}
	}
	s.endSession()
	all := append(docServeArgs(), args...)
	all = append(all, "--addr", cmp.Or(s.address, keptAddress(s.t)))
	banner, stop := startServeLines(s.t, all)
	s.stop = stop
	s.address, s.token = "", ""
	socket := "ws://"
	for _, line := range banner {
		rest, ok := strings.CutPrefix(line, "popsub listening on ")
		if ok {
			scheme, address, _ := strings.Cut(strings.Fields(rest)[0], "://")
			s.address = address
			socket = strings.Replace(scheme, "http", "ws", 1) + "://"
		}
		if _, token, ok := strings.Cut(line, "#token="); ok {
			s.token = token
		}
	}
	os.Setenv("POPSUB_URL", socket+s.address)
	if s.token != "" {
		os.Setenv("POPSUB_TOKEN", s.token)
	}
	if expected != nil {
		s.match(where+": popsub serve", expected, banner)
	}
}

// docServeArgs open every serve the docs run. The logs are quiet: a doc
// shows what a client sees. (A login's 600,000-round hash, 1.7 s under
// the race detector here, needs no longer auth timeout: the broker stops
// the clock while it hashes.)
func docServeArgs() []string {
	return []string{"serve", "--log-level", "error"}
}

// startServeLines runs serve and returns the lines it printed before it
// was ready, and a func that stops it. An address in use is tried again
// for a second: on a machine running other packages' tests, something
// held a port for a moment that nothing held when the test looked, just
// after serve was refused it.
func startServeLines(t *testing.T, args []string) ([]string, func() error) {
	for try := 1; ; try++ {
		banner, stop, inUse := tryServeLines(t, args)
		if !inUse {
			return banner, stop
		}
		if try == 6 {
			t.Fatalf("serve %v: the address stayed in use", args)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tryServeLines is startServeLines' one try; inUse reports that serve
// found its address in use, and printed nothing.
func tryServeLines(t *testing.T, args []string) ([]string, func() error,
	bool) {
	ctx, cancel := context.WithCancel(context.Background())
	out, in := io.Pipe()
	result := make(chan error, 1)
	var logs logbuf.Buffer // --log-level error: what went wrong, and stacks
	go func() {
		result <- run(ctx, args, in, &logs)
		in.Close()
	}()

	// The banner is two lines, the address and the playground's link, or
	// five when serve made its own secret and ends on a "try:" line.
	var banner []string
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		banner = append(banner, lines.Text())
		random := len(banner) > 1 && strings.HasPrefix(banner[1], "no secret")
		if strings.HasPrefix(lines.Text(), "try: ") || (!random &&
			strings.HasPrefix(lines.Text(), "open the playground")) {
			break
		}
	}
	go io.Copy(io.Discard, out)
	if len(banner) == 0 {
		cancel()
		err := <-result
		if held := holders(err); held != "" {
			t.Logf("serve %v: %v%s", args, err, held)
			return nil, nil, true
		}
		t.Fatalf("serve %v printed nothing: %v", args, err)
	}
	// stop may be called again (a test that failed between a stop and
	// the next start): it returns what the first call did, rather than
	// wait for ever for a result already taken.
	stop := sync.OnceValue(func() error {
		cancel()
		if err := <-result; err != nil {
			return fmt.Errorf("%w; serve logged:\n%s", err, logs.String())
		}
		return nil
	})
	t.Cleanup(func() { cancel() })
	return banner, stop, false
}

// holders lists, for an address in use, the sockets on its port (ss
// -tanp), so that a failure says who held it; "" for any other error.
func holders(err error) string {
	m := regexp.MustCompile(`listen on [0-9.]+:(\d+): .*in use`).
		FindStringSubmatch(fmt.Sprint(err))
	if m == nil {
		return ""
	}
	out, _ := exec.Command("ss", "-tanp", "sport = :"+m[1]).CombinedOutput()
	return "\nsockets on port " + m[1] + ":\n" + string(out)
}

// export sets NAME=value for the commands that follow. A value with "…"
// in it is a token the reader copies from serve's output.
func (s *docServer) export(assignment string) {
	name, value, _ := strings.Cut(assignment, "=")
	if strings.Contains(value, "…") && name == "POPSUB_TOKEN" {
		value = s.token
	}
	if inner, ok := strings.CutPrefix(value, "$("); ok {
		out, err := s.output(strings.TrimSuffix(inner, ")"))
		if err != nil {
			s.t.Fatalf("$ export %s: %v", assignment, err)
		}
		value = strings.TrimSpace(out)
	}
	s.t.Setenv(name, strings.Trim(value, `'"`))
	if s.tutorial {
		// One terminal for every tutorial: what one exports, the next
		// one still has, unless its setup says otherwise.
		os.Setenv(name, strings.Trim(value, `'"`))
	}
}

// shell runs each $ popsub command and compares what it printed.
func (s *docServer) shell(lines []string, where string) {
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.HasPrefix(line, "$ export ") {
			s.export(strings.TrimPrefix(line, "$ export "))
			continue
		}
		if !strings.HasPrefix(line, "$ ") {
			s.t.Fatalf("%s: expected a $ command, got %q", where, line)
		}
		var expected []string
		for i+1 < len(lines) && !strings.HasPrefix(lines[i+1], "$ ") {
			i++
			expected = append(expected, lines[i])
		}
		s.command(strings.TrimPrefix(line, "$ "), expected, where)
	}
}

// command runs one popsub command line and compares what it printed,
// with its error, if any, as popsub's main prints it.
func (s *docServer) command(line string, expected []string, where string) {
	out, err := s.output(line)
	if err != nil {
		out += "popsub: " + err.Error() + "\n"
		// go run says so too, after the program's own words.
		if strings.HasPrefix(line, "go run ") {
			out += "exit status 1\n"
		}
	}
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if out == "" {
		got = nil
	}
	s.match(where+": $ "+line, expected, got)
}

// output runs a command line and returns what it printed: a popsub
// command in this process, anything else in bash.
func (s *docServer) output(line string) (string, error) {
	line = s.localize(line)
	args := words(s.t, line)
	if len(args) > 2 && args[0] == "go" && args[1] == "run" &&
		args[2] == "./cmd/popsub" {
		args = append([]string{"popsub"}, args[3:]...)
	}
	if len(args) == 0 || args[0] != "popsub" {
		return s.bash(line), nil
	}
	for i, arg := range args {
		if name, ok := strings.CutPrefix(arg, "$"); ok &&
			regexp.MustCompile(`^[A-Z_]+$`).MatchString(name) {
			args[i] = os.Getenv(name)
		}
	}
	// The reader's terminal shows both streams, one after the other.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var terminal bytes.Buffer
	err := run(ctx, args[1:], &terminal, &terminal)
	return terminal.String(), err
}

// bash runs a command line that is not popsub's in the tutorial's
// folder, with the variables exported so far, and returns what it
// printed on both streams. Its exit status is not checked: curl
// --max-time ends with one, and a command that went wrong prints
// something other than what the doc shows.
func (s *docServer) bash(line string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	command := exec.CommandContext(ctx, "bash", "-c", line)
	command.Dir = s.dir
	out, _ := command.CombinedOutput()
	return string(out)
}

// browse runs a "browser" block's steps in Chromium: a page the reader
// opens, types into, clicks and reads. One browser serves the file, so
// a block may go on with the page the one before opened.
func (s *docServer) browse(lines []string, where string) {
	if s.page == nil {
		// A self-signed certificate is the tutorial's, and the reader
		// accepts it with a click; Chromium is told to, up front.
		s.page, _ = startBrowser(s.t, browser(s.t),
			chromedp.Flag("ignore-certificate-errors", true))
	}
	step := regexp.MustCompile(`^(open|type|click|see) ` +
		`(?:"([^"]*)"(?: (?:into|in) (\S+))?|(\S+))$`)
	for _, line := range lines {
		line = os.ExpandEnv(s.localize(strings.TrimSpace(line)))
		m := step.FindStringSubmatch(line)
		if m == nil {
			s.t.Fatalf("%s: a browser step is open URL, type \"TEXT\" "+
				"into SELECTOR, click \"LABEL\" or see \"TEXT\" in "+
				"SELECTOR, not %q", where, line)
		}
		what := where + ": " + line
		switch verb, text, selector := m[1], m[2], m[3]; verb {
		case "open":
			do(s.t, s.page, what, chromedp.Navigate(m[4]))
		case "type":
			until(s.t, s.page, what, exists(selector))
			do(s.t, s.page, what, chromedp.SendKeys(css(selector), text))
		case "click":
			until(s.t, s.page, what, fmt.Sprintf(`(() => {
				const b = [...document.querySelectorAll("button")]
					.find((b) => b.textContent.trim() === %q);
				if (b) b.click();
				return !!b;
			})()`, text))
		case "see":
			until(s.t, s.page, what, contains(selector, text))
		}
	}
}

// match compares printed lines with the expected ones, "…" matching
// anything.
func (s *docServer) match(what string, expected, got []string) {
	s.t.Helper()
	if len(expected) != len(got) {
		s.t.Errorf("%s printed %d lines, the doc shows %d:\n%s", what,
			len(got), len(expected), strings.Join(got, "\n"))
		return
	}
	for i, want := range expected {
		want = s.localize(want)
		// A line of JSON, or a frame the demo prints after an arrow, is
		// compared as JSON.
		var wantJSON, gotJSON any
		arrow, wantBody, _ := strings.Cut(want, "{")
		gotArrow, gotBody, _ := strings.Cut(got[i], "{")
		if arrow == gotArrow && json.Unmarshal([]byte("{"+wantBody),
			&wantJSON) == nil && json.Unmarshal([]byte("{"+gotBody),
			&gotJSON) == nil {
			if !transcript.Match("", wantJSON, gotJSON, s.tutorial) {
				s.t.Errorf("%s printed\n  %s\nwhere the doc shows\n  %s",
					what, got[i], want)
			}
			continue
		}
		if !wildcard(want).MatchString(got[i]) {
			s.t.Errorf("%s printed\n  %s\nwhere the doc shows\n  %s", what,
				got[i], want)
		}
	}
}

// wildcard compiles a line where "…" matches anything.
func wildcard(line string) *regexp.Regexp {
	parts := strings.Split(line, "…")
	for i, part := range parts {
		parts[i] = regexp.QuoteMeta(part)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$")
}

// words splits a command line as a shell would, for single and double
// quotes without escapes inside.
func words(t *testing.T, line string) []string {
	var list []string
	var word strings.Builder
	quote, inWord := rune(0), false
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			word.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ':
			if inWord {
				list = append(list, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if inWord {
		list = append(list, word.String())
	}
	return list
}

// frames plays a block of named clients through popsub client frames's
// own code, on the file's session: a line that does not go as written
// fails the test, and so does a frame that an open connection received
// and no line of the block shows.
func (s *docServer) frames(lines []string, where string) {
	if s.session == nil {
		s.session = transcript.NewSession("ws://"+s.address+"/ws",
			s.tokenFor, io.Discard)
		s.session.Strict = s.tutorial
		s.session.Observe = func(client string, fromClient bool,
			frame []byte) {
			docFrames.Add(s.block, client, fromClient, frame)
		}
	}
	s.block = s.name + ", " + where
	ctx := context.Background()
	start := s.session.LineNumber()
	for _, line := range lines {
		if err := s.session.Run(ctx, line); err != nil {
			s.t.Errorf("%s, its line %d: %v", where, s.session.LineNumber()-start,
				err)
		}
	}
	for _, unlisted := range s.session.Barrier(ctx) {
		s.t.Errorf("%s: the block does not show %s", where, unlisted)
	}
}

// endSession closes the clients of the last broker's session.
func (s *docServer) endSession() {
	if s.session != nil {
		s.session.Close()
		s.session = nil
	}
}

// tokenFor is a token for the named client. In a tutorial it is the
// one its setup exported under the client's name in capitals (ALICE),
// and there is none if it exported none; without a secret, the one serve
// printed. Elsewhere a token is signed for the name when the secret is
// known.
func (s *docServer) tokenFor(name string) (string, error) {
	secret := os.Getenv("POPSUB_SECRET")
	// A reader who exported a secret exported each client's token too:
	// a client the tutorial never gave one has none.
	if s.tutorial && secret != "" {
		return tokenOf(name, "")
	}
	if secret == "" {
		return tokenOf(name, s.token)
	}
	claims := popsub.Claims{Subscribe: []string{"#", "$sys/#", "$dead/#"}}
	claims.Subject = name
	claims.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Hour))
	return claims.Sign([]byte(secret))
}

// TestDocs_ServedAsPagesWhoseLinksResolve fetches every page serve shows
// under /docs/, as a browser would, and follows every link and picture in
// it that stays on the broker: each must answer, and each #fragment must
// name an id on the page it leads to.
func TestDocs_ServedAsPagesWhoseLinksResolve(t *testing.T) {
	url, _, _ := startServe(t)
	base := "http" + strings.TrimPrefix(url, "ws")
	fetch := func(path string) (string, string) {
		t.Helper()
		request, _ := http.NewRequest("GET", base+path, nil)
		request.Header.Set("Accept-Encoding", "gzip")
		response, err := http.DefaultTransport.RoundTrip(request)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer response.Body.Close()
		body := io.Reader(response.Body)
		if response.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(response.Body)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			body = zr
		}
		data, _ := io.ReadAll(body)
		if response.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, response.Status)
		}
		return response.Header.Get("Content-Type"), string(data)
	}
	index, _ := fetch("/docs/")
	if !strings.HasPrefix(index, "text/html") {
		t.Fatalf("/docs/ is %s, want HTML", index)
	}
	_, list := fetch("/docs/")
	pages := regexp.MustCompile(`href="(/docs/[^"#]+)"`).FindAllStringSubmatch(
		list, -1)
	if len(pages) < 10 {
		t.Fatalf("/docs/ lists %d pages:\n%s", len(pages), list)
	}
	// A link on the broker, or within the page itself (#id).
	link := regexp.MustCompile(`(?:href|src)="(/[^"]*|#[^"]*)"`)
	seen := map[string]string{}
	for _, page := range pages {
		kind, body := fetch(page[1])
		if !strings.HasPrefix(kind, "text/html") ||
			!strings.Contains(body, "<h1") {
			t.Errorf("%s is %s without a heading, want a page", page[1], kind)
		}
		seen[page[1]] = body
		for _, m := range link.FindAllStringSubmatch(body, -1) {
			path, fragment, _ := strings.Cut(m[1], "#")
			if path == "" {
				path = page[1]
			}
			if _, ok := seen[path]; !ok {
				_, seen[path] = fetch(path)
			}
			if fragment != "" && !strings.Contains(seen[path],
				`id="`+fragment+`"`) {
				t.Errorf("%s links to %s, which has no id %q", page[1], m[1],
					fragment)
			}
		}
	}
	if _, ok := seen["/source"]; !ok {
		t.Error("no page links to the source")
	}
}
