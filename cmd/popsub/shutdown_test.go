package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/internal/logbuf"
	"github.com/popsub/popsub/memlog"
)

// stuckStore is a log in memory whose Close never returns until told:
// a broker whose shutdown hangs, as one did in CI.
type stuckStore struct {
	*memlog.Store[*popsub.Message]
	release chan struct{}
}

func (s *stuckStore) Close() error {
	<-s.release
	return s.Store.Close()
}

// A shutdown that hangs does not hang serve: it gives up after
// shutdownStuck, says so with every goroutine's stack, and returns an
// error, so that the process exits.
func TestServe_AStuckShutdownEndsWithItsStacks(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		store := &stuckStore{release: make(chan struct{}),
			Store: memlog.New(func(m *popsub.Message) memlog.Record {
				return memlog.Record{Topic: m.Topic, Seq: m.Seq}
			})}
		broker, err := popsub.New(popsub.Options{Store: store,
			Secret: []byte(strings.Repeat("s", 32))})
		if err != nil {
			t.Fatal(err)
		}
		var logs logbuf.Buffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // Ctrl-C at once
		err = serveUntilDone(ctx, listener, http.NotFoundHandler(), broker,
			newOperations(store), logger, func() {})
		if err == nil || !strings.Contains(err.Error(), "did not finish") {
			t.Errorf("serve returned %v, want that the shutdown did not "+
				"finish", err)
		}
		said := logs.String()
		if !strings.Contains(said, "shutdown stuck") ||
			!strings.Contains(said, "stuckStore") {
			t.Errorf("serve's log does not say where it hung:\n%s", said)
		}
		close(store.release)
		synctest.Wait()
	})
}
