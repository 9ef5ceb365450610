package main

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

func TestSourcePage_FindsItsWayAround(t *testing.T) {
	chromium := browser(t)
	wsURL, _, _ := startServe(t)
	page := "http://" + strings.TrimPrefix(wsURL, "ws://")
	page = strings.TrimSuffix(page, "/ws") + "/source"
	ctx, problems := startBrowser(t, chromium)

	// The table of contents leads to a detail, folded on a first
	// reading, and opens it; a click on its summary folds it again, and
	// another opens it.
	frames := `details#keepalives-limits-and-batches`
	err := chromedp.Do(ctx,
		chromedp.Navigate(page),
		chromedp.WaitVisible(css(
			`nav.toc a[href="#keepalives-limits-and-batches"]`)),
		chromedp.Click(css(`nav.toc a[href="#keepalives-limits-and-batches"]`)),
		chromedp.WaitVisible(css(frames+` > summary`)),
	)
	if err != nil {
		t.Fatalf("contents: %v", err)
	}
	open := func(selector string) bool {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
			`document.querySelector("`+selector+`").open`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// The page opens the detail when the address changes, after the
	// click: wait for it, as a reader's eye does.
	until(t, ctx, "the contents' link opens the detail",
		`document.querySelector("`+frames+`").open`)
	err = chromedp.Do(ctx, chromedp.Click(css(frames+` > summary`)))
	if err != nil || open(frames) {
		t.Fatalf("a click on the summary did not fold the detail: %v", err)
	}
	err = chromedp.Do(ctx, chromedp.Click(css(frames+` > summary`)))
	if err != nil || !open(frames) {
		t.Fatalf("one click did not open the detail: %v", err)
	}

	// An identifier links to its definition, and a definition inside
	// another folded detail opens it: the durable name a first-reading
	// subscribe resumes (connection.resume).
	folded := `details#durable-subscriptions`
	err = chromedp.Do(ctx,
		chromedp.Click(css(frames+` .code a[href="#connection"]`)),
		chromedp.WaitVisible(css(`#connection`)),
	)
	if err != nil {
		t.Fatalf("following links: %v", err)
	}
	if open(folded) {
		t.Fatal("the durable names' detail is open before its link is " +
			"followed")
	}
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`[...document.
		querySelectorAll('a[href="#connection.resume"]')].
		find(a => !a.closest("details")).click() ?? true`))
	if err == nil {
		err = chromedp.Do(ctx, chromedp.WaitVisible(
			css(`[id="connection.resume"]`)))
	}
	if err != nil {
		t.Fatalf("the link into a folded detail: %v", err)
	}
	until(t, ctx, "the link into a folded detail opens it",
		`document.querySelector("`+folded+`").open`)

	// The appendix lists the machine room's packages, folded; its
	// contents' link opens one.
	store := `details#boltstore-boltstore-go`
	err = chromedp.Do(ctx,
		chromedp.Click(css(`nav.toc a[href="#boltstore-boltstore-go"]`)),
		chromedp.WaitVisible(css(store+` > summary`)),
	)
	if err != nil {
		t.Fatalf("the appendix's link: %v", err)
	}
	until(t, ctx, "the appendix's link opens boltstore",
		`document.querySelector("`+store+`").open`)
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s",
			strings.Join(list, "\n"))
	}
}
