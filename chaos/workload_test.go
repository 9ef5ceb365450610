package chaos

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// A probe whose publish to a new topic the log refuses (store_failed,
// as a broker on NATS answers while NATS restarts) sends it again, as a
// publisher does: waiting for the delivery of a refused publish would
// report a stall the broker did not cause. Found by popsub chaos on the
// nats engine, whose NATS kill came just after the probe's publish.
func TestOnFirstDelivery_SendsARefusedPublishAgain(t *testing.T) {
	publishes := make(chan string, 10)
	dial := fakeBroker(t, func(ctx context.Context, ws *websocket.Conn) {
		refused := false
		for {
			f, err := read(ctx, ws)
			if err != nil {
				return
			}
			var answer map[string]any
			switch f.Type {
			case "auth":
				answer = map[string]any{"type": "authenticated"}
			case "subscribe":
				answer = map[string]any{"type": "subscribed",
					"topic": f.Topic, "seq": 0}
			case "publish":
				publishes <- f.MessageID
				answer = map[string]any{"type": "message",
					"topic": f.Topic, "message_id": f.MessageID,
					"payload": f.Payload, "seq": 1, "qos": 1,
					"attempt": 1}
				if !refused {
					refused = true
					answer = map[string]any{"type": "error",
						"code": "store_failed", "topic": f.Topic,
						"message_id": f.MessageID}
				}
			}
			if send(ctx, ws, answer) != nil {
				return
			}
		}
	})

	h := &History{}
	c := &Client{Name: "watch-fresh-1", Token: "token", History: h,
		Dial: dial}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	delivered := false
	err := c.OnFirstDelivery(ctx, "fresh-1", "first-fresh-1",
		func() { delivered = true })
	if err != nil || !delivered {
		t.Fatalf("the probe returned %v, delivered %v: want the second "+
			"publish's delivery", err, delivered)
	}
	var sent []string
	for len(publishes) > 0 {
		sent = append(sent, <-publishes)
	}
	if !slices.Equal(sent, []string{"first-fresh-1", "first-fresh-1"}) {
		t.Fatalf("the probe published %q, want first-fresh-1 twice", sent)
	}
	if len(h.Refusals) != 1 || h.Refusals[0].Code != "store_failed" {
		t.Fatalf("refusals %+v, want the one store_failed", h.Refusals)
	}
}

// A publisher sends a value refused for now (delayed_limit: the bound
// may lift) again on its next connection, and one refused for good
// (invalid_delay) never again: sent at every new connection, it would be
// refused at every one, and the publisher would never finish.
func TestPublish_SendsAgainOnlyWhatWasRefusedForNow(t *testing.T) {
	sent := make(chan string, 100)
	refusals := map[string]string{"p-1": "invalid_delay",
		"p-3": "delayed_limit"}
	dial := fakeBroker(t, func(ctx context.Context, ws *websocket.Conn) {
		// Two publishes a connection, then a drop.
		for answered := 0; answered < 2; {
			f, err := read(ctx, ws)
			if err != nil {
				return
			}
			answer := map[string]any{"type": "authenticated"}
			if f.Type == "publish" {
				sent <- f.MessageID
				answered++
				answer = map[string]any{"type": "published",
					"topic": f.Topic, "message_id": f.MessageID,
					"seq": len(sent)}
				if code := refusals[f.MessageID]; code != "" {
					answer = map[string]any{"type": "error",
						"code": code, "topic": f.Topic,
						"message_id": f.MessageID}
					delete(refusals, f.MessageID)
				}
			}
			if send(ctx, ws, answer) != nil {
				return
			}
		}
	})

	c := &Client{Name: "p", Token: "token", History: &History{}, Dial: dial}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stop := make(chan struct{})
	go func() {
		for len(sent) < 6 {
			time.Sleep(time.Millisecond)
		}
		close(stop)
	}()
	if _, err := c.Publish(ctx, stop, "t", 1); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for len(sent) > 0 {
		counts[<-sent]++
	}
	if counts["p-1"] != 1 || counts["p-3"] != 2 {
		t.Fatalf("sent %v: want p-1 once, p-3 twice", counts)
	}
}

// fakeBroker serves each WebSocket with serve, which plays the broker,
// until the test ends, and returns a Dialer to it.
func fakeBroker(t *testing.T, serve func(context.Context,
	*websocket.Conn)) Dialer {
	server := httptest.NewServer(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer ws.CloseNow()
			serve(r.Context(), ws)
		}))
	t.Cleanup(server.Close)
	url := "ws" + strings.TrimPrefix(server.URL, "http")
	return func(ctx context.Context) (*websocket.Conn, error) {
		ws, _, err := websocket.Dial(ctx, url, nil)
		return ws, err
	}
}
