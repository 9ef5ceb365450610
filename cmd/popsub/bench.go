package main

import (
	"context"
	"io"
	"os"
	"strings"

	"github.com/popsub/popsub/bench"
)

// benchCommand runs popsub bench (package bench): the servers it starts,
// and the bystander's process, are this binary.
func benchCommand(ctx context.Context, args []string, stdout,
	stderr io.Writer) error {
	cfg, err := parseBench(args, stderr)
	if err != nil {
		return err
	}
	if cfg.Popsub, err = os.Executable(); err != nil {
		return err
	}
	return bench.Run(ctx, cfg, stdout, stderr)
}

// parseBench reads bench's flags.
func parseBench(args []string, stderr io.Writer) (bench.Config, error) {
	c := bench.Defaults
	fs := newFlagSet("popsub bench", stderr)
	fs.StringVar(&c.URL, "url", "", "server to load, or several separated "+
		"by commas, which connections take in turn (default: start one on "+
		"127.0.0.1 and measure its CPU and memory)")
	fs.IntVar(&c.Brokers, "brokers", c.Brokers, "brokers to start, sharing the "+
		"log on --nats; connections take them in turn")
	fs.StringVar(&c.NATS, "nats", "", "the brokers bench starts keep the "+
		"log on NATS JetStream at this URL (their CPU is measured, the NATS "+
		"server's is not)")
	secret := secretFlag(fs, "secret", "POPSUB_SECRET",
		"the server's secret, to sign tokens")
	token := secretFlag(fs, "token", "POPSUB_TOKEN",
		"a token to use when the secret is unknown")
	fs.IntVar(&c.Publishers, "publishers", c.Publishers, "publishing connections")
	fs.IntVar(&c.Subscribers, "subscribers", c.Subscribers, "subscribing connections")
	fs.IntVar(&c.Topics, "topics", c.Topics, "topics; each subscriber takes them all")
	fs.IntVar(&c.Size, "size", c.Size, "payload bytes")
	fs.IntVar(&c.QoS, "qos", 0, "0 or 1 (subscribers ack QoS 1)")
	fs.Float64Var(&c.Rate, "rate", 0, "messages per second for all "+
		"publishers; 0: as fast as the slowest subscriber allows")
	fs.IntVar(&c.Window, "window", c.Window, "most messages a publisher may be "+
		"ahead of the slowest subscriber; 0: open loop, as fast as the "+
		"server reads")
	fs.IntVar(&c.Burst, "burst", 0, "publish this many messages in all, "+
		"then stop (with --window 0: an open-loop burst)")
	fs.IntVar(&c.Stuck, "stuck", 0, "subscribers that never read, beside "+
		"the others")
	fs.BoolVar(&c.Bystander, "bystander", false, "a QoS 1 publisher on "+
		"another topic, every 10ms: its confirm latency")
	fs.BoolVar(&c.BystanderOnly, "bystander-only", false, "instead, be "+
		"only the bystander, against --url, until interrupted, and print "+
		"each confirm's latency in µs (--bystander runs one so, in a "+
		"process of its own, so that the bench's readers do not delay it)")
	fs.DurationVar(&c.Duration, "duration", c.Duration,
		"how long to publish")
	fs.IntVar(&c.Idle, "idle", 0, "instead, open N idle connections "+
		"subscribed to one topic, report server memory per connection, "+
		"and time one publish reaching them all")
	fs.DurationVar(&c.IdleWatch, "idle-watch", c.IdleWatch, "with "+
		"--idle, then watch the server's memory this long, through a "+
		"round of its pings (every 20 s by default), and report its most")
	fs.IntVar(&c.Delayed, "delayed", 0, "instead, publish N QoS 1 "+
		"messages due in an hour (10,000 a token and a topic) and report "+
		"the server's CPU over --idle-watch while none is due")
	fs.BoolVar(&c.IdleTopicEach, "idle-topic-each", false, "with --idle, "+
		"each connection subscribes to a topic of its own, and the "+
		"publish is one to each")
	fs.BoolVar(&c.Batch, "batch", c.Batch, "several messages a frame: "+
		"publishers send up to 64, subscribers take runs and ack many at once")
	fs.StringVar(&c.Flood, "flood", "", "instead, run one of the doors' "+
		"floods ("+strings.Join(bench.Floods, ", ")+") with a bystander "+
		"publishing beside it, and report the server's peak memory")
	fs.IntVar(&c.Connections, "connections", c.Connections, "the flood's "+
		"connections")
	fs.BoolVar(&c.JSON, "json", false, "print the summary as JSON")
	fs.BoolVar(&c.AllowRemote, "allow-remote", false, "allow a target that "+
		"is not this machine")
	if _, err := parseInterleaved(fs, args); err != nil {
		return c, err
	}
	c.Secret, c.Token = secret(""), token("")
	return c, nil
}
