// Command compare measures PopSub beside NATS with JetStream and
// centrifuge with one client of its own, independent of PopSub's code:
// the same payload, window and subscribers against each server, and the
// server's CPU time per delivery read from /proc. It is a module of its
// own, so that the broker's module does not depend on either server.
//
//	go run . run --popsub $(go env GOPATH)/bin/popsub
//	go run . latency --popsub $(go env GOPATH)/bin/popsub
//	go run . confirms --popsub $(go env GOPATH)/bin/popsub
//	go run . idle --popsub $(go env GOPATH)/bin/popsub
//	go run . names --popsub $(go env GOPATH)/bin/popsub [--nats] [--publish [--keep]]
//
// It starts each server as a child process on 127.0.0.1, and never
// loads any other host.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	centrifugeserver "github.com/centrifugal/centrifuge"
	natsserver "github.com/nats-io/nats-server/v2/server"
)

// main dispatches: run measures, the others serve as its children.
func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compare run --popsub BIN")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "nats-server":
		// Then "always" to sync every write, "sync=DURATION" to sync at
		// that interval, "ws=ADDR" for WebSocket.
		syncAlways, websocket, every := false, "", time.Duration(0)
		for _, arg := range os.Args[4:] {
			syncAlways = syncAlways || arg == "always"
			if d, ok := strings.CutPrefix(arg, "sync="); ok {
				every, _ = time.ParseDuration(d)
			} else {
				websocket = cmp.Or(strings.TrimPrefix(arg, "ws="), websocket)
			}
		}
		err = serveNATS(os.Args[2], os.Args[3], syncAlways, every, websocket)
	case "centrifuge-server":
		err = serveCentrifuge(os.Args[2])
	case "run":
		err = runAll(os.Args[2:])
	case "latency":
		err = runLatency(os.Args[2:])
	case "confirms":
		err = runConfirms(os.Args[2:])
	case "idle":
		err = runIdle(os.Args[2:])
	case "names":
		err = runNames(os.Args[2:])
	case "idle-clients":
		if len(os.Args) != 6 {
			err = errors.New("usage: compare idle-clients URL TOKEN N SOURCE")
			break
		}
		err = runIdleClients(os.Args[2], os.Args[3], os.Args[4], os.Args[5])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// serveNATS runs a NATS server with JetStream on file storage until
// SIGINT; with syncAlways, it syncs every write before it acknowledges
// (sync_interval: always), PopSub's promise for a QoS 1 publish; with
// every, it syncs at that interval (sync_interval, two minutes unless
// set); with a websocket address, it takes WebSocket clients there too,
// without TLS.
func serveNATS(addr, dir string, syncAlways bool, every time.Duration,
	websocket string) error {
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	options := &natsserver.Options{Host: host, Port: p,
		JetStream: true, StoreDir: dir, NoSigs: true,
		SyncAlways: syncAlways, SyncInterval: every}
	if websocket != "" {
		wsHost, wsPort, _ := net.SplitHostPort(websocket)
		options.Websocket.Host = wsHost
		options.Websocket.Port, _ = strconv.Atoi(wsPort)
		options.Websocket.NoTLS = true
	}
	ns, err := natsserver.NewServer(options)
	if err != nil {
		return err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server did not start")
	}
	waitForSignal()
	ns.Shutdown()
	return nil
}

// serveCentrifuge runs a centrifuge node that lets anyone connect,
// subscribe and publish, until SIGINT.
func serveCentrifuge(addr string) error {
	node, err := centrifugeserver.New(centrifugeserver.Config{
		LogLevel: centrifugeserver.LogLevelError})
	if err != nil {
		return err
	}
	node.OnConnecting(func(context.Context, centrifugeserver.ConnectEvent) (
		centrifugeserver.ConnectReply, error) {
		return centrifugeserver.ConnectReply{
			Credentials: &centrifugeserver.Credentials{UserID: "bench"}}, nil
	})
	node.OnConnect(func(client *centrifugeserver.Client) {
		client.OnSubscribe(func(_ centrifugeserver.SubscribeEvent,
			cb centrifugeserver.SubscribeCallback) {
			cb(centrifugeserver.SubscribeReply{}, nil)
		})
		client.OnPublish(func(_ centrifugeserver.PublishEvent,
			cb centrifugeserver.PublishCallback) {
			cb(centrifugeserver.PublishReply{}, nil)
		})
	})
	if err := node.Run(); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/connection/websocket", centrifugeserver.NewWebsocketHandler(
		node, centrifugeserver.WebsocketConfig{}))
	// The server API: how centrifuge's applications publish, from their
	// backend (Centrifugo's HTTP API batches the same way): n copies of
	// the body, on bench.
	mux.HandleFunc("POST /publish", func(w http.ResponseWriter,
		r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		data, _ := io.ReadAll(r.Body)
		for range n {
			if _, err := node.Publish("bench", data); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
		}
	})
	go http.ListenAndServe(addr, mux)
	waitForSignal()
	return nil
}

// waitForSignal blocks until SIGINT or SIGTERM.
func waitForSignal() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	<-signals
}
