package main

import (
	"context"
	"io"
	"math/rand/v2"
	"os"

	"github.com/popsub/popsub/nemesis"
)

// chaosCommand runs popsub chaos (package nemesis); its brokers are this
// binary unless --popsub names another.
func chaosCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	cfg, err := parseChaos(args, stderr)
	if err != nil {
		return err
	}
	return nemesis.Run(ctx, cfg, stdout)
}

// parseChaos reads chaos's flags.
func parseChaos(args []string, stderr io.Writer) (nemesis.Config, error) {
	c := nemesis.Defaults
	fs := newFlagSet("popsub chaos", stderr)
	fs.StringVar(&c.Engine, "engine", c.Engine, "bbolt (one broker on a "+
		"bbolt file) or nats (brokers sharing a NATS JetStream log)")
	fs.IntVar(&c.Brokers, "brokers", c.Brokers, "brokers on the shared "+
		"log, with --engine nats")
	fs.IntVar(&c.Replicas, "nats-replicas", c.Replicas, "1 (one NATS "+
		"server) or 3 (a three-node cluster, each topic on all three)")
	fs.StringVar(&c.NATSServer, "nats-server", c.NATSServer, "the "+
		"nats-server program, with --engine nats (go install "+
		"github.com/nats-io/nats-server/v2@v2.15.2)")
	fs.StringVar(&c.Popsub, "popsub", "", "the popsub program the "+
		"brokers run (default: this one), to try another version")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long the "+
		"nemesis injects faults")
	fs.DurationVar(&c.Every, "every", c.Every, "the mean time between "+
		"faults")
	fs.DurationVar(&c.NATSEvery, "nats-every", c.NATSEvery, "with "+
		"--engine nats, also kill the NATS server every this long to "+
		"twice as long, beside the other faults (0: NATS kills are drawn "+
		"with them)")
	fs.DurationVar(&c.Drain, "drain", c.Drain, "how long the clients "+
		"have to finish after the last fault")
	fs.Uint64Var(&c.Seed, "seed", 0, "the nemesis's seed (default: a "+
		"random one, printed)")
	fs.IntVar(&c.Topics, "topics", c.Topics, "topics, each with a "+
		"durable and a plain subscriber")
	fs.IntVar(&c.Publishers, "publishers", c.Publishers, "publishers, "+
		"over the topics")
	fs.IntVar(&c.Window, "window", c.Window, "unconfirmed publishes each "+
		"publisher may have")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "new values per second per "+
		"publisher (0: as fast as the window allows)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Popsub == "" {
		self, err := os.Executable()
		if err != nil {
			return c, err
		}
		c.Popsub = self
	}
	return c, nil
}
