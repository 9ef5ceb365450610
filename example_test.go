package popsub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
)

// quiet keeps the examples' output to what they print.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// This example runs a broker on a test server, connects a WebSocket
// client to it, and publishes from inside the process.
func Example() {
	dir, _ := os.MkdirTemp("", "popsub-example")
	defer os.RemoveAll(dir)
	store, err := boltstore.Open(filepath.Join(dir, "popsub.db"), quiet)
	if err != nil {
		panic(err)
	}
	secret := []byte("an-example-secret-of-at-least-32-bytes")
	broker, err := popsub.New(popsub.Options{Secret: secret, Store: store,
		Logger: quiet})
	if err != nil {
		panic(err)
	}
	server := httptest.NewServer(broker)
	defer server.Close()
	defer broker.Shutdown(context.Background())

	// A client: auth first, then subscribe.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(server.URL, "http") + "/ws"
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		panic(err)
	}
	defer ws.CloseNow()
	token, _ := popsub.NewToken(secret, "alice", time.Hour)
	wsjson.Write(ctx, ws, map[string]string{"type": "auth", "token": token})
	wsjson.Write(ctx, ws, map[string]string{"type": "subscribe",
		"topic": "news"})
	type frame struct {
		Type, Sub, Topic string
		Seq              uint64
		Payload          json.RawMessage
	}
	var authenticated, subscribed frame
	wsjson.Read(ctx, ws, &authenticated)
	wsjson.Read(ctx, ws, &subscribed)
	fmt.Println(authenticated.Type, "as", authenticated.Sub)
	fmt.Println(subscribed.Type, "to", subscribed.Topic)

	// The server side publishes; the client receives.
	broker.Publish(ctx, "news", "hello", 1)
	var message frame
	wsjson.Read(ctx, ws, &message)
	fmt.Printf("%s on %s, seq %d: %s\n", message.Type, message.Topic,
		message.Seq, message.Payload)
	// Output:
	// authenticated as alice
	// subscribed to news
	// message on news, seq 1: "hello"
}

// Publish returns once a QoS 1 message is on disk, with its place in the
// topic's log.
func ExampleBroker_Publish() {
	dir, _ := os.MkdirTemp("", "popsub-example")
	defer os.RemoveAll(dir)
	store, _ := boltstore.Open(filepath.Join(dir, "popsub.db"), quiet)
	broker, _ := popsub.New(popsub.Options{Secret: []byte("secret"),
		Store: store, Logger: quiet})
	defer broker.Shutdown(context.Background())

	for _, reading := range []float64{21.5, 21.7} {
		seq, err := broker.Publish(context.Background(), "sensors/7/temp",
			reading, 1)
		fmt.Println(seq, err)
	}
	_, err := broker.Publish(context.Background(), "sensors/+/temp", 0, 1)
	fmt.Println(err)
	// Output:
	// 1 <nil>
	// 2 <nil>
	// publish: wildcards are for subscriptions, not publishes
}

// Claims can narrow what a token allows: here, publishing to one
// sensor's topics and subscribing to its configuration.
func ExampleClaims_Sign() {
	var claims popsub.Claims
	claims.Subject = "sensor-7"
	claims.Publish = []string{"sensors/7/#"}
	claims.Subscribe = []string{"sensors/7/config"}
	token, err := claims.Sign([]byte("an-example-secret-of-at-least-32-bytes"))
	fmt.Println(strings.Count(token, "."), err)
	// Output:
	// 2 <nil>
}
