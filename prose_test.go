package popsub

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/popsub/popsub/queue"
)

// These tests hold the numbers the docs and popsub.go's comments say of
// the code to the constants they name: a number in prose went stale the
// day the seq reservation's block doubled, and a reader checking the
// docs against a crash saw a jump twice as large as promised.

// thousands writes n as the docs do: 16,384.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// numberIn reads a number as the docs write it, commas and all.
func numberIn(text string) int {
	n, _ := strconv.Atoi(strings.ReplaceAll(text, ",", ""))
	return n
}

// The seq reservation: the block a topic reserves, the seqs left when it
// asks for the next, and the seq a crash right after a new topic's first
// delivery jumps to.
func TestProse_TheReservationBlockIsTheCodes(t *testing.T) {
	checks := []struct {
		pattern string
		want    int
	}{
		{`blocks? of ([0-9][0-9,]*)`, reserveBlock},
		{`by up to ([0-9][0-9,]*)`, reserveBlock},
		{`while ([0-9][0-9,]*) are left`, reserveAhead},
		{`next seq is ([0-9][0-9,]*)`, reserveBlock + 1},
		{`seq ([0-9][0-9,]*) after seq 1`, reserveBlock + 1},
	}
	found := 0
	for _, path := range []string{"popsub.go", "README.md",
		"docs/protocol.md", "docs/3-replay-and-resume.md",
		"docs/6-where-popsub-stops.md", "docs/reliability.md"} {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		flat := prose(string(text))
		for _, c := range checks {
			for _, m := range regexp.MustCompile(c.pattern).
				FindAllStringSubmatch(flat, -1) {
				found++
				if numberIn(m[1]) != c.want {
					t.Errorf("%s says %q; the code makes it %s", path, m[0],
						thousands(c.want))
				}
			}
		}
	}
	if found < 6 {
		t.Fatalf("found %d mentions of the reservation: the search is "+
			"broken", found)
	}
}

// QoS 0's crash window: what popsub.go's log section and protocol.md say
// a batch nobody waits for waits, what tutorial 9 says a crash may cost
// a group's cursor, and what docs/compare's NATS setup of the same
// durability syncs at, is commitLinger.
func TestProse_TheCrashWindowIsTheCodes(t *testing.T) {
	ms := commitLinger.Milliseconds()
	said := fmt.Sprintf("waits up to %d ms for company", ms)
	for _, c := range []struct{ path, want string }{
		{"popsub.go", said},
		{"docs/protocol.md", said},
		{"docs/9-work-queues.md", fmt.Sprintf("the acks of the last %d ms",
			ms)},
		{"docs/compare/run.go", fmt.Sprintf("synced every %d ms", ms)},
		{"docs/compare/run.go", fmt.Sprintf(`"sync=%dms"`, ms)},
	} {
		text, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(prose(string(text)), c.want) {
			t.Errorf("%s does not say %q", c.path, c.want)
		}
	}
}

// The package doc's list of goroutines, and performance.md, give the
// writers' goroutines the broker keeps as queue.Workers keeps them.
func TestProse_TheKeptWritersAreTheCodes(t *testing.T) {
	if queue.WorkerIdle != time.Second {
		t.Fatalf("queue.WorkerIdle is %v: say it in the prose below",
			queue.WorkerIdle)
	}
	for path, want := range map[string]string{
		"popsub.go": fmt.Sprintf("up to %d writers' goroutines kept a "+
			"second", queue.MaxIdleWorkers),
		"queue/workers.go": fmt.Sprintf("keeps %d stacks",
			queue.MaxIdleWorkers),
	} {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(prose(string(text)), want) {
			t.Errorf("%s does not say %q", path, want)
		}
	}
}

// lasting writes a duration as the docs do: 5 s, 1 h, or an hour.
func lasting(d time.Duration) []string {
	switch {
	case d%time.Hour == 0:
		return []string{fmt.Sprintf("%d h", d/time.Hour), "an hour"}
	case d%time.Minute == 0:
		return []string{fmt.Sprintf("%d min", d/time.Minute), "a minute"}
	}
	return []string{fmt.Sprintf("%d s", d/time.Second)}
}

// size writes bytes as the docs do: 4 MiB.
func size(n int) []string {
	return []string{fmt.Sprintf("%d MiB", n>>20)}
}

// defaultsInProse are the defaults the docs name beside each flag, made
// from the constants: any of a flag's forms may stand in the text.
var defaultsInProse = map[string][]string{
	"ack-timeout":     lasting(DefaultAckTimeout),
	"max-retries":     {thousands(DefaultMaxRetries)},
	"max-messages":    {thousands(DefaultMaxMessages)},
	"ttl":             lasting(DefaultTTL),
	"max-frame":       size(DefaultMaxFrameBytes),
	"outbox-bytes":    size(DefaultOutboxBytes),
	"max-inflight":    {thousands(DefaultMaxInflight)},
	"group-window":    {thousands(DefaultGroupWindow)},
	"write-timeout":   lasting(DefaultWriteTimeout),
	"ping-interval":   lasting(DefaultPingInterval),
	"auth-timeout":    lasting(DefaultAuthTimeout),
	"max-delayed":     {thousands(DefaultMaxDelayed)},
	"max-topics":      {thousands(DefaultMaxTopics)},
	"max-retry-delay": lasting(DefaultMaxRetryDelay),
}

// Every "`--flag` (default X" in protocol.md, and every row of
// security.md's table of limits that names a flag, gives the default
// the code has.
func TestProse_TheDefaultsAreTheCodes(t *testing.T) {
	said := func(text string, forms []string) bool {
		for _, form := range forms {
			if strings.Contains(text, form) {
				return true
			}
		}
		return false
	}
	checked := 0
	protocol, err := os.ReadFile("docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	flat := prose(string(protocol))
	mention := regexp.MustCompile("`--([a-z-]+)`[^.;|]{0,30}?\\(default " +
		"([^;)]*)|`--([a-z-]+)`, ([^)]*) by default")
	for _, m := range mention.FindAllStringSubmatch(flat, -1) {
		flag, value := m[1]+m[3], m[2]+m[4]
		if forms, ok := defaultsInProse[flag]; ok {
			checked++
			if !said(value, forms) {
				t.Errorf("protocol.md: --%s's default is %q; the code's is %s",
					flag, value, forms[0])
			}
		}
	}
	security, err := os.ReadFile("docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	flagIn := regexp.MustCompile("`--([a-z-]+)`")
	for line := range strings.Lines(string(security)) {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		for _, m := range flagIn.FindAllStringSubmatch(cells[1], 1) {
			if forms, ok := defaultsInProse[m[1]]; ok {
				checked++
				if !said(cells[2], forms) {
					t.Errorf("security.md: --%s's default is %q; the code's "+
						"is %s", m[1], strings.TrimSpace(cells[2]), forms[0])
				}
			}
		}
	}
	if checked < 15 {
		t.Fatalf("checked %d defaults: the search is broken", checked)
	}
	t.Logf("%d defaults named in the docs, each the code's", checked)
}

// The README says what PopSub is before it says how fast: no figure
// above its two commands, and its figures in one short section, each a
// claim with the command that measures it again and a link to the page
// that gives the whole table.
func TestProse_TheReadmeSaysWhatBeforeHowFast(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	first, _, found := strings.Cut(text, "\n## Two commands\n")
	if !found {
		t.Fatal(`the README has no "## Two commands" section`)
	}
	quantity := regexp.MustCompile(`\d[\d,.–]*\s?(×|%|µs|ms|s\b|KiB|MiB|` +
		`GiB|KB|MB|lines|hours|minutes|seconds|messages|times)`)
	if figure := quantity.FindString(first); figure != "" {
		t.Errorf("a figure above the two commands: %q", figure)
	}

	_, figures, found := strings.Cut(text, "\n## Figures\n")
	if !found {
		t.Fatal(`the README has no "## Figures" section`)
	}
	figures, _, _ = strings.Cut(figures, "\n## ")
	lines := 0
	for line := range strings.Lines(strings.TrimSpace(figures)) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		lines++
		if strings.HasPrefix(line, "- ") && (!strings.Contains(line, "`") ||
			!strings.Contains(line, "](")) {
			t.Errorf("a figure without its command or its page: %q", line)
		}
	}
	if lines > 10 {
		t.Errorf("Figures is %d lines, want at most 10", lines)
	}
}

// docs/performance.md is a page a user reads in ten minutes: the method,
// today's figures against each peer, how to rerun them, what each
// mechanism buys and what was not kept. The history is git log.
func TestProse_ThePerformancePageKeepsItsBudget(t *testing.T) {
	page, err := os.ReadFile("docs/performance.md")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(page), "\n"); lines > 400 {
		t.Errorf("docs/performance.md is %d lines, want at most 400", lines)
	}
	for _, section := range []string{"## The method", "### Throughput",
		"### Latency", "### Memory", "### Durability", "## How to rerun",
		"## What each speed mechanism buys", "## What was tried and not kept"} {
		if !strings.Contains(string(page), "\n"+section) {
			t.Errorf("docs/performance.md lacks %q", section)
		}
	}
}

// A reader looks for a section's tests in popsub_test.go's table: every
// section of popsub.go is in it, or in its list of sections with no
// behaviour of their own, and every file it names has tests.
func TestSections_EachHasItsTests(t *testing.T) {
	code, err := os.ReadFile("popsub.go")
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("popsub_test.go")
	if err != nil {
		t.Fatal(err)
	}
	header, _, _ := strings.Cut(string(tests), "\nfunc ")
	rows := map[string][]string{}
	for line := range strings.Lines(header) {
		row := strings.TrimPrefix(line, "//\t")
		if row == line || strings.HasPrefix(row, "section ") {
			continue
		}
		name, files, _ := strings.Cut(row, "  ")
		rows[name] = strings.Fields(files)
	}
	_, untested, _ := strings.Cut(header, "The package doc's own sections")
	untested = strings.Join(strings.Fields(untested), " ")

	sections := regexp.MustCompile(`(?m)^// # (.+?)( \(detail\))?$`)
	for _, m := range sections.FindAllStringSubmatch(string(code), -1) {
		name := m[1]
		files, listed := rows[name]
		switch {
		case !listed && !strings.Contains(untested, name):
			t.Errorf("section %q is not in popsub_test.go's table", name)
		case listed && len(files) == 0:
			t.Errorf("section %q names no test file", name)
		}
		for _, file := range files {
			src, err := os.ReadFile(file)
			if err != nil || !strings.Contains(string(src), "\nfunc Test") &&
				!strings.Contains(string(src), "\nfunc Example") {
				t.Errorf("section %q names %s, which has no tests (%v)",
					name, file, err)
			}
		}
	}
}
