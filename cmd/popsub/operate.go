package main

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/popsub/popsub"
	"github.com/popsub/popsub/wire"
)

// This file is what an operator's tools see of a running broker:
// /metrics in the Prometheus text format, /healthz and /readyz. The
// broker knows nothing of Prometheus: it reports each x-ray event, and
// each commit of its log, to Options.OnEvent, and this file counts them;
// what comes once a message or more, the broker counts itself (Counted),
// and this file reads at each scrape.

// operations serves the operator's endpoints of one broker.
type operations struct {
	registry *prometheus.Registry
	// counters are the counts by event kind, made once: a lookup in a
	// map nobody writes costs less, per delivery, than a labelled
	// counter's hash.
	counters      map[string]prometheus.Counter
	connections   prometheus.Gauge
	subscriptions prometheus.Gauge
	commitTime    prometheus.Histogram
	commitSize    prometheus.Histogram
	// handshakes counts TLS handshakes that failed, which the log sums
	// up once a second.
	handshakes prometheus.Counter

	store    popsub.Store // asked by /readyz whether the log answers
	stopping atomic.Bool  // set once a shutdown begins
	// commitFailed is the last commit's failure, while no commit has
	// succeeded since; now is the clock, which a test may set.
	commitFailed atomic.Pointer[commitFailure]
	now          func() time.Time
}

// commitFailure is why a commit of the log failed, and when.
type commitFailure struct {
	why string
	at  time.Time
}

// failureShown is how long /readyz answers 503 after a commit failed,
// unless one succeeds first. Only traffic commits: a balancer that sends
// none to a broker that is not ready would never see its log recover (a
// full disk freed), so after this the broker says it is ready again, and
// the next publish tells.
const failureShown = 30 * time.Second

// counted are the events counted, with their metrics' names and help.
var counted = []struct{ kind, name, help string }{
	{"redelivered", "popsub_redelivered_total",
		"QoS 1 retries, to the subscriber or to another member of its group"},
	{"nakked", "popsub_nakked_total",
		"QoS 1 deliveries handed back with a nak"},
	{"moved", "popsub_moved_total",
		"group deliveries taken from the member that owed them"},
	{"acked", "popsub_acked_total", "QoS 1 deliveries acked"},
	{"dead_lettered", "popsub_dead_lettered_total",
		"QoS 1 deliveries dead-lettered: out of retries, expired, or nakked dead"},
	{"disconnected_slow", "popsub_cut_off_total",
		"connections cut off with 4008"},
}

// newOperations makes the metrics of a broker that does not exist yet:
// its options need observe before New.
func newOperations(store popsub.Store) *operations {
	o := &operations{registry: prometheus.NewRegistry(), store: store,
		counters: map[string]prometheus.Counter{}, now: time.Now}
	for _, c := range counted {
		o.counters[c.kind] = prometheus.NewCounter(prometheus.CounterOpts{
			Name: c.name, Help: c.help})
		o.registry.MustRegister(o.counters[c.kind])
	}
	o.connections = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "popsub_connections", Help: "authenticated connections"})
	o.subscriptions = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "popsub_subscriptions",
		Help: "subscriptions to ordinary topics and filters"})
	o.commitTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "popsub_commit_seconds", Help: "time to commit one batch " +
			"of the log, its syncs included",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14)})
	o.commitSize = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "popsub_commit_messages", Help: "messages in one batch",
		Buckets: prometheus.ExponentialBuckets(1, 4, 7)})
	o.handshakes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "popsub_tls_handshake_errors_total",
		Help: "TLS handshakes that failed: scans, and clients that hung up"})
	o.registry.MustRegister(o.connections, o.subscriptions, o.commitTime,
		o.commitSize, o.handshakes, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return o
}

// observe counts one event. It runs on the broker's goroutines.
func (o *operations) observe(e wire.Event) {
	if counter := o.counters[e.Kind]; counter != nil {
		counter.Inc()
		return
	}
	switch e.Kind {
	case "connected":
		o.connections.Inc()
	case "disconnected":
		o.connections.Dec()
	case "subscribed":
		o.subscriptions.Inc()
	case "unsubscribed":
		o.subscriptions.Dec()
	case "commit":
		o.commitTime.Observe(float64(e.Micros) / 1e6)
		o.commitSize.Observe(float64(e.Messages))
		if e.Reason != "" {
			o.commitFailed.Store(&commitFailure{e.Reason, o.now()})
		} else if o.commitFailed.Load() != nil {
			o.commitFailed.Store(nil)
		}
	}
}

// handshakeFailed counts a failed TLS handshake.
func (o *operations) handshakeFailed() { o.handshakes.Inc() }

// watch adds what is read from the broker at each scrape: the messages
// published, committed and delivered, which the broker counts itself
// rather than reporting each one (Broker.Counted), and the bytes its
// outboxes hold.
func (o *operations) watch(broker *popsub.Broker) {
	// Counted's three counts, in its order.
	for i, metric := range []struct{ name, help string }{
		{"popsub_published_total", "messages given a seq"},
		{"popsub_committed_total", "messages synced to the log"},
		{"popsub_delivered_total",
			"deliveries queued to subscribers, first attempts"},
	} {
		o.registry.MustRegister(prometheus.NewCounterFunc(
			prometheus.CounterOpts{Name: metric.name, Help: metric.help},
			func() float64 {
				published, committed, delivered := broker.Counted()
				return float64([3]uint64{published, committed, delivered}[i])
			}))
	}
	o.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "popsub_outbox_bytes",
		Help: "bytes queued for subscribers' sockets, all connections"},
		func() float64 { return float64(broker.OutboxBytes()) }))
}

// register adds the endpoints to mux.
func (o *operations) register(mux *http.ServeMux) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.registry,
		promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter,
		_ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", o.ready)
}

// ready answers 200 while the broker takes clients and its log answers a
// read and takes writes; 503, with the reason, while it shuts down or the
// log fails: a read fails, or the last commit failed (a full disk), for
// failureShown.
func (o *operations) ready(w http.ResponseWriter, _ *http.Request) {
	if o.stopping.Load() {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
		return
	}
	if f := o.commitFailed.Load(); f != nil &&
		o.now().Sub(f.at) < failureShown {
		http.Error(w, "log refuses writes: "+f.why,
			http.StatusServiceUnavailable)
		return
	}
	if _, _, err := o.store.Cursor("readyz"); err != nil {
		http.Error(w, "log unreadable: "+err.Error(),
			http.StatusServiceUnavailable)
		return
	}
	w.Write([]byte("ready\n"))
}
