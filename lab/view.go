package lab

import (
	"fmt"
	"slices"
	"strings"
)

// # What the page shows
//
// View is the run at one moment, as the page draws it: every state in it
// is one the page can say in a sentence. The logs and cursors are read
// from the disk, as a restarted broker would read them; what each client
// holds is the client's own view, as a real client's would be.

// View is the run now.
type View struct {
	// Now is the run's time, in milliseconds since it began.
	Now int64 `json:"now"`
	// Broker is running, paused, down or closed.
	Broker  string       `json:"broker"`
	Clients []ClientView `json:"clients"`
	Topics  []TopicView  `json:"topics"`
	Cursors []CursorView `json:"cursors"`
	Events  []Event      `json:"events"`
	Checks  []Check      `json:"promises"`
}

// ClientView is one client as it sees itself.
type ClientView struct {
	Name      string `json:"name"`
	Connected bool   `json:"connected"`
	Reading   bool   `json:"reading"`
	Holding   bool   `json:"holding"`
	// Subs says each subscription in a few words.
	Subs []string `json:"subs"`
	// Held are its deliveries waiting for an ack it holds; Unconfirmed
	// its QoS 1 publishes waiting for a confirm.
	Held        []heldAck `json:"held"`
	Unconfirmed []string  `json:"unconfirmed"`
}

// TopicView is one topic's log on the disk.
type TopicView struct {
	Name string `json:"name"`
	// Head is the stored head: the newest seq, or the end of the block
	// reserved; a broker restarted now goes on after it.
	Head     uint64        `json:"head"`
	Messages []MessageView `json:"messages"`
}

// MessageView is one message on the disk.
type MessageView struct {
	Seq    uint64 `json:"seq"`
	ID     string `json:"id"`
	Synced bool   `json:"synced"`
}

// CursorView is one durable cursor or group cursor on the disk.
type CursorView struct {
	Name string `json:"name"`
	Seq  uint64 `json:"seq"`
}

// View returns the run now.
func (l *Lab) View() View {
	logs, heads, cursors := l.currentDisk().picture()
	promises := l.promises(logs)
	l.mu.Lock()
	v := View{Now: l.now(), Broker: l.state, Checks: promises,
		Events: slices.Clone(l.events)}
	l.mu.Unlock()
	for _, c := range l.clientList() {
		v.Clients = append(v.Clients, c.view())
	}
	for _, topic := range sortedTopics(heads) {
		t := TopicView{Name: topic, Head: heads[topic]}
		for _, m := range logs[topic] {
			t.Messages = append(t.Messages, MessageView{m.Seq, m.ID, m.synced})
		}
		v.Topics = append(v.Topics, t)
	}
	for _, key := range sortedTopics(cursors) {
		v.Cursors = append(v.Cursors, CursorView{cursorName(key),
			cursors[key]})
	}
	return v
}

// cursorName makes a cursor's key readable: its parts, which the store
// joins with a NUL, joined with a slash.
func cursorName(key string) string {
	return strings.Join(strings.FieldsFunc(key, func(r rune) bool {
		return r < ' '
	}), " / ")
}

// view returns what the client holds now.
func (c *client) view() ClientView {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := ClientView{Name: c.name, Connected: c.conn != nil,
		Reading: c.stopped == nil, Holding: c.holding,
		Held: slices.Clone(c.held), Unconfirmed: slices.Clone(c.order)}
	for _, s := range c.subs {
		label := s.topic
		switch {
		case s.durable != "":
			label += " (durable " + s.durable + ")"
		case s.group != "":
			label += " (group " + s.group + ")"
		}
		v.Subs = append(v.Subs, label)
	}
	return v
}

// Broken reports whether a promise is broken.
func (v View) Broken() bool {
	return slices.ContainsFunc(v.Checks, func(p Check) bool {
		return p.Violations > 0
	})
}

// marked reports whether a broken promise points at e.
func (v View) marked(e Event) bool {
	for _, p := range v.Checks {
		for _, m := range p.Marks {
			theirs := m.Lane == "" || e.Kind == "message" && e.To == m.Lane
			if theirs && m.Topic == e.Topic && (m.ID != "" && m.ID == e.ID ||
				m.Seq != 0 && m.Seq == e.Seq) {
				return true
			}
		}
	}
	return false
}

// clock formats a run time in milliseconds as seconds.
func clock(ms int64) string {
	return fmt.Sprintf("%.3f s", float64(ms)/1000)
}
