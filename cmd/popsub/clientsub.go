package main

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// subCommand subscribes to a topic and prints each delivery as one JSON
// line on stdout, acking QoS 1 (or, with --nak, handing it back). Other
// frames go to stderr.
func subCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	var cf clientFlags
	fs := newFlagSet("popsub client sub", stderr)
	cf.add(fs)
	after := fs.Int64("after", -1, "replay only messages with seq > N")
	last := fs.Int64("last", -1, "replay only the newest N messages")
	durable := fs.String("durable", "", "durable subscription name")
	group := fs.String("group", "", "join this work queue: each message "+
		"goes to one member of the group")
	count := fs.Int("count", 0, "exit after N messages (0: run until ^C)")
	noAck := fs.Bool("no-ack", false, "do not ack QoS 1 deliveries")
	nak := fs.Bool("nak", false, "hand each QoS 1 delivery back with a "+
		"nak, to be retried after the broker's backoff")
	nakDelay := fs.Duration("nak-delay", -1, "with a nak, retry after "+
		"this long instead (implies --nak)")
	topics, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(topics) != 1 {
		return errors.New("usage: popsub client sub TOPIC [flags]")
	}

	request := map[string]any{"type": "subscribe", "topic": topics[0]}
	if *after >= 0 {
		request["after"] = *after
	}
	if *last >= 0 {
		request["last"] = *last
	}
	if *durable != "" {
		request["durable"] = *durable
	}
	if *group != "" {
		request["group"] = *group
	}
	s, err := connect(ctx, cf)
	if err != nil {
		return err
	}
	defer s.close()
	if err := s.send(ctx, request); err != nil {
		return err
	}
	settle := map[string]any{"type": "ack"}
	switch {
	case *noAck:
		settle = nil
	case *nakDelay >= 0:
		settle = map[string]any{"type": "nak",
			"delay_ms": nakDelay.Milliseconds()}
	case *nak:
		settle = map[string]any{"type": "nak"}
	}
	return printDeliveries(ctx, s, *count, settle, stdout, stderr)
}

// printDeliveries prints deliveries until count (0: until ctx ends),
// and answers each QoS 1 one with settle (an ack or a nak frame, which
// gets its message_id and topic), unless settle is nil.
func printDeliveries(ctx context.Context, s *session, count int,
	settle map[string]any, stdout, stderr io.Writer) error {
	for received := 0; count == 0 || received < count; {
		f, data, err := s.read(ctx)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		if f.Type != "message" {
			fmt.Fprintf(stderr, "%s\n", data)
			if f.Type == "error" {
				return fmt.Errorf("broker said: %s (%s)", f.Message, f.Code)
			}
			continue
		}
		fmt.Fprintf(stdout, "%s\n", data)
		received++
		if settle != nil && f.QoS == 1 {
			settle["message_id"], settle["topic"] = f.MessageID, f.Topic
			if err := s.send(ctx, settle); err != nil {
				return err
			}
		}
	}
	return nil
}

// pubCommand publishes one message. With --qos 1 it prints the confirm;
// with QoS 0 it waits for a pong so the message was at least read.
func pubCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	var cf clientFlags
	fs := newFlagSet("popsub client pub", stderr)
	cf.add(fs)
	qos := fs.Int("qos", 0, "0: at most once; 1: at least once, confirmed")
	id := fs.String("id", "", "message_id (the broker makes one if empty)")
	ttl := fs.Duration("ttl", 0, "deliver it only this long from now "+
		"(0: for as long as the log keeps it)")
	delay := fs.Duration("delay", 0, "deliver it this long from now, not "+
		"before (needs --qos 1; it waits in $delayed/TOPIC)")
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 2 {
		return errors.New("usage: popsub client pub TOPIC PAYLOAD [flags]; " +
			"a payload that starts with - goes after --")
	}
	s, err := connect(ctx, cf)
	if err != nil {
		return err
	}
	defer s.close()

	payload, err := payloadJSON(positional[1], stderr)
	if err != nil {
		return err
	}
	request := map[string]any{"type": "publish", "topic": positional[0],
		"payload": payload, "qos": *qos}
	if *id != "" {
		request["message_id"] = *id
	}
	if *ttl != 0 {
		request["ttl_ms"] = ttl.Milliseconds()
	}
	if *delay != 0 {
		request["delay_ms"] = delay.Milliseconds()
	}
	if err := s.send(ctx, request); err != nil {
		return err
	}
	if *qos == 0 {
		if err := s.send(ctx, map[string]any{"type": "ping"}); err != nil {
			return err
		}
	}
	return awaitConfirm(ctx, s, stdout)
}

// awaitConfirm waits for published (printed) or pong, failing on error.
func awaitConfirm(ctx context.Context, s *session, stdout io.Writer) error {
	for {
		f, data, err := s.read(ctx)
		if err != nil {
			return err
		}
		switch f.Type {
		case "published":
			fmt.Fprintf(stdout, "%s\n", data)
			return nil
		case "pong":
			return nil
		case "error":
			return fmt.Errorf("broker said: %s (%s)", f.Message, f.Code)
		}
	}
}
