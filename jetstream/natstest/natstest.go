// Package natstest runs NATS servers with JetStream inside a test
// process, on 127.0.0.1, for the tests of the shared log: the engine's
// own, the command's, and the broker's behavioural tests run again on
// JetStream. Only tests import it, so the popsub binary never carries a
// NATS server.
package natstest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs one NATS server with JetStream, its data in a temporary
// folder, and returns it once it takes clients; the test stops it.
func Start(tb testing.TB) *server.Server {
	tb.Helper()
	return Run(tb, &server.Options{Host: "127.0.0.1", Port: -1,
		JetStream: true, StoreDir: tb.TempDir(), NoSigs: true, NoLog: true})
}

// Run starts a NATS server with opts and waits until it takes clients.
func Run(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	ns := start(tb, opts)
	if !ns.ReadyForConnections(10 * time.Second) {
		tb.Fatal("nats server not ready in 10 s")
	}
	return ns
}

// start starts a NATS server with opts, without waiting for it.
func start(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	ns, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("nats server: %v", err)
	}
	go ns.Start()
	tb.Cleanup(ns.Shutdown)
	return ns
}

// Cluster runs three NATS servers with JetStream as one cluster, and
// returns them once JetStream has a leader that sees all three, so that
// a stream can have three replicas.
func Cluster(tb testing.TB) []*server.Server {
	tb.Helper()
	// Each node is told every node's route, so the cluster forms
	// whichever starts first; the ports are picked free beforehand.
	var routes []*url.URL
	ports := make([]int, 3)
	for i := range ports {
		for ports[i] == 0 || slices.Contains(ports[:i], ports[i]) {
			ports[i] = FreePort(tb)
		}
		routes = append(routes, &url.URL{Scheme: "nats",
			Host: fmt.Sprintf("127.0.0.1:%d", ports[i])})
	}
	// A clustered node takes clients only once its JetStream has peers,
	// so all three start before any is waited for.
	var nodes []*server.Server
	for i, port := range ports {
		nodes = append(nodes, start(tb, &server.Options{
			ServerName: fmt.Sprint("n", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: tb.TempDir(), NoSigs: true,
			NoLog: true, Routes: routes,
			Cluster: server.ClusterOpts{Name: "popsub", Host: "127.0.0.1",
				Port: port}}))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		if !n.ReadyForConnections(30 * time.Second) {
			tb.Fatal("nats node not ready in 30 s")
		}
	}
	for !hasLeader(nodes) {
		if time.Now().After(deadline) {
			tb.Fatal("nats cluster has no JetStream leader in 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nodes
}

// hasLeader reports whether the nodes' JetStream has elected a leader
// that sees every node online.
func hasLeader(nodes []*server.Server) bool {
	for _, n := range nodes {
		if !n.JetStreamIsCurrent() {
			return false
		}
	}
	for _, n := range nodes {
		if n.JetStreamIsLeader() {
			return len(n.JetStreamClusterPeers()) == len(nodes)
		}
	}
	return false
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago,
// picked below Linux's ephemeral range (32768 and up). A port the kernel
// picked itself, for a listener on port 0, goes back to that range, where
// any outgoing connection or other listener may take it before the
// caller binds it again: a node of Cluster then could not listen for
// routes and never became ready (a CI run, with the other packages'
// tests dialling beside it).
func FreePort(tb testing.TB) int {
	tb.Helper()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", fmt.Sprint("127.0.0.1:", port))
		if err == nil {
			l.Close()
			return port
		}
	}
	tb.Fatal("no free port on 127.0.0.1 between 20000 and 32000")
	return 0
}
