package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runLatency publishes at fixed rates and prints, for each server, the
// time from publish to delivery at each subscriber, the server's CPU
// per delivery, and this client's: the client shares the cores, and a
// protocol that costs it more leaves the server less. Every message is
// published on its own, when it is due: an open loop, as a sensor or a
// chat would publish, not a burst.
func runLatency(args []string) error {
	fs := flag.NewFlagSet("compare latency", flag.ContinueOnError)
	f := addFlags(fs)
	rates := fs.String("rates", "1000,10000", "messages per second")
	n := fs.Int("subscribers", 10, "subscribers")
	one := fs.String("setup", "", "measure only the setup of this exact "+
		"name, at one rate, and print its row alone (a child's part)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n < 1 {
		return fmt.Errorf("--subscribers must be at least 1")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *one != "" {
		return measureLatencyRow(*f.popsub, self, *one, *rates, *n,
			*f.duration)
	}
	fmt.Println("| server | msg/s held | p50 | p90 | p99 | max | p99 of each subscriber, lowest–highest | server CPU per delivery | client CPU per delivery |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	// Each setup and rate is measured by a process of its own: in one
	// process, a setup that fell behind (centrifuge's client at 10,000
	// a second) left goroutines still publishing, and its heap, to the
	// setup after it, whose p99 at 1,000 a second went from 1.0–1.1 ms
	// alone to 2.4–3.7.
	for _, s := range setups(*f.popsub, self, *f.only) {
		if strings.Contains(s.name, "batch") {
			continue // one message a frame: batches add nothing here
		}
		for _, rate := range strings.Split(*rates, ",") {
			child := exec.Command(self, "latency", "--popsub", *f.popsub,
				"--setup", s.name, "--rates", rate, "--subscribers",
				strconv.Itoa(*n), "--duration", f.duration.String())
			child.Stdout, child.Stderr = os.Stdout, os.Stderr
			if err := child.Run(); err != nil {
				return fmt.Errorf("%s at %s/s: %w", s.name, rate, err)
			}
		}
	}
	return nil
}

// measureLatencyRow measures the setup named name at rate, and prints
// its row of the table.
func measureLatencyRow(popsub, self, name, rate string, n int,
	duration time.Duration) error {
	perSecond, err := strconv.ParseFloat(rate, 64)
	if err != nil {
		return fmt.Errorf("--rates: %w", err)
	}
	named := setups(popsub, self, name)
	i := slices.IndexFunc(named, func(s setup) bool { return s.name == name })
	if i < 0 {
		return fmt.Errorf("no setup is named %q", name)
	}
	l, err := measureLatency(named[i], n, perSecond, duration)
	if err != nil {
		return fmt.Errorf("%s at %s/s: %w", name, rate, err)
	}
	fmt.Printf("| %s | %.0f | %s | %s | %s | %s | %s–%s | %.2f µs | %.2f µs |\n",
		name, l.rate, ms(l.at(0.5)), ms(l.at(0.9)), ms(l.at(0.99)),
		ms(l.at(1)), ms(slices.Min(l.each)), ms(slices.Max(l.each)),
		l.cpu, l.client)
	return nil
}

// latencies are one run's: the rate the publisher held (under the one
// asked for when a publish takes longer than the time between two);
// the publish-to-delivery times, sorted; each subscriber's p99 (alike
// when the tail delays whole messages, higher for some when a server
// serves its subscribers in turn); and the server's and this client's
// CPU µs per delivery.
type latencies struct {
	rate        float64
	sorted      []time.Duration
	each        []time.Duration
	cpu, client float64
}

// at is the q-quantile.
func (l latencies) at(q float64) time.Duration {
	if len(l.sorted) == 0 {
		return 0
	}
	return l.sorted[min(len(l.sorted)-1, int(q*float64(len(l.sorted))))]
}

// ms writes d in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// measureLatency starts s's server, connects n subscribers, publishes
// 64-byte messages carrying their send time at rate for duration, and
// collects every delivery's latency, but for the first second's, while
// connections warm up.
func measureLatency(s setup, n int, rate float64,
	duration time.Duration) (latencies, error) {
	var l latencies
	t, pid, stop, err := launch(s)
	if err != nil {
		return l, err
	}
	defer stop()

	// Each subscriber keeps its own samples, with room for every one
	// made up front: growing a slice would copy megabytes while
	// deliveries wait to be timed.
	var mu sync.Mutex
	got := 0
	each := make([][]time.Duration, n)
	start := time.Now()
	warm := start.Add(time.Second).UnixNano()
	for i := range n {
		each[i] = make([]time.Duration, 0,
			int(rate*(duration+time.Second).Seconds()))
		err := t.subscribe(func(payload []byte) {
			sent := sentAt(payload)
			if sent < warm {
				return
			}
			took := time.Duration(time.Now().UnixNano() - sent)
			mu.Lock()
			each[i] = append(each[i], took)
			got++
			mu.Unlock()
		})
		if err != nil {
			return l, err
		}
	}
	before, clientBefore := cpuTime(pid), cpuTime(os.Getpid())
	publishing := time.Now()
	published, err := publishAtRate(t, rate, duration+time.Second)
	if err != nil {
		return l, err
	}
	l.rate = float64(published) / time.Since(publishing).Seconds()
	want := int(float64(published)*float64(n)*duration.Seconds()/
		(duration+time.Second).Seconds()) * 99 / 100
	for drain := time.Now(); time.Since(drain) < 5*time.Second; {
		mu.Lock()
		enough := got >= want
		mu.Unlock()
		if enough {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cpu, client := cpuTime(pid)-before, cpuTime(os.Getpid())-clientBefore
	mu.Lock()
	defer mu.Unlock()
	for _, one := range each {
		slices.Sort(one)
		l.each = append(l.each, latencies{sorted: one}.at(0.99))
	}
	l.sorted = slices.Concat(each...)
	slices.Sort(l.sorted)
	l.cpu = float64(cpu.Microseconds()) / float64(published*n)
	l.client = float64(client.Microseconds()) / float64(published*n)
	return l, nil
}

// publishAtRate publishes one message whenever the next is due, and
// returns how many it published.
func publishAtRate(t target, rate float64, duration time.Duration) (int,
	error) {
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	pad := strings.Repeat("x", 64-len(`{"t":1796000000000000000,"x":""}`))
	i := 0
	for ; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		if due.Sub(start) >= duration {
			return i, nil
		}
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		payload := fmt.Appendf(nil, `{"t":%d,"x":"%s"}`,
			time.Now().UnixNano(), pad)
		if err := t.publish(1, payload); err != nil {
			return i, err
		}
	}
}

// sentAt reads the send time out of a payload, or of the frame that
// carries it.
func sentAt(data []byte) int64 {
	i := bytes.Index(data, []byte(`"t":`))
	if i < 0 {
		return 0
	}
	rest := data[i+4:]
	end := bytes.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	v, _ := strconv.ParseInt(string(rest[:end]), 10, 64)
	return v
}
