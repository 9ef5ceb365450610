package popsub_test

import (
	"cmp"
	"fmt"
	"testing"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/jetstream"
	"github.com/popsub/popsub/jetstream/natstest"
)

// TestBehaviour_OnJetStream runs the behavioural tests again with the
// log on NATS JetStream (a server in this process): what a client sees
// must not depend on the engine.
func TestBehaviour_OnJetStream(t *testing.T) {
	ns := natstest.Start(t)

	// Each broker gets a prefix of its own: a fresh log, as a fresh
	// bbolt file is on the default engine.
	logs := 0
	popsub.UseStore(func(t *testing.T,
		opts popsub.Options) func() popsub.Store {
		logs++
		prefix := fmt.Sprint("test", logs)
		return func() popsub.Store {
			log, err := jetstream.Open(jetstream.Options{URL: ns.ClientURL(),
				Prefix: prefix, MaxMessages: opts.MaxMessages,
				MaxAge: opts.TTL, Logger: cmp.Or(opts.Logger, quiet)})
			if err != nil {
				t.Fatalf("open jetstream log: %v", err)
			}
			return log
		}
	})
	defer popsub.UseStore(nil)
	for name, test := range popsub.Behaviour {
		t.Run(name, test)
	}
}
