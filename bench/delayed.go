package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/coder/websocket"
)

// delayedPerToken is how many delayed messages one token publishes to
// its topic: the default bound on what waits for a topic and a token
// (popsub.DefaultMaxDelayed).
const delayedPerToken = 10_000

// runDelayed publishes cfg.Delayed QoS 1 messages due in an hour, from a
// connection and to a topic of its own for each 10,000, and waits for
// every confirm; then it reads the server's CPU over cfg.IdleWatch, with
// nothing due. What it measures is what waiting costs: finding what is
// due should cost nothing for messages that are not.
func runDelayed(ctx context.Context, cfg Config,
	server *benchServer) (Result, error) {
	for i := 0; i*delayedPerToken < cfg.Delayed; i++ {
		n := min(delayedPerToken, cfg.Delayed-i*delayedPerToken)
		if err := publishDelayed(ctx, cfg, i, n); err != nil {
			return Result{}, err
		}
	}
	// The confirms are in; the commits they waited for are done. The
	// watch starts after a second, so that nothing of the publishing is
	// counted.
	time.Sleep(time.Second)
	before, start := server.cpu(), time.Now()
	select {
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-time.After(cfg.IdleWatch):
	}
	used, seconds := server.cpu()-before, time.Since(start).Seconds()
	tokens := (cfg.Delayed + delayedPerToken - 1) / delayedPerToken
	return Result{DelayedWaiting: cfg.Delayed, Seconds: seconds,
		ServerIdleCorePct: 100 * used.Seconds() / seconds,
		ServerPeakRSSMiB:  server.peakMemory() / 1024,
		Publishers:        tokens, Topics: tokens, PayloadBytes: cfg.Size,
		QoS: 1}, nil
}

// publishDelayed publishes n messages due in an hour as token i, to
// topic delayed/<i>, 64 a frame, and reads every confirm.
func publishDelayed(ctx context.Context, cfg Config, i, n int) error {
	name := "delayed-" + strconv.Itoa(i)
	ws, err := benchDial(ctx, cfg, name, i, true)
	if err != nil {
		return err
	}
	defer ws.CloseNow()
	confirmed := make(chan error, 1)
	go func() { confirmed <- readConfirms(ctx, ws, n) }()
	payload := bytes.Repeat([]byte("x"), cfg.Size)
	var frame []byte
	for k := range n {
		if len(frame) > 0 {
			frame = append(frame, '\n')
		}
		frame = fmt.Appendf(frame, `{"type":"publish","topic":"delayed/%d",`+
			`"qos":1,"delay_ms":3600000,"message_id":"%s-%d",`+
			`"payload":%q}`, i, name, k, payload)
		if (k+1)%64 == 0 || k == n-1 {
			if err := ws.Write(ctx, websocket.MessageText, frame); err != nil {
				return err
			}
			frame = frame[:0]
		}
	}
	return <-confirmed
}

// readConfirms reads until n publishes are confirmed, and fails on the
// first error frame: a delayed publish refused is a bound the measure
// did not mean to reach.
func readConfirms(ctx context.Context, ws *websocket.Conn, n int) error {
	for n > 0 {
		_, data, err := ws.Read(ctx)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte(`"type":"error"`)) {
			return errors.New("refused: " + string(data))
		}
		n -= bytes.Count(data, []byte(`"type":"published"`))
	}
	return nil
}
