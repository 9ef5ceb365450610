package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/playground"
)

// browser finds Chromium. Without one the test is skipped on a developer
// machine, and fails under CI=true, where .ci/run installs it.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser",
		"google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium on PATH; .ci/run installs it with apt-get")
	}
	t.Skip("no Chromium on PATH (apt-get install -y chromium)")
	return ""
}

// screenshotPath is where the test saves a picture: over the README's
// docs/name when POPSUB_UPDATE_SCREENSHOT=1, else a temp file.
func screenshotPath(t *testing.T, name string) string {
	if os.Getenv("POPSUB_UPDATE_SCREENSHOT") == "1" {
		return filepath.Join("..", "..", "docs", name)
	}
	return filepath.Join(t.TempDir(), name)
}

// playgroundURL starts serve with a known secret and extra flags, and
// returns the page's address with a token in its fragment, the address
// alone, and serve's stop.
func playgroundURL(t *testing.T, secret string, extra ...string) (string,
	string, func() error) {
	t.Helper()
	wsURL, _, stop := startServe(t, append([]string{"--secret", secret},
		extra...)...)
	address := strings.TrimPrefix(wsURL, "ws://")
	token, err := localClaims().Sign([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return "http://" + address + "/#token=" + token, address, stop
}

// do runs browser actions, failing the test with what was being done.
func do(t *testing.T, ctx context.Context, what string,
	actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// until waits for a JavaScript condition to hold.
func until(t *testing.T, ctx context.Context, what, condition string) {
	t.Helper()
	// Two minutes, not chromedp's thirty seconds: a lab scenario that
	// runs five seconds took more than thirty in Chromium on a 2-core
	// machine busy with the other packages' race tests and two busy loops.
	wait := []chromedp.PollOption{
		chromedp.WithPollingInterval(50 * time.Millisecond),
		chromedp.WithPollingTimeout(2 * time.Minute)}
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](condition, wait...))
	// A page that replaces its document as the poll starts (a navigation
	// still settling) takes the poll's context with it: poll again in
	// the new one.
	for retries := 0; err != nil && retries < 3 && strings.Contains(
		err.Error(), "Cannot find context with specified id"); retries++ {
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](condition, wait...))
	}
	if err != nil {
		// What the panels and the diagram's detail said is most often
		// why.
		notes, _ := chromedp.Run(ctx, chromedp.Evaluate[string](
			`[...document.querySelectorAll(".note, #picture-detail")].map(n => n.id + ": " +
			n.textContent).join("\n")`))
		t.Fatalf("%s (%s): %v\nthe notes:\n%s", what, condition, err, notes)
	}
}

// exists is a condition: an element matches selector.
func exists(selector string) string {
	return fmt.Sprintf("document.querySelector(%q) !== null", selector)
}

// contains is a condition: the element's text has text in it.
func contains(selector, text string) string {
	return fmt.Sprintf("(document.querySelector(%q)?.textContent ?? '')"+
		".includes(%q)", selector, text)
}

// The guided run, followed by its own buttons, end to end: each step is
// marked done from the broker's events, the diagram shows Alice's
// attempt 2 and her dead letter, the rows say what the broker said, the
// layout holds at a laptop's and a phone's size, and a reload keeps the
// dead letter.
func TestPlayground_GuidedRun(t *testing.T) {
	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2),
		"--ack-timeout", "400ms", "--max-retries", "1")
	ctx, problems := startBrowser(t, chromium)

	openPlayground(t, ctx, page, 1366, 900)

	do(t, ctx, "step 1", chromedp.Click(css("#step-1-do")))
	until(t, ctx, "step 1 is done", exists(`#step-1[data-state="done"]`))
	until(t, ctx, "both acked", `document.querySelectorAll(`+
		`'#alice-messages li[data-state="acked"], `+
		`#bob-messages li[data-state="acked"]').length === 2`)

	do(t, ctx, "step 2", chromedp.Click(css("#step-2-do")))
	until(t, ctx, "step 2 is done", exists(`#step-2[data-state="done"]`))
	until(t, ctx, "step 3: attempt 2 for alice in the diagram",
		exists(`#diagram g.retry[data-lane="alice"][data-attempt="2"]`))
	until(t, ctx, "step 3 is done", exists(`#step-3[data-state="done"]`))

	until(t, ctx, "step 4: alice's dead letter in the diagram",
		exists(`#diagram g.dead[data-lane="alice"]`))
	until(t, ctx, "step 4 is done", exists(`#step-4[data-state="done"]`))
	until(t, ctx, "the dead-letter table names alice",
		exists(`#xray-dead tr[data-who="alice"]`))
	until(t, ctx, "alice's row says dead-lettered, with no ack to press",
		exists(`#alice-messages li[data-state="dead-lettered"] button.ack:disabled`))
	until(t, ctx, "bob's row of the same message says acked",
		`[...document.querySelectorAll('#bob-messages li')].filter(li =>`+
			` li.dataset.state === 'acked').length === 2`)
	until(t, ctx, "bob's ack in the diagram",
		exists(`#diagram g.step[data-kind="ack"][data-lane="bob"]`))
	// A retry goes only to whoever has not acked: none to Bob once he
	// has acked the message. One before his ack is the broker's due, on
	// a machine so loaded that his ack took longer than the ack timeout.
	if exists, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		const acked = new Set();
		for (const g of document.querySelectorAll(
			'#diagram g.step[data-lane="bob"]')) {
			const key = g.dataset.topic + "#" + g.dataset.seq;
			if (g.dataset.kind === "ack") acked.add(key);
			if (g.dataset.kind === "retry" && acked.has(key)) return true;
		}
		return false;
	})()`)); exists {
		t.Fatal("the diagram shows a retry to bob after he acked")
	}
	inView(t, ctx)
	shoot(t, ctx, "playground.png")

	// The keyboard: a skip link leads to Carol, whose publish is a few
	// tab stops further.
	stops, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`(() => {
		const all = [...document.querySelectorAll('a[href], button:not([disabled]),' +
			' input, select, textarea, summary')].filter(e => e.offsetParent !== null);
		const carol = all.indexOf(document.querySelector('a[href="#carol"]'));
		const from = all.findIndex(e => document.getElementById("carol").contains(e));
		const publish = all.indexOf(document.getElementById("carol-publish"));
		return [carol, publish - from, publish];
	})()`))
	if err != nil || stops[0] < 0 || stops[1] > 10 {
		t.Fatalf("tab stops: skip link at %v (%v)", stops, err)
	}
	t.Logf("tab stops to Carol's publish: %d from the top, %d after the "+
		"skip link", stops[2]+1, stops[1]+1)

	// Replay draws the diagram again from its first step.
	steps, err := chromedp.Run(ctx, chromedp.Evaluate[int](
		`document.querySelectorAll("#diagram g.step").length`))
	if err != nil || steps < 8 {
		t.Fatalf("the diagram has %d steps (%v)", steps, err)
	}
	do(t, ctx, "replay", chromedp.Click(css("#picture-replay")))
	until(t, ctx, "the replay starts over", fmt.Sprintf(
		`document.querySelectorAll("#diagram g.step").length < %d`, steps/2))
	until(t, ctx, "and ends with every step", fmt.Sprintf(
		`document.querySelectorAll("#diagram g.step").length === %d`, steps))
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s", strings.Join(list, "\n"))
	}

	// A phone: one column, nothing wider than the screen, and every
	// label of the diagram within it, the retry's and the dead letter's
	// to the last lanes too.
	do(t, ctx, "a phone's width", chromedp.EmulateViewport(390, 844))
	until(t, ctx, "no horizontal scroll at 390 px",
		`document.documentElement.scrollWidth <= window.innerWidth`)
	until(t, ctx, "every diagram label within the diagram at 390 px",
		`(() => { const box = document.getElementById("diagram").`+
			`getBoundingClientRect(); return [...document.querySelectorAll(`+
			`"#diagram text.label")].every(l => { const r = `+
			`l.getBoundingClientRect(); return r.width === 0 || `+
			`(r.left >= box.left - 1 && r.right <= box.right + 1); }); })()`)
	shoot(t, ctx, "playground-phone.png")

	// A reload keeps the dead letter, read back from $dead/jobs.
	do(t, ctx, "reload", chromedp.EmulateViewport(1366, 900),
		chromedp.Reload())
	until(t, ctx, "the dead letter is still listed",
		exists(`#xray-dead tr[data-who="alice"]`))

	// Starting over puts the guide back at its first step.
	do(t, ctx, "step 1 again", chromedp.Click(css("#step-1-do")))
	until(t, ctx, "step 1 is done again", exists(`#step-1[data-state="done"]`))
	do(t, ctx, "start over", chromedp.Click(css("#guide-reset")))
	until(t, ctx, "the guide starts over", exists(`#step-1[data-state="current"]`))
	until(t, ctx, "the clients come back", exists(`#bob-subs li[data-topic="jobs"]`))
	until(t, ctx, "carol comes back", exists(`#carol-status[data-state="connected"]`))

	// Enter in a field submits its form.
	do(t, ctx, "enter in carol's payload",
		chromedp.SendKeys(css("#carol-pub-payload"), "\r"))
	until(t, ctx, "carol published with enter", contains("#carol-note", "published jobs"))
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s", strings.Join(list, "\n"))
	}
}

// The work-queue step, by its button: Alice and Bob join one group on
// jobs, Carol's two jobs go one to each, and Alice's, whose ack she
// withholds, moves to Bob as attempt 2, which the diagram, the rows, the
// x-ray and the guide all show.
func TestPlayground_WorkQueue(t *testing.T) {
	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2),
		"--ack-timeout", "400ms")
	ctx, problems := startBrowser(t, chromium)

	openPlayground(t, ctx, page, 1366, 900)
	inView(t, ctx)

	do(t, ctx, "share", chromedp.Click(css("#share-do")))
	for _, name := range []string{"alice", "bob"} {
		until(t, ctx, name+" is a member of workers",
			contains(`#`+name+`-subs`, "group workers"))
	}
	until(t, ctx, "bob's job is acked", exists(
		`#bob-messages li[data-attempt="1"][data-state="acked"]`))
	until(t, ctx, "alice's job moves on", exists(
		`#alice-messages li[data-state="moved-to-another-member"]`))
	until(t, ctx, "and reaches bob as attempt 2", exists(
		`#bob-messages li[data-attempt="2"][data-state="acked"]`))
	until(t, ctx, "the diagram shows the move from alice", exists(
		`#diagram g.move[data-lane="alice"]`))
	until(t, ctx, "and bob's attempt 2", exists(
		`#diagram g.retry[data-lane="bob"][data-attempt="2"]`))
	until(t, ctx, "the guide marks the step done",
		exists(`#share[data-state="done"]`))
	until(t, ctx, "nobody owes an ack",
		contains("#xray-pending-count", "0"))
	if exists, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`document.querySelector('#step-3[data-state="done"]') !== null`)); exists {
		t.Fatal("the guide calls a move alice's retry")
	}

	// Each job went to one member: Alice has one row, Bob two.
	counts, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[
		document.querySelectorAll("#alice-messages li").length,
		document.querySelectorAll("#bob-messages li").length]`))
	if err != nil || len(counts) != 2 || counts[0] != 1 || counts[1] != 2 {
		t.Fatalf("rows: alice and bob have %v (%v), want [1 2]", counts, err)
	}
	if exists, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`document.querySelector('#diagram g.retry[data-lane="alice"]') !== null`)); exists {
		t.Fatal("the diagram shows a retry to alice, whose job moved")
	}
	inView(t, ctx)
	shoot(t, ctx, "playground-work-queue.png")

	// A second run joins a group of its own, which starts with new jobs
	// only: the first group's place in the log is not the second's.
	do(t, ctx, "share again", chromedp.Click(css("#share-do")))
	for _, name := range []string{"alice", "bob"} {
		until(t, ctx, name+" is a member of workers-2",
			contains(`#`+name+`-subs`, "group workers-2"))
	}
	do(t, ctx, "a phone's width", chromedp.EmulateViewport(390, 844))
	until(t, ctx, "no horizontal scroll at 390 px",
		`document.documentElement.scrollWidth <= window.innerWidth`)
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s", strings.Join(list, "\n"))
	}
}

// openPlayground opens page at width×height and waits for the page as
// it starts: the broker reached, Alice and Bob subscribed to jobs by
// themselves, Carol connected.
func openPlayground(t *testing.T, ctx context.Context, page string,
	width, height int64) {
	t.Helper()
	do(t, ctx, "open the page", chromedp.EmulateViewport(width, height),
		chromedp.Navigate(page))
	until(t, ctx, "the broker is reached", exists(`#banner[data-state="up"]`))
	for _, name := range []string{"alice", "bob"} {
		until(t, ctx, name+" connects and subscribes by herself",
			exists(`#`+name+`-subs li[data-topic="jobs"]`))
	}
	until(t, ctx, "carol connects", exists(`#carol-status[data-state="connected"]`))
}

// inView checks that at 1366×900 the clients, the diagram with its
// newest line and the pending acks are on screen together, without
// scrolling.
func inView(t *testing.T, ctx context.Context) {
	t.Helper()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => {
		const box = id => document.getElementById(id).getBoundingClientRect();
		const h = window.innerHeight;
		const steps = document.querySelectorAll("#diagram g.step");
		const newest = steps.length === 0 ? null :
			steps[steps.length - 1].getBoundingClientRect();
		return box("carol").bottom <= h && box("diagram-box").top < h - 200 &&
			box("xray-pending").top < h - 150 && window.scrollY === 0 &&
			(newest === null || newest.bottom <= h &&
				newest.bottom <= box("diagram-box").bottom + 1);
	})()`))
	if err != nil || !ok {
		t.Fatalf("at 1366×900 the clients, the diagram and the pending "+
			"acks are not all in view (%v)", err)
	}
}

// shoot saves a screenshot of the viewport.
func shoot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	until(t, ctx, "the animations end", "document.getAnimations()"+
		".every(a => a.playState !== 'running')")
	shot, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(screenshotPath(t, name), shot, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Each connection state says what it is and what to do: no token, a
// refused token, a server going away (1001) and back, a client cut off
// (4008), and a server that is not there at all.
func TestPlayground_SaysWhyItIsNotConnected(t *testing.T) {
	chromium := browser(t)
	secret := strings.Repeat("playground-secret-", 2)
	// The server starts again where it was (keptAddress says why there).
	page, address, stop := playgroundURL(t, secret, "--max-inflight", "1",
		"--addr", keptAddress(t))
	bare, _, _ := strings.Cut(page, "#")
	ctx, _ := startBrowser(t, chromium)

	do(t, ctx, "open without a token", chromedp.Navigate(bare))
	until(t, ctx, "no token, server up",
		contains(`#banner[data-state="no-token"]`, "server is up"))

	other, err := localClaims().Sign([]byte(strings.Repeat("another-", 5)))
	if err != nil {
		t.Fatal(err)
	}
	do(t, ctx, "a token of another secret",
		chromedp.Navigate(bare+"#token="+other))
	until(t, ctx, "the token is refused, and the page points at serve's link",
		contains(`#banner[data-state="refused"]`, "newest link"))

	// Opening serve's link in the same tab changes only the fragment.
	_, fragment, _ := strings.Cut(page, "#")
	_, err = chromedp.Run(ctx, chromedp.Evaluate[string](
		"location.hash = "+fmt.Sprintf("%q", fragment)))
	if err != nil {
		t.Fatalf("the right link: %v", err)
	}
	until(t, ctx, "connected", exists(`#banner[data-state="up"]`))
	until(t, ctx, "bob connects", exists(`#bob-status[data-state="connected"]`))

	// A token pasted into the page replaces the one in use, for the
	// x-ray and every client: a wrong one is refused, the right one
	// brings them back.
	paste := func(token string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
			`document.getElementById("token").value = %q;`+
				`document.getElementById("token-form").requestSubmit(); true`,
			token)))
		if err != nil {
			t.Fatalf("paste a token: %v", err)
		}
	}
	paste(other)
	until(t, ctx, "the pasted token is refused",
		exists(`#banner[data-state="refused"]`))
	for _, name := range []string{"alice", "bob", "carol"} {
		until(t, ctx, name+"'s panel says the token was refused",
			contains("#"+name+"-status", "token refused"))
	}
	token := strings.TrimPrefix(fragment, "token=")
	paste(token)
	until(t, ctx, "the right token connects again",
		exists(`#banner[data-state="up"]`))
	for _, name := range []string{"alice", "bob", "carol"} {
		until(t, ctx, name+" is back with it",
			exists(`#`+name+`-status[data-state="connected"]`))
	}

	// A fresh token for the same user replaces the old one in place:
	// the panels keep their connections.
	fresh := localClaims()
	fresh.ID = "fresh"
	refreshed, err := fresh.Sign([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	paste(refreshed)
	for _, name := range []string{"alice", "bob", "carol"} {
		until(t, ctx, name+" takes it in place",
			contains("#"+name+"-note", "replaced the old one in place"))
	}

	// Bob withholds his acks on a wildcard; with one delivery in flight
	// allowed, Carol's second message finds no room, and a wildcard has
	// no log to fall back on: 4008. He reconnects by himself.
	do(t, ctx, "bob on a wildcard, withholding",
		chromedp.SetValue(css("#bob-acks"), "withhold"),
		chromedp.SetValue(css("#bob-sub-topic"), "work/#"),
		chromedp.Click(css("#bob-subscribe")))
	until(t, ctx, "bob subscribed", exists(`#bob-subs li[data-topic="work/#"]`))
	do(t, ctx, "carol publishes twice",
		chromedp.SetValue(css("#carol-pub-topic"), "work/a"),
		chromedp.Click(css("#carol-publish")),
		chromedp.Click(css("#carol-publish")))
	until(t, ctx, "bob was cut off with 4008", exists(`#bob[data-last-close="4008"]`))
	until(t, ctx, "bob says so", contains("#bob-note", "4008"))
	until(t, ctx, "bob is back", exists(`#bob-status[data-state="connected"]`))

	// The server stops: 1001, said as such until it is back.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	until(t, ctx, "the page says the server went away",
		exists(`#banner[data-state="going-away"]`))
	until(t, ctx, "so does alice", exists(`#alice[data-last-close="1001"]`))
	startServe(t, "--addr", address, "--secret", secret)
	until(t, ctx, "the page is back", exists(`#banner[data-state="up"]`))
	until(t, ctx, "alice resubscribed by herself",
		exists(`#alice-subs li[data-topic="jobs"]`))
	until(t, ctx, "and says so", contains("#alice-note", "reconnected by itself"))

	// A page whose server is not there.
	lone := httptest.NewServer(playground.Handler(playground.Settings{
		Clients: []string{"alice", "bob", "carol"}}))
	t.Cleanup(lone.Close)
	do(t, ctx, "a page with no broker behind it",
		chromedp.Navigate(lone.URL+"/#"+fragment))
	until(t, ctx, "the server is unreachable",
		contains(`#banner[data-state="unreachable"]`, "Cannot reach"))
}

// The tutorials the guide links to are pages, compressed, and the
// page's own link leads to one.
func TestPlayground_LinksToTheTutorialsAsPages(t *testing.T) {
	wsURL, _, _ := startServe(t)
	base := "http://" + strings.TrimPrefix(wsURL, "ws://")
	request, _ := http.NewRequest("GET", base+"/docs/2-at-least-once", nil)
	request.Header.Set("Accept-Encoding", "gzip")
	response, err := http.DefaultTransport.RoundTrip(request)
	if err != nil {
		t.Fatal(err)
	}
	response.Body.Close()
	if response.StatusCode != 200 ||
		response.Header.Get("Content-Encoding") != "gzip" ||
		!strings.HasPrefix(response.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("tutorial: %s %v", response.Status, response.Header)
	}

	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2))
	ctx, problems := startBrowser(t, chromium)
	do(t, ctx, "open the page", chromedp.Navigate(page))
	until(t, ctx, "the broker is reached", exists(`#banner[data-state="up"]`))
	do(t, ctx, "follow the tutorials link",
		chromedp.Click(css(`header a[href="/docs/1-first-message"]`)),
		chromedp.WaitVisible(css("main h1")))
	until(t, ctx, "tutorial 1 as a page", contains("h1", "First message"))
	until(t, ctx, "with a way back to the playground",
		exists(`nav a[href="/"]`))
	until(t, ctx, "and its links to the next tutorial",
		exists(`main a[href="/docs/2-at-least-once"]`))
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s", strings.Join(list, "\n"))
	}
}

// Step 2 is done only when a panel that withholds its acks owes what
// another acked: an automatic ack still on its way is not it. The race
// is made to happen, three times over: alice's automatic acks wait a
// second and a half, so bob's ack always comes first.
func TestPlayground_StepTwoIsNotAnAckOnItsWay(t *testing.T) {
	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2))
	ctx, _ := startBrowser(t, chromium)
	do(t, ctx, "open the page", chromedp.Navigate(page))
	until(t, ctx, "the broker is reached", exists(`#banner[data-state="up"]`))
	for round := range 3 {
		until(t, ctx, "bob subscribes", exists(`#bob-subs li[data-topic="jobs"]`))
		until(t, ctx, "alice subscribes",
			exists(`#alice-subs li[data-topic="jobs"]`))
		until(t, ctx, "carol connects",
			exists(`#carol-status[data-state="connected"]`))
		_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
			`window.popsubAckDelay = {alice: 1500}; true`))
		if err != nil {
			t.Fatal(err)
		}
		do(t, ctx, "step 1", chromedp.Click(css("#step-1-do")))
		until(t, ctx, "bob acked, alice's ack on its way", `document.querySelector(`+
			`'#bob-messages li[data-state="acked"]') !== null && `+
			`document.querySelector('#alice-messages li[data-state="acked"]') === null`)
		until(t, ctx, "then alice's ack too",
			exists(`#alice-messages li[data-state="acked"]`))
		until(t, ctx, "step 1 is done", exists(`#step-1[data-state="done"]`))
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](
			`document.getElementById("step-2").dataset.state`))
		if err != nil || state == "done" {
			t.Fatalf("round %d: step 2 says %q after step 1 alone (%v)", round,
				state, err)
		}
		do(t, ctx, "start over", chromedp.Click(css("#guide-reset")))
		until(t, ctx, "the guide starts over",
			exists(`#step-1[data-state="current"]`))
	}
}

// A token that may not watch $sys/events gets the clients, and a banner
// that names the grant it lacks and how to make one that has it.
func TestPlayground_NamesTheGrantATokenLacks(t *testing.T) {
	chromium := browser(t)
	secret := strings.Repeat("playground-secret-", 2)
	page, _, _ := playgroundURL(t, secret)
	bare, _, _ := strings.Cut(page, "#")
	plain, err := popsub.NewToken([]byte(secret), "alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := startBrowser(t, chromium)
	do(t, ctx, "open with an ordinary token",
		chromedp.Navigate(bare+"#token="+plain))
	until(t, ctx, "the banner names the grant",
		contains(`#banner[data-state="no-grant"]`, "$sys/#"))
	until(t, ctx, "and says how to make a token",
		contains(`#banner`, "popsub token --sub NAME"))
	until(t, ctx, "the clients still connect",
		exists(`#alice-status[data-state="connected"]`))
}

// On a phone, a step's button brings the diagram into view, and a tap on
// one of its lines says what the line means.
func TestPlayground_PhoneShowsThePictureAfterAStep(t *testing.T) {
	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2))
	ctx, _ := startBrowser(t, chromium)
	openPlayground(t, ctx, page, 390, 844)
	do(t, ctx, "step 1", chromedp.Click(css("#step-1-do")))
	until(t, ctx, "the diagram is in view", `(() => {
		const box = document.getElementById("picture").getBoundingClientRect();
		return box.top >= -1 && box.top < window.innerHeight / 3;
	})()`)
	// The panels above the diagram grow with each delivery and ack, and
	// a render moves the page, so the tap waits for both acks and for
	// the diagram to stay put across renders: a tap aimed at a line that
	// then moves lands beside it, for a person as for the test.
	until(t, ctx, "both acks are drawn",
		`document.querySelectorAll("#diagram g.ack").length === 2`)
	until(t, ctx, "the diagram stays put", `(() => {
		const top = document.getElementById("diagram").getBoundingClientRect().top;
		const seen = window.seenDiagramAt ??= {top: NaN, since: 0};
		if (seen.top !== top) {
			seen.top = top;
			seen.since = performance.now();
		}
		return performance.now() - seen.since >= 750;
	})()`)
	do(t, ctx, "tap a delivery", chromedp.Click(css(`#diagram g.deliver`)))
	until(t, ctx, "its meaning is written out",
		contains("#picture-detail", "attempt 1"))
}

// On a phone, a retry's label stays within the diagram while the
// diagram has four lanes, before a dead letter adds the fifth.
func TestPlayground_PhoneKeepsARetrysLabelInView(t *testing.T) {
	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2),
		"--ack-timeout", "400ms", "--max-retries", "5")
	ctx, _ := startBrowser(t, chromium)
	openPlayground(t, ctx, page, 390, 844)
	do(t, ctx, "step 2", chromedp.Click(css("#step-2-do")))
	until(t, ctx, "attempt 2 for alice in the diagram",
		exists(`#diagram g.retry[data-lane="alice"][data-attempt="2"]`))
	labels, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
		const box = document.getElementById("diagram").getBoundingClientRect();
		return [...document.querySelectorAll("#diagram text.label")].filter(
			l => { const r = l.getBoundingClientRect(); return r.width > 0 &&
				(r.left < box.left - 1 || r.right > box.right + 1); }).map(
			l => l.textContent + " at " + Math.round(l.getBoundingClientRect().left));
	})()`))
	lanes, _ := chromedp.Run(ctx, chromedp.Evaluate[int](
		`document.querySelectorAll("#lanes span").length`))
	if err != nil || len(labels) > 0 || lanes != 4 {
		t.Fatalf("with %d lanes, labels outside the diagram: %q (%v)",
			lanes, labels, err)
	}
}

// startBrowser starts a headless Chromium for the test, at 1440×1200,
// and returns its context and a func that lists its console's errors.
// It ends with the test.
func startBrowser(t *testing.T, chromium string,
	extra ...chromedp.ExecAllocatorOption) (context.Context, func() []string) {
	// The timeout sits on the parent of the browser's context, as
	// chromedp asks: a deadline on the context that starts the browser
	// would kill it mid-test. Five minutes: every lab scenario at two
	// sizes took 109 s on a 2-core machine busy with the race tests and
	// two busy loops, against 2 minutes before.
	parent, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	options := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1440, 1200))
	options = append(options, extra...)
	allocator, cancelAllocator := chromedp.NewExecAllocator(parent,
		options...)
	t.Cleanup(cancelAllocator)
	ctx, cancelBrowser := chromedp.NewContext(allocator)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx, watchConsole(ctx)
}

// press clicks the first element matching selector through the DOM, and
// fails if there is none.
func press(t *testing.T, ctx context.Context, what, selector string) {
	t.Helper()
	found, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		"(e => (e?.click(), e !== null))(document.querySelector(%q))",
		selector)))
	if err != nil || !found {
		t.Fatalf("%s: no %s to press (%v)", what, selector, err)
	}
}

// css selects the first element matching a CSS selector.
func css(selector string) chromedp.CSS {
	return chromedp.CSS(selector)
}

// watchConsole collects the page's console errors and exceptions, and
// returns a func that lists them.
func watchConsole(ctx context.Context) func() []string {
	var mu sync.Mutex
	var problems []string
	messages := chromedp.Console(ctx)
	go func() {
		for message, err := range messages {
			if err != nil {
				return
			}
			if message.Type == chromedp.ConsoleError ||
				message.Type == chromedp.ConsoleException {
				mu.Lock()
				problems = append(problems, message.Text)
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), problems...)
	}
}

// A nak from a row's button: set to ack by hand, Bob hands Carol's QoS 1
// message back; the diagram draws the nak, and the broker brings the
// delivery back as a later attempt, which he then acks. The row is found
// by its place, not its attempt: on a loaded machine the ack timeout may
// bring attempt 2 before the click, and the nak then hands that back.
func TestPlayground_ANakBringsTheDeliveryBack(t *testing.T) {
	chromium := browser(t)
	page, _, _ := playgroundURL(t, strings.Repeat("playground-secret-", 2),
		"--ack-timeout", "1s")
	ctx, problems := startBrowser(t, chromium)
	openPlayground(t, ctx, page, 1366, 900)
	until(t, ctx, "bob subscribes", exists(`#bob-subs li[data-topic="jobs"]`))
	until(t, ctx, "carol connects",
		exists(`#carol-status[data-state="connected"]`))

	do(t, ctx, "bob acks by hand, carol publishes at QoS 1",
		chromedp.SetValue(css("#bob-acks"), "hand"),
		chromedp.SetValue(css("#carol-pub-qos"), "1"),
		chromedp.Click(css("#carol-publish")))
	until(t, ctx, "bob owes an ack",
		exists(`#bob-messages li button.nak:not(:disabled)`))
	// The buttons are pressed through the DOM, not at their place on the
	// screen: a note or a retry may move a row between the moment a
	// pointer is aimed and the moment it clicks, on a loaded machine.
	press(t, ctx, "bob naks", `#bob-messages li button.nak:not(:disabled)`)
	until(t, ctx, "the diagram draws the nak",
		contains("#diagram", "nak jobs"))
	until(t, ctx, "and the delivery comes back as a later attempt", exists(
		`#bob-messages li:not([data-attempt="1"]) button.ack:not(:disabled)`))
	press(t, ctx, "bob acks", `#bob-messages li button.ack:not(:disabled)`)
	until(t, ctx, "bob's row says acked",
		exists(`#bob-messages li[data-state="acked"]`))
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s", strings.Join(list, "\n"))
	}
}
