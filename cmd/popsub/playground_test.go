package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
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

// screenshotPath is where the test saves its picture: over the README's
// docs/playground.png when POPSUB_UPDATE_SCREENSHOT=1, else a temp file.
func screenshotPath(t *testing.T) string {
	if os.Getenv("POPSUB_UPDATE_SCREENSHOT") == "1" {
		return filepath.Join("..", "..", "docs", "playground.png")
	}
	return filepath.Join(t.TempDir(), "playground.png")
}

func TestPlayground_ShowsARetryAndItsAck(t *testing.T) {
	chromium := browser(t)
	secret := strings.Repeat("playground-secret-", 2)
	wsURL, _, stop := startServe(t, "--ack-timeout", "1s", "--secret", secret)
	address := strings.TrimPrefix(wsURL, "ws://")
	token, err := localClaims().Sign([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	page := "http://" + address + "/#token=" + token

	ctx, problems := startBrowser(t, chromium)

	err = chromedp.Do(ctx,
		chromedp.Navigate(page),
		chromedp.WaitVisible(css(`body[data-ready="true"]`)),
		chromedp.Click(css("#alice-connect")),
		chromedp.Click(css("#bob-connect")),
		chromedp.WaitVisible(css("#alice-status.good")),
		chromedp.WaitVisible(css("#bob-status.good")),
		chromedp.Click(css("#alice-autoack")),
		chromedp.Click(css("#alice-subscribe")),
		chromedp.WaitVisible(css(`#alice-subs li[data-topic="jobs"]`)),

		// Bob publishes with QoS 1; alice holds her ack, so the broker
		// retries her (attempt 2) and the x-ray shows what she owes.
		chromedp.Click(css("#bob-publish")),
		chromedp.WaitVisible(css(`#alice-messages li[data-attempt="1"]`)),
		chromedp.WaitVisible(css(`#xray-pending tr`)),
		chromedp.WaitVisible(css(`#alice-messages li[data-attempt="2"]`)),
		chromedp.WaitVisible(css(`#xray-pending tr[data-attempt="2"]`)),
	)
	if err != nil {
		t.Fatalf("playground: %v", err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(screenshotPath(t), shot, 0o644); err != nil {
		t.Fatal(err)
	}

	// Her ack clears the pending entry, and the x-ray says so.
	err = chromedp.Do(ctx,
		chromedp.Click(css(`#alice-messages li[data-attempt="2"] button.ack`)))
	if err == nil {
		_, err = chromedp.Run(ctx, chromedp.Poll[bool](
			`document.querySelectorAll("#xray-pending tr").length === 0`))
	}
	if err != nil {
		t.Fatalf("ack: %v", err)
	}
	if list := problems(); len(list) > 0 {
		t.Fatalf("the console reported problems:\n%s",
			strings.Join(list, "\n"))
	}

	// The server goes away: the page says so, and when a server is back
	// on the same address it reconnects by itself.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	err = chromedp.Do(ctx, chromedp.WaitVisible(css("#banner.down")))
	if err != nil {
		t.Fatalf("the page did not notice the server was gone: %v", err)
	}
	startServe(t, "--addr", address, "--secret", secret)
	err = chromedp.Do(ctx, chromedp.WaitVisible(css("#banner.up")))
	if err != nil {
		t.Fatalf("the page did not reconnect: %v", err)
	}
}

// startBrowser starts a headless Chromium for the test, at 1440×1200,
// and returns its context and a func that lists its console's errors.
// It ends with the test.
func startBrowser(t *testing.T, chromium string) (context.Context,
	func() []string) {
	// The timeout sits on the parent of the browser's context, as
	// chromedp asks: a deadline on the context that starts the browser
	// would kill it mid-test.
	parent, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	options := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1440, 1200))
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
