package popsub_test

import (
	"log/slog"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/boltstore"
)

// init hands popsub's own tests the bbolt store (harness_test.go says why
// they take it this way).
func init() {
	popsub.OpenBolt = func(path string, logger *slog.Logger) (popsub.Store,
		error) {
		return boltstore.Open(path, logger)
	}
}
