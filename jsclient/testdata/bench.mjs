// bench.mjs LIB URL TOKEN COUNT measures popsub.js as an application
// runs it: one publisher and one subscriber, QoS 0, 64-byte payloads,
// the publisher yielding to the event loop every 100 publishes. It
// prints deliveries per second; docs/performance.md says how to read the
// server's CPU beside it. LIB is the client module's path or URL, so
// that two versions can be compared.
//
//	node --experimental-websocket bench.mjs ./popsub.js \
//	  ws://127.0.0.1:8080/ws "$TOKEN" 100000
const [lib, url, token, count] = process.argv.slice(2);
const {connect} = await import(lib);
const n = Number(count);
const sub = await connect(url, {token});
const pub = await connect(url, {token});
const topic = "jsbench-" + Date.now();
let got = 0, done;
const finished = new Promise((r) => (done = r));
await sub.subscribe(topic, () => { if (++got === n) done(); });
const payload = "x".repeat(62);
const start = performance.now();
for (let i = 0; i < n; i++) {
  pub.publish(topic, payload);
  if (i % 100 === 99) await new Promise((r) => setImmediate(r));
}
await finished;
const s = (performance.now() - start) / 1000;
console.log(JSON.stringify({deliveries: n, seconds: s, perSecond: Math.round(n / s)}));
sub.close(); pub.close();
