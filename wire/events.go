package wire

// Event is one transition of the broker's state, as published on
// $sys/events. Fields that do not apply to an event are left out.
type Event struct {
	// Kind is what happened: published (the message got its seq),
	// committed (it is in the log: a crash keeps it), delivered,
	// redelivered, nakked (handed back, its retry due at Deadline),
	// moved (a group member's delivery, taken for another member),
	// acked, dead_lettered, connected, disconnected,
	// disconnected_slow, subscribed, unsubscribed, or snapshot.
	Kind string `json:"event"`
	// Time is when it happened, in Unix milliseconds.
	Time int64 `json:"time"`
	// Conn numbers the connection (1, 2, …, for the broker's lifetime);
	// Client is the name it gave in its auth frame; Sub is its token's
	// subject.
	Conn   uint64 `json:"conn,omitempty"`
	Client string `json:"client,omitempty"`
	Sub    string `json:"sub,omitempty"`
	// Topic is the message's topic, or the subscription's filter.
	Topic string `json:"topic,omitempty"`
	// Seq, MessageID and QoS identify the message.
	Seq       uint64 `json:"seq,omitempty"`
	MessageID string `json:"message_id,omitempty"`
	QoS       int    `json:"qos,omitempty"`
	// Attempt and Deadline (Unix ms) describe a QoS 1 delivery's pending
	// entry: which attempt went out, and when the next retry is due.
	Attempt  int   `json:"attempt,omitempty"`
	Deadline int64 `json:"deadline,omitempty"`
	// Reason explains a disconnection, a dead letter, or a commit that
	// failed.
	Reason string `json:"reason,omitempty"`
	// Messages and Micros describe a "commit" event: how many messages
	// one batch of the log held, and how long its commit took. Such
	// events go only to Options.OnEvent, never to $sys/events, where
	// each would be a message to commit.
	Messages int   `json:"messages,omitempty"`
	Micros   int64 `json:"micros,omitempty"`
	// State is the whole picture, sent as a snapshot whenever someone
	// subscribes to $sys/events, so a new watcher need not replay history.
	State *State `json:"state,omitempty"`
}

// State is a snapshot of the broker's tables.
type State struct {
	// Topics lists every topic with its head seq.
	Topics map[string]uint64 `json:"topics"`
	// Connections lists the open, authenticated connections.
	Connections []ConnectionState `json:"connections"`
	// Pending lists every QoS 1 delivery awaiting an ack.
	Pending []Event `json:"pending"`
}

// ConnectionState is one connection in a State.
type ConnectionState struct {
	Conn          uint64   `json:"conn"`
	Client        string   `json:"client,omitempty"`
	Sub           string   `json:"sub"`
	Subscriptions []string `json:"subscriptions"`
}
