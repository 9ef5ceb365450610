package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/popsub/popsub/docs"
	"github.com/popsub/popsub/lab"
)

// openLab opens the lab at page and waits until its Go is running.
func openLab(t *testing.T, ctx context.Context, page string, width,
	height int64) {
	t.Helper()
	do(t, ctx, "open the lab", chromedp.EmulateViewport(width, height),
		chromedp.Navigate(page))
	until(t, ctx, "the lab starts", "document.body.dataset.ready !== "+
		"undefined || document.body.dataset.failed !== undefined")
	failed := evaluate[string](t, ctx, "document.body.dataset.failed ?? ''")
	if failed != "" {
		t.Fatalf("the lab did not start: %s", failed)
	}
}

// startLab starts popsub serve and Chromium, and returns the lab's
// address, the browser, and its console's problems.
func startLab(t *testing.T) (string, context.Context, func() []string) {
	t.Helper()
	chromium := browser(t)
	wsURL, _, _ := startServe(t)
	ctx, problems := startBrowser(t, chromium)
	return "http://" + strings.TrimPrefix(wsURL, "ws://") + "/lab/", ctx,
		problems
}

// evaluate evaluates a JavaScript expression.
func evaluate[T any](t *testing.T, ctx context.Context, expression string) T {
	t.Helper()
	value, err := chromedp.Run(ctx, chromedp.Evaluate[T](expression))
	if err != nil {
		t.Fatalf("%s: %v", expression, err)
	}
	return value
}

// playScenario plays a guided scenario in the page at 16× speed,
// answers its question, holds the page's diagrams to the explanation's
// words, and returns the verdict the page shows once the fault has run:
// held or broken.
func playScenario(t *testing.T, ctx context.Context, s lab.Scenario) string {
	t.Helper()
	return playInPage(t, ctx, s, true)
}

// playInPage plays a scenario as playScenario does; a broker built
// broken on purpose is played with words false, as its run cannot show
// what the explanation of the real one says.
func playInPage(t *testing.T, ctx context.Context, s lab.Scenario,
	words bool) string {
	t.Helper()
	do(t, ctx, "pick "+s.Name,
		chromedp.SetValue(css("#speed"), "16"),
		chromedp.Click(css(`.pick[data-scenario="`+s.Name+`"]`)))
	until(t, ctx, s.Name+" asks its question",
		`document.body.dataset.phase === "asking"`)
	// The setup stops at what its untils wait for: its own waits and a
	// few seconds, never an until's minute, with every choice disabled
	// and the screen showing what the question no longer asks.
	var waits int64
	for _, step := range s.Setup {
		waits += step.Wait
	}
	if now := evaluate[float64](t, ctx, "lab.view().now"); now >
		float64(waits+5000) {
		t.Errorf("%s asks its question at %.0f ms; its setup waits %d ms",
			s.Name, now, waits)
	}
	faulted := evaluate[[]int](t, ctx,
		"[lab.view().events, lab.view().beside?.events ?? 0]")
	do(t, ctx, "answer "+s.Name, chromedp.Click(css(`.choice[data-choice="0"]`)))
	until(t, ctx, s.Name+" runs its fault", `document.body.dataset.phase === "done"`)
	until(t, ctx, s.Name+" explains", exists(`#explain:not([hidden]) .links a`))
	// The explanation's words are what the page's diagrams show.
	runs := strings.Split(evaluate[string](t, ctx, "lab.history()"), "\n")
	for i, patterns := range [][]string{s.Shows, s.TheirsShow} {
		if !words || i >= len(runs) {
			break
		}
		var events []lab.Event
		if err := json.Unmarshal([]byte(runs[i]), &events); err != nil {
			t.Fatalf("%s: the history: %v", s.Name, err)
		}
		if missing := lab.Shown(patterns, events[faulted[i]:]); missing != "" {
			t.Errorf("%s: run %d in the page does not show %q", s.Name, i,
				missing)
		}
	}
	return evaluate[string](t, ctx, "document.body.dataset.verdict")
}

// Every guided scenario runs in Chromium, at a laptop's size and a
// phone's, and the page's checker says every promise held.
func TestLab_EveryScenarioHoldsInThePage(t *testing.T) {
	page, ctx, problems := startLab(t)
	for _, size := range [][2]int64{{1366, 900}, {390, 844}} {
		openLab(t, ctx, page, size[0], size[1])
		for _, s := range lab.Scenarios {
			// popsub.go keeps every promise, but those a fault no broker
			// can mend breaks, and the page marks the events that break
			// them.
			want, breaks := "held", []string(nil)
			if !s.Beside && len(s.Breaks) > 0 {
				want, breaks = "broken", s.Breaks
			}
			if verdict := playScenario(t, ctx, s); verdict != want {
				t.Errorf("%dpx, %s: the page says %s:\n%s", size[0], s.Name,
					verdict, evaluate[string](t, ctx,
						`document.getElementById("checker").innerText`))
			}
			broken := evaluate[[]string](t, ctx, `[...document.querySelectorAll(
				"#checker .promise.broken .name")].map(e => e.textContent)`)
			if strings.Join(broken, "|") != strings.Join(breaks, "|") {
				t.Errorf("%dpx, %s: the checker breaks %q, want %q", size[0],
					s.Name, broken, breaks)
			}
			if marked := evaluate[int](t, ctx, `document.querySelectorAll(
				"#diagram .ev.marked").length`); (marked > 0) != (len(breaks) > 0) {
				t.Errorf("%dpx, %s: %d events marked red", size[0], s.Name,
					marked)
			}
			if s.Beside {
				theArticlesBrokerBeside(t, ctx, s, int(size[0]))
			}
			// The README's picture: the article's broker beside
			// popsub.go, and each checker's verdict.
			if s.Name == "one-ack" && size[0] == 1366 {
				shoot(t, ctx, "lab.png")
			}
			if size[0] == 390 {
				phoneReadsTheDiagram(t, ctx, s.Name, "diagram")
				if s.Beside {
					phoneReadsTheDiagram(t, ctx, s.Name, "beside-diagram")
				}
			}
			held := evaluate[int](t, ctx,
				`document.querySelectorAll("#checker .promise.held").length`)
			if held != 5-len(breaks) {
				t.Errorf("%dpx, %s: %d promises held, want %d", size[0], s.Name,
					held, 5-len(breaks))
			}
		}
		wide := evaluate[bool](t, ctx,
			"document.documentElement.scrollWidth <= window.innerWidth")
		if !wide {
			t.Errorf("at %dpx the page scrolls sideways", size[0])
		}
		// A row's label reads on one line; its buttons scroll past it.
		if !evaluate[bool](t, ctx, `(() => {
			const label = document.querySelector(".scenarios .group");
			return label.getBoundingClientRect().height <=
				label.nextElementSibling.getBoundingClientRect().height;
		})()`) {
			t.Errorf("at %dpx the article's row label is squeezed onto "+
				"several lines", size[0])
		}
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// theArticlesBrokerBeside checks a scenario run on both brokers: the
// article's column shows its own run, its checker breaks the promise
// the scenario names and no other, and every cost measured is higher
// on the article's broker than on popsub.go.
func theArticlesBrokerBeside(t *testing.T, ctx context.Context,
	s lab.Scenario, width int) {
	t.Helper()
	broken := evaluate[[]string](t, ctx, `[...document.querySelectorAll(
		"#beside-checker .promise.broken .name")].map(e => e.textContent)`)
	if want := s.Breaks; strings.Join(broken, "|") != strings.Join(want, "|") {
		t.Errorf("%dpx, %s: the article's checker breaks %q, want %q", width,
			s.Name, broken, s.Breaks)
	}
	verdict := evaluate[string](t, ctx, `document.querySelector(
		'#explain .verdict[data-kind="article"]')?.className ?? ""`)
	if strings.Contains(verdict, "broken") != (len(s.Breaks) > 0) {
		t.Errorf("%dpx, %s: the article's verdict is %q", width, s.Name,
			verdict)
	}
	figures := evaluate[[][]float64](t, ctx, `[...document.querySelectorAll(
		"#explain .figures tbody tr")].map(r => [...r.querySelectorAll(
		"td[data-value]")].map(c => Number(c.dataset.value)))`)
	if len(figures) != len(s.Figures) {
		t.Errorf("%dpx, %s: %d figures shown, want %d:\n%s", width, s.Name,
			len(figures), len(s.Figures), evaluate[string](t, ctx,
				`document.getElementById("explain").innerHTML`))
	}
	for i, f := range figures {
		if len(f) != 2 || f[1] <= f[0] {
			t.Errorf("%dpx, %s: %s measured %v: popsub.go's, then the "+
				"article's, which should cost more", width, s.Name,
				s.Figures[i], f)
		}
	}
	if n := evaluate[int](t, ctx, `document.querySelectorAll(
		"#beside-diagram .ev").length`); n == 0 {
		t.Errorf("%dpx, %s: the article's diagram is empty", width, s.Name)
	}
}

// phoneReadsTheDiagram checks a diagram (its element's id) on a phone:
// every label at least 11 px on screen, the diagram right below the
// question, and the lanes' names in sight however far the diagram is
// scrolled.
func phoneReadsTheDiagram(t *testing.T, ctx context.Context, name,
	id string) {
	t.Helper()
	smallest := evaluate[float64](t, ctx, `Math.min(...[...document.
		querySelectorAll("#`+id+` text")].map(e => e.getScreenCTM().a *
		parseFloat(getComputedStyle(e).fontSize)))`)
	if smallest < 11 {
		t.Errorf("390px, %s: a diagram label is %.1f px on screen, want "+
			"at least 11", name, smallest)
	}
	gap := evaluate[float64](t, ctx, `document.querySelector(".stage").
		getBoundingClientRect().top - document.getElementById("story").
		getBoundingClientRect().bottom`)
	if gap > 20 {
		t.Errorf("390px, %s: the diagram is %.0f px below the question",
			name, gap)
	}
	pinned := evaluate[bool](t, ctx, `(() => {
		const wrap = document.getElementById("`+id+`");
		wrap.scrollTop = wrap.scrollHeight;
		const head = wrap.querySelector(".diagram-head").getBoundingClientRect();
		return Math.abs(head.top - wrap.getBoundingClientRect().top) < 2;
	})()`)
	if !pinned {
		t.Errorf("390px, %s: the lanes' names scroll away with the diagram",
			name)
	}
}

// The diagram moves: a new frame's packet travels its arrow and the
// arrow draws itself; asked for less motion (prefers-reduced-motion),
// nothing moves and no packet shows.
func TestLab_MovesUnlessAskedNotTo(t *testing.T) {
	page, ctx, problems := startLab(t)
	openLab(t, ctx, page, 1366, 900)
	do(t, ctx, "bob subscribes, alice publishes",
		chromedp.Click(css(`.tab[data-client="bob"]`)),
		chromedp.Click(css(`[data-act="subscribe"]`)),
		chromedp.Click(css(`.tab[data-client="alice"]`)),
		chromedp.Click(css(`[data-act="publish"][data-qos="0"]`)))
	// What the page asks to move, not whether it is moving yet (or
	// still, on a busy machine).
	moving := evaluate[bool](t, ctx, `[...document.querySelectorAll(
		"#diagram .ev.new .arrow")].some(a =>
			getComputedStyle(a).animationName !== "none") &&
		[...document.querySelectorAll("#diagram .packet")].some(p =>
			getComputedStyle(p).display !== "none" &&
			p.querySelector("animate") !== null)`)
	if !moving {
		t.Errorf("a new frame does not move on the diagram")
	}
	lessMotion := func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia,
			emulation.SetEmulatedMediaParams{Features: []*emulation.MediaFeature{
				{Name: "prefers-reduced-motion", Value: "reduce"}}})
		return chromedp.Void{}, err
	}
	do(t, ctx, "ask for less motion", lessMotion,
		chromedp.Click(css(`[data-act="publish"][data-qos="0"]`)),
		chromedp.Click(css("#step")))
	still := evaluate[bool](t, ctx, `document.querySelectorAll(
		"#diagram .ev.new").length > 0 && [...document.querySelectorAll(
		"#diagram .ev.new .arrow, #diagram .ev.new text, #diagram .ev.new .dot, #diagram .ev.new .band")].every(e =>
			getComputedStyle(e).animationName === "none") &&
		[...document.querySelectorAll("#diagram .packet")].every(p =>
			getComputedStyle(p).display === "none")`)
	if !still {
		t.Errorf("with prefers-reduced-motion the diagram still moves")
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// Free play runs on the broker the learner picks: the article's alone
// says so and speaks the original's frames; both puts its column beside
// popsub.go's, with the same clicks in each.
func TestLab_FreePlayRunsEitherBrokerOrBoth(t *testing.T) {
	page, ctx, problems := startLab(t)
	openLab(t, ctx, page, 1366, 900)
	click := []chromedp.Action[chromedp.Void]{
		chromedp.Click(css(`.tab[data-client="bob"]`)),
		chromedp.Click(css(`[data-act="subscribe"]`)),
		chromedp.Click(css(`.tab[data-client="alice"]`)),
		chromedp.Click(css(`[data-act="publish"][data-qos="1"]`)),
		chromedp.Click(css("#step")),
	}
	pick := func(brokers string) {
		t.Helper()
		do(t, ctx, "pick "+brokers, chromedp.SetValue(css("#brokers"), brokers),
			chromedp.Evaluate[chromedp.Void](`document.getElementById(
				"brokers").dispatchEvent(new Event("change"))`))
	}
	pick("article")
	until(t, ctx, "the article's broker runs", `document.getElementById(
		"broker-state").textContent.startsWith("the article's broker")`)
	do(t, ctx, "bob subscribes, alice publishes", click...)
	until(t, ctx, "bob gets alice-1 the original's way", `[...document.
		querySelectorAll("#diagram .label")].some(e =>
		e.textContent === "alice-1 as alice-1")`)
	if evaluate[bool](t, ctx, `document.getElementById("beside").hidden`) !=
		true {
		t.Errorf("the article's broker alone shows a second column")
	}
	pick("both")
	until(t, ctx, "two columns", `!document.getElementById("beside").hidden`)
	do(t, ctx, "bob subscribes, alice publishes", click...)
	until(t, ctx, "each column has its run", `[...document.querySelectorAll(
		"#diagram .label")].some(e => e.textContent === "seq 1: alice-1") &&
		[...document.querySelectorAll("#beside-diagram .label")].some(e =>
		e.textContent === "alice-1 as alice-1")`)
	if !strings.Contains(evaluate[string](t, ctx, "lab.hash()"), "brokers=both") {
		t.Errorf("the link does not carry the brokers")
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// A shared run replays event for event: the link a scenario's run gives
// opens, twice, to histories byte for byte the same as the run's own.
func TestLab_ASharedRunReplaysByteForByte(t *testing.T) {
	page, ctx, problems := startLab(t)
	openLab(t, ctx, page, 1366, 900)
	playScenario(t, ctx, lab.Scenarios[1])
	// Shared as it ends, the run opens to the end the sender saw: the
	// answer, the verdict and the explanation, not a run still going.
	done := evaluate[string](t, ctx,
		`document.getElementById("share").getAttribute("href").slice(1)`)
	do(t, ctx, "leave", chromedp.Navigate("about:blank"))
	openLab(t, ctx, page+"#"+done, 1366, 900)
	until(t, ctx, "the shared run shows its verdict and explanation",
		`document.body.dataset.phase === "done" && `+
			`document.querySelector("#explain:not([hidden]) .verdict") !== null`)
	// Free clicks after the scenario go into the link too.
	do(t, ctx, "click on", chromedp.Click(css(`.tab[data-client="carol"]`)),
		chromedp.Click(css(`[data-act="publish"][data-qos="1"]`)),
		chromedp.Click(css(`[data-act="kill"]`)),
		chromedp.Click(css("#step")), chromedp.Click(css("#step")))
	original := evaluate[string](t, ctx, "lab.history()")
	hash := evaluate[string](t, ctx, "lab.hash()")
	var replays []string
	for range 2 {
		do(t, ctx, "leave", chromedp.Navigate("about:blank"))
		openLab(t, ctx, page+"#"+hash, 1366, 900)
		replays = append(replays, evaluate[string](t, ctx, "lab.history()"))
	}
	if replays[0] != replays[1] {
		t.Errorf("two replays differ:\n%s\n%s", replays[0], replays[1])
	}
	if replays[0] != original {
		t.Errorf("the replay differs from the run:\n%s\n%s", original, replays[0])
	}
	if !strings.Contains(original, `"kind":"power"`) ||
		!strings.Contains(original, `"kind":"kill"`) {
		t.Errorf("the run lacks its faults: %s", original)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// A run of both brokers side by side replays too: the link opens to
// the article's broken promise as the sender saw it, and both runs'
// events come back byte for byte.
func TestLab_ASideBySideRunReplaysByteForByte(t *testing.T) {
	page, ctx, problems := startLab(t)
	openLab(t, ctx, page, 1366, 900)
	oneAck, _ := lab.ScenarioNamed("one-ack")
	playScenario(t, ctx, oneAck)
	original := evaluate[string](t, ctx, "lab.history()")
	hash := evaluate[string](t, ctx, "lab.hash()")
	if !strings.Contains(hash, "brokers=both") {
		t.Fatalf("the link does not say both brokers: %s", hash)
	}
	for range 2 {
		do(t, ctx, "leave", chromedp.Navigate("about:blank"))
		openLab(t, ctx, page+"#"+hash, 1366, 900)
		until(t, ctx, "the shared run shows both verdicts",
			`document.querySelectorAll("#explain:not([hidden]) .verdict").length === 2`)
		if got := evaluate[string](t, ctx, "lab.history()"); got != original {
			t.Errorf("the replay differs from the run:\n%s\n%s", original, got)
		}
		broken := evaluate[int](t, ctx,
			`document.querySelectorAll("#beside-checker .promise.broken").length`)
		if broken != 1 {
			t.Errorf("the replay's article's checker breaks %d promises, "+
				"want 1", broken)
		}
	}
	if strings.Count(original, "\n") != 1 {
		t.Errorf("the history is not two runs': %.200s", original)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// The folder popsub lab --out writes works from a plain static file
// server, with no popsub process; and the lab's WebAssembly built
// without seq reservations, dropped into it, makes the page's checker
// report the reused seq of the first scenario, on the events that
// reuse it.
func TestLab_ExportedFolderWorksAndItsCheckerBites(t *testing.T) {
	chromium := browser(t)
	dir := t.TempDir()
	if err := run(context.Background(), []string{"lab", "--out", dir},
		io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	files := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer files.Close()
	ctx, problems := startBrowser(t, chromium)
	openLab(t, ctx, files.URL+"/index.html", 1366, 900)
	if verdict := playScenario(t, ctx, lab.Scenarios[0]); verdict != "held" {
		t.Errorf("the exported lab says %s", verdict)
	}
	// The figures the README reports: the time is logged, not asserted;
	// the size, which the build decides, is held to the lab's budget.
	if info, err := os.Stat(filepath.Join(dir, "lab.wasm.gz")); err == nil {
		t.Logf("lab.wasm.gz: %.2f MB; interactive after %s ms", float64(
			info.Size())/1e6, evaluate[string](t, ctx, "document.body.dataset.ready"))
		if info.Size() > 3e6 {
			t.Errorf("lab.wasm.gz is %.2f MB, over its 3 MB", float64(
				info.Size())/1e6)
		}
	}

	// The same folder, with the broker built to forget its reservations.
	wasm := filepath.Join(t.TempDir(), "lab.wasm")
	build := exec.Command("go", "build", "-tags", "labnoreserve",
		"-ldflags=-s -w", "-o", wasm, "../../lab/wasm")
	build.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags labnoreserve: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(raw)
	zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "lab.wasm.gz"), zipped.Bytes(),
		0o644); err != nil {
		t.Fatal(err)
	}
	openLab(t, ctx, files.URL+"/index.html", 1366, 900)
	if verdict := playInPage(t, ctx, lab.Scenarios[0], false); verdict != "broken" {
		t.Errorf("without reservations the page says %s", verdict)
	}
	broken := evaluate[string](t, ctx,
		`document.querySelector("#checker .promise.broken")?.innerText ?? ""`)
	if !strings.Contains(broken, "no seq is given to two messages") {
		t.Errorf("the broken promise is not the reused seq: %q", broken)
	}
	if marked := evaluate[int](t, ctx,
		`document.querySelectorAll("#diagram .ev.marked").length`); marked < 2 {
		t.Errorf("%d events marked, want the two deliveries of seq 1", marked)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// The protocol's machine-readable description is served, whole, as the
// JSON the schema test validates frames with.
func TestServe_ServesTheAsyncAPIDocument(t *testing.T) {
	wsURL, _, _ := startServe(t)
	// protocol.md's link, from the page /docs/protocol, redirects there.
	resp, err := http.Get("http://" + strings.TrimPrefix(wsURL, "ws://") +
		"/docs/asyncapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
		!bytes.Equal(body, docs.AsyncAPI) {
		t.Fatalf("%s %s: %.80s", resp.Status, resp.Header.Get("Content-Type"),
			body)
	}
}

// The clock's buttons: play lets the broker's timers fire, at the speed
// chosen; pause stops time where it is; step moves it to the next timer
// and no further.
func TestLab_PlayPauseAndStepDriveTheClock(t *testing.T) {
	page, ctx, problems := startLab(t)
	openLab(t, ctx, page, 1366, 900)
	now := func() float64 { return evaluate[float64](t, ctx, "lab.view().now") }
	if start := now(); start != 0 {
		t.Fatalf("the clock starts at %v ms", start)
	}
	// Free play says how to start the clock, every control says what it
	// does, and the seq box shows only for "after seq".
	if !evaluate[bool](t, ctx, `document.getElementById("story-text").`+
		`textContent.includes("press play")`) {
		t.Error("free play does not say how to start the clock")
	}
	if untitled := evaluate[int](t, ctx, `[...document.querySelectorAll(`+
		`".controls button, .clock button")].filter(b => !b.title).length`); untitled > 0 {
		t.Errorf("%d of the lab's buttons have no title", untitled)
	}
	if !evaluate[bool](t, ctx, `document.getElementById("after").hidden`) {
		t.Error("the after-seq box shows with the plain mode")
	}
	evaluate[bool](t, ctx, `(() => { const mode = document.`+
		`getElementById("mode"); mode.value = "after"; return mode.`+
		`dispatchEvent(new Event("change")); })()`)
	if evaluate[bool](t, ctx, `document.getElementById("after").hidden`) {
		t.Error("the after-seq box is hidden with the after-seq mode")
	}
	do(t, ctx, "play at 16×", chromedp.SetValue(css("#speed"), "16"),
		chromedp.Click(css("#play")))
	until(t, ctx, "time passes", "lab.view().now > 2000")
	do(t, ctx, "pause", chromedp.Click(css("#pause")))
	paused := now()
	do(t, ctx, "wait", chromedp.Sleep(300*time.Millisecond))
	if later := now(); later != paused {
		t.Errorf("paused at %v ms, the clock moved to %v", paused, later)
	}
	// The lab's own beat keeps a step short with nothing else pending.
	do(t, ctx, "step", chromedp.Click(css("#step")))
	stepped := now()
	if stepped <= paused || stepped > paused+1000 {
		t.Errorf("a step moved the clock from %v to %v ms", paused, stepped)
	}
	// The keyboard does the same: the right arrow steps.
	do(t, ctx, "→", chromedp.KeyEvent(kb.ArrowRight))
	if keyed := now(); keyed <= stepped {
		t.Errorf("the right arrow left the clock at %v ms", keyed)
	}
	if p := problems(); len(p) > 0 {
		t.Errorf("console errors: %v", p)
	}
}

// popsub lab needs a folder to write to, and says so.
func TestLab_CommandNeedsAFolder(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"lab"}, io.Discard, &stderr)
	if err == nil || !strings.Contains(err.Error(), "--out is required") ||
		!strings.Contains(stderr.String(), "-out") {
		t.Fatalf("popsub lab: %v\n%s", err, stderr.String())
	}
}
