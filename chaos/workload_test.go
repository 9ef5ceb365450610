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
	broker := httptest.NewServer(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer ws.CloseNow()
			refused := false
			for {
				f, err := read(r.Context(), ws)
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
				if send(r.Context(), ws, answer) != nil {
					return
				}
			}
		}))
	defer broker.Close()

	h := &History{}
	c := &Client{Name: "watch-fresh-1", Token: "token", History: h,
		Dial: func(ctx context.Context) (*websocket.Conn, error) {
			ws, _, err := websocket.Dial(ctx,
				"ws"+strings.TrimPrefix(broker.URL, "http"), nil)
			return ws, err
		}}
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
