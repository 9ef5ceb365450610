package main

import "testing"

func TestXray_FollowsAQoS1Delivery(t *testing.T) {
	x := newXray()
	x.apply(event{Kind: "connected", Conn: 1, Client: "alice", Sub: "local"})
	x.apply(event{Kind: "subscribed", Conn: 1, Client: "alice",
		Topic: "jobs"})
	x.apply(event{Kind: "published", Topic: "jobs", Seq: 1, QoS: 1,
		MessageID: "m"})
	delivered := event{Kind: "delivered", Conn: 1, Topic: "jobs", Seq: 1,
		QoS: 1, MessageID: "m", Attempt: 1}
	x.apply(delivered)
	if x.topics["jobs"] != 1 || len(x.pending) != 1 {
		t.Fatalf("after delivery: topics %v, pending %v", x.topics, x.pending)
	}
	delivered.Kind, delivered.Attempt = "redelivered", 2
	x.apply(delivered)
	if p := x.sortedPending(); len(p) != 1 || p[0].Attempt != 2 {
		t.Fatalf("after retry: pending %v, want attempt 2", p)
	}
	delivered.Kind = "dead_lettered"
	x.apply(delivered)
	if len(x.pending) != 0 || len(x.dead) != 1 {
		t.Fatalf("after dead letter: pending %v, dead %v", x.pending, x.dead)
	}
	x.apply(event{Kind: "disconnected", Conn: 1})
	if len(x.connections) != 0 || len(x.timeline) != 7 {
		t.Fatalf("connections %v, timeline %d", x.connections,
			len(x.timeline))
	}
}

func TestXray_SnapshotReplacesState(t *testing.T) {
	x := newXray()
	x.apply(event{Kind: "connected", Conn: 9})
	var snap event
	snap.Kind = "snapshot"
	if err := jsonUnmarshal(`{"event":"snapshot","state":{"topics":{"a":3},
		"connections":[{"conn":2,"sub":"bob","subscriptions":["a"]}],
		"pending":[{"conn":2,"topic":"a","seq":3,"message_id":"x","qos":1,
		"attempt":1}]}}`, &snap); err != nil {
		t.Fatal(err)
	}
	x.apply(snap)
	if x.topics["a"] != 3 || x.connections[9] != nil ||
		x.connections[2].subscriptions[0] != "a" || len(x.pending) != 1 {
		t.Fatalf("after snapshot: %+v", x)
	}
}
