// The JavaScript client's tests, run in Node (node.mjs) and in Chromium
// (page.html) against a real broker that a Go test serves
// (cmd/popsub/jsclient_test.go). env.base is that server: /ws is the
// broker, /relay/ws a relay to it that the test can make drop a confirm,
// /fake/ws a scripted server that closes with a chosen code, and
// /control/... lets a test sign tokens and restart the broker.

/** Each test is a name and an async function of the client module. */
export const tests = [];
const test = (name, fn) => tests.push({name, fn});

/** run runs every test and returns [{name, ok, error}]. */
export async function run(lib, env) {
  const results = [];
  for (const {name, fn} of tests) {
    const clients = [];
    const ctx = {...env, lib, track: (c) => (clients.push(c), c)};
    try {
      await withTimeout(fn(ctx), 30000, name);
      results.push({name, ok: true});
    } catch (err) {
      results.push({name, ok: false, error: String(err?.stack || err)});
    } finally {
      for (const c of clients) c.close();
    }
  }
  return results;
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([promise, new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no end in ${ms} ms`)), ms);
  })]).finally(() => clearTimeout(timer));
}

function assert(ok, message) {
  if (!ok) throw new Error(message);
}

function equal(got, want, what) {
  const g = JSON.stringify(got), w = JSON.stringify(want);
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`);
}

// control calls the Go test's control endpoint and returns its text.
async function control(env, path) {
  const res = await fetch(env.base + "/control/" + path, {method: "POST"});
  const text = await res.text();
  if (!res.ok) throw new Error(`control ${path}: ${res.status} ${text}`);
  return text;
}

// tokenFor signs a token: for sub, valid ttl seconds, with grants.
function tokenFor(env, sub, {ttl = 3600, publish, subscribe} = {}) {
  const q = new URLSearchParams({sub, ttl: String(ttl)});
  if (publish) q.set("publish", publish.join(","));
  if (subscribe) q.set("subscribe", subscribe.join(","));
  return control(env, "token?" + q);
}

// waitUntil polls check until it is true.
async function waitUntil(check, what) {
  for (let i = 0; i < 2000; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("never: " + what);
}

// collector returns a handler that records messages, and the record.
function collector() {
  const got = [];
  const handler = (m) => { got.push(m); };
  return {got, handler};
}

// A unique topic per test and runtime, so runs never share a log.
let topics = 0;
const topic = (name) => `${name}-${Date.now().toString(36)}-${topics++}`;

test("publish answers a QoS 1 publish with its confirm", async (env) => {
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token: await tokenFor(env, "alice")}));
  const t = topic("confirm");
  const first = await c.publish(t, {n: 1}, {qos: 1, messageId: "m-1"});
  equal([first.seq, first.messageId, first.duplicate], [1, "m-1", false],
    "the confirm");
  const again = await c.publish(t, {n: 1}, {qos: 1, messageId: "m-1"});
  equal([again.seq, again.duplicate], [1, true], "the same id again");
  equal(await c.publish(t, "fire and forget"), undefined, "a QoS 0 publish");
});

test("publishes made in one tick leave in one frame, and arrive in order",
  async (env) => {
    // A WebSocket that counts what the client sends, after its auth.
    const sent = [];
    const Counting = class extends globalThis.WebSocket {
      send(data) { sent.push(String(data)); super.send(data); }
    };
    const token = await tokenFor(env, "alice");
    const c = env.track(await env.lib.connect(env.base + "/ws",
      {token, WebSocket: Counting}));
    const reader = env.track(await env.lib.connect(env.base + "/ws",
      {token}));
    const t = topic("tick");
    const {got, handler} = collector();
    await reader.subscribe(t, handler, {after: 0});
    sent.length = 0;
    const confirms = await Promise.all(Array.from({length: 200},
      (_, i) => c.publish(t, {i}, {qos: 1})));
    equal(confirms.map((cf) => cf.seq),
      Array.from({length: 200}, (_, i) => i + 1), "the confirms' seqs");
    const publishes = sent.filter((d) => d.includes('"publish"'));
    assert(publishes.length <= 2,
      `200 publishes left in ${publishes.length} frames, want 1 or 2`);
    equal(publishes.join("\n").split("\n").length, 200,
      "publishes in the frames");
    await waitUntil(() => got.length === 200, "200 deliveries");
    equal(got.map((m) => m.payload.i),
      Array.from({length: 200}, (_, i) => i), "the deliveries, in order");
  });

test("a refused publish rejects with the broker's code", async (env) => {
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token: await tokenFor(env, "sensor", {publish: ["sensors/#"]})}));
  try {
    await c.publish("chat", 1, {qos: 1});
    throw new Error("the publish was confirmed");
  } catch (err) {
    equal(err.code, "forbidden", "the error's code");
  }
});

test("subscribe replays and streams, and acks by itself", async (env) => {
  const token = await tokenFor(env, "alice");
  const c = env.track(await env.lib.connect(env.base + "/ws", {token}));
  const t = topic("sub");
  await c.publish(t, "one", {qos: 1});
  const {got, handler} = collector();
  await c.subscribe(t, handler, {after: 0});
  await c.publish(t, "two", {qos: 1});
  await waitUntil(() => got.length === 2, "two deliveries");
  equal(got.map((m) => [m.seq, m.payload]), [[1, "one"], [2, "two"]],
    "the deliveries");
  // Acked: a second connection of the same subscriber, durable or not,
  // owes nothing; the broker says so by not retrying (the ack timeout is
  // 200 ms here) before a later message.
  await new Promise((r) => setTimeout(r, 500));
  await c.publish(t, "three", {qos: 1});
  await waitUntil(() => got.length === 3, "the third");
  equal(got.map((m) => m.attempt), [1, 1, 1], "no retries");
});

test("acks by hand: an unacked delivery comes again", async (env) => {
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token: await tokenFor(env, "alice")}));
  const t = topic("manual");
  const {got, handler} = collector();
  await c.subscribe(t, handler, {ack: "manual", last: 0});
  await c.publish(t, "again", {qos: 1});
  await waitUntil(() => got.length === 2, "a retry");
  equal(got.map((m) => m.attempt), [1, 2], "attempts");
  got[1].ack();
});

test("nak hands a delivery back: it comes again, then goes to $dead",
  async (env) => {
    const c = env.track(await env.lib.connect(env.base + "/ws",
      {token: await tokenFor(env, "alice",
        {subscribe: ["#", "$dead/#"]})}));
    const t = topic("nak");
    const dead = collector();
    await c.subscribe("$dead/" + t, dead.handler, {last: 0});
    const {got, handler} = collector();
    await c.subscribe(t, handler, {ack: "manual", last: 0});
    await c.publish(t, "job", {qos: 1, ttlMs: 60000});
    await waitUntil(() => got.length === 1, "the delivery");
    assert(got[0].expiresAt > got[0].timestamp, "expiresAt is set");
    got[0].nak({delayMs: 0});
    await waitUntil(() => got.length === 2, "the retry");
    equal(got.map((m) => m.attempt), [1, 2], "attempts");
    got[1].nak({dead: true, reason: "cannot do it"});
    await waitUntil(() => dead.got.length === 1, "the dead letter");
    equal([dead.got[0].payload.reason, dead.got[0].payload.attempts],
      ["cannot do it", 2], "the dead letter's reason and attempts");
  });

test("a delayed publish is confirmed on $delayed and comes when due",
  async (env) => {
    const c = env.track(await env.lib.connect(env.base + "/ws",
      {token: await tokenFor(env, "alice")}));
    const t = topic("delay");
    const {got, handler} = collector();
    await c.subscribe(t, handler, {last: 0});
    const confirm = await c.publish(t, "later", {qos: 1, delayMs: 300});
    equal(confirm.topic, "$delayed/" + t, "the confirm's topic");
    await c.publish(t, "now", {qos: 1});
    await waitUntil(() => got.length === 2, "both messages");
    equal(got.map((m) => [m.payload, m.seq]), [["now", 1], ["later", 2]],
      "the delayed one after, with the later seq");
    assert(got[1].deliverAt > 0 && Date.now() >= got[1].deliverAt,
      "deliverAt is set, and passed");
  });

test("a restart in the middle: resumed, nothing confirmed lost",
  async (env) => {
    const token = await tokenFor(env, "alice");
    const options = {token, minDelay: 20, maxDelay: 200};
    const c = env.track(await env.lib.connect(env.base + "/ws", options));
    const closes = [];
    c.on("close", (e) => closes.push(e.name));
    const t = topic("restart");
    const {got, handler} = collector();
    await c.subscribe(t, handler, {after: 0});

    const confirms = [];
    const sending = (async () => {
      for (let i = 1; i <= 40; i++) {
        confirms.push(await c.publish(t, i, {qos: 1}));
      }
    })();
    await waitUntil(() => confirms.length >= 10, "ten confirms");
    await control(env, "restart");
    await sending;
    // The broker closes with 1001 (TestBroker_ShutdownClosesClientsWith1001
    // holds it to that); a browser on a loaded machine has reported the
    // same end as 1006. Either way the client heard an end, and resumed.
    assert(closes.length > 0 && closes.every((name) =>
      name === "going_away" || name === "dropped"),
    "closes: " + closes.join(","));
    const seqs = confirms.map((x) => x.seq);
    await waitUntil(() => new Set(got.map((m) => m.seq)).size >= 40,
      "every message delivered");
    const delivered = new Set(got.map((m) => m.seq));
    for (const seq of seqs) assert(delivered.has(seq), `seq ${seq} missing`);
    equal([...new Set(got.map((m) => m.payload))].sort((a, b) => a - b),
      Array.from({length: 40}, (_, i) => i + 1), "the payloads");
  });

test("an unconfirmed publish is sent again once and stored once",
  async (env) => {
    const token = await tokenFor(env, "alice");
    const c = env.track(await env.lib.connect(env.base + "/relay/ws",
      {token, minDelay: 20, maxDelay: 100}));
    const t = topic("resend");
    // The relay drops the next confirm and the connection with it: the
    // broker has the message, the client does not know.
    await control(env, "drop-next-confirm");
    const confirm = await c.publish(t, "once", {qos: 1, messageId: "r-1"});
    equal([confirm.seq, confirm.duplicate], [1, true],
      "the confirm of the second send");
    const reader = env.track(await env.lib.connect(env.base + "/ws", {token}));
    const {got, handler} = collector();
    const sub = await reader.subscribe(t, handler, {after: 0});
    await reader.publish(t, "barrier", {qos: 1});
    await waitUntil(() => got.some((m) => m.payload === "barrier"), "barrier");
    equal(got.map((m) => m.messageId).filter((id) => id === "r-1").length, 1,
      "copies stored");
    await sub.unsubscribe();
  });

test("4008 and 4003 are reported by name", async (env) => {
  const seen = [];
  const cut = env.track(await env.lib.connect(env.base + "/fake/ws?close=4008",
    {token: "any", minDelay: 10, maxDelay: 20}));
  cut.on("close", (e) => seen.push([e.code, e.name, e.reconnecting]));
  await waitUntil(() => seen.length > 0, "the 4008");
  equal(seen[0], [4008, "cut_off", true], "a cut-off reconnects");

  const expired = [];
  const ended = env.track(await env.lib.connect(
    env.base + "/fake/ws?close=4003", {token: "any"}));
  ended.on("close", (e) => expired.push([e.code, e.name, e.reconnecting]));
  await waitUntil(() => expired.length > 0, "the 4003");
  equal(expired[0], [4003, "token_expired", false],
    "an expired token without getToken ends");
});

test("a token is refreshed before it expires, without a reconnect",
  async (env) => {
    // A token with 50 s left is inside the client's 60 s margin: it asks
    // for a fresh one at once. The fresh one may publish where the old
    // one could not, at once.
    const old = await tokenFor(env, "alice", {ttl: 50, publish: ["a/#"]});
    const fresh = await tokenFor(env, "alice", {publish: ["a/#", "b/#"]});
    let asked = 0;
    const closes = [];
    const refreshed = [];
    const c = env.track(await env.lib.connect(env.base + "/ws", {token: old,
      getToken: async () => (asked++, fresh)}));
    c.on("close", (e) => closes.push(e));
    c.on("refresh", (e) => refreshed.push(e));
    const conn = c.conn;
    await waitUntil(() => refreshed.length === 1, "a refresh");
    const confirm = await c.publish("b/" + topic("grant"), 1, {qos: 1});
    equal(confirm.seq, 1, "a publish the fresh grants allow");
    equal([asked, closes.length, c.conn], [1, 0, conn],
      "one token asked for, no reconnect");
  });

test("a gap is said when the log no longer has what was asked for",
  async (env) => {
    // after beyond the head: the log was started again, say. The broker
    // replays from its oldest and says recovered:false.
    const token = await tokenFor(env, "alice");
    const c = env.track(await env.lib.connect(env.base + "/ws", {token}));
    const t = topic("gap");
    for (let i = 1; i <= 3; i++) await c.publish(t, i, {qos: 1});
    const gaps = [];
    c.on("gap", (e) => gaps.push(e));
    const {got, handler} = collector();
    await c.subscribe(t, handler, {after: 90});
    await waitUntil(() => got.length === 3, "the three");
    equal([gaps.length, gaps[0]?.topic, gaps[0]?.after], [1, t, 90], "the gap");
    equal(got.map((m) => m.seq), [1, 2, 3], "replayed from the oldest");
  });

test("a wildcard hears the messages of a topic it covers that are gone",
  async (env) => {
    // Only a broker on a shared log sends this, so a scripted one does:
    // the frame names the wildcard as its filter, and the topic whose
    // messages went.
    const c = env.track(await env.lib.connect(
      env.base + "/fake/ws?skipped=w/a", {token: "any"}));
    const gaps = [];
    c.on("gap", (e) => gaps.push(e));
    await c.subscribe("w/#", () => {});
    await waitUntil(() => gaps.length > 0, "the gap");
    equal(gaps, [{topic: "w/a", after: 4, seq: 6, missed: 2}], "the gap");
  });

// serve returns the URLs of the real `popsub serve` the Go test runs
// beside the suite's server: {ws, closed}, closed being a port nothing
// listens on.
async function serve(env) {
  return JSON.parse(await control(env, "serve"));
}

test("connect rejects when nothing listens", async (env) => {
  const {closed} = await serve(env);
  try {
    await env.lib.connect(closed, {token: await tokenFor(env, "alice")});
    throw new Error("connect resolved");
  } catch (err) {
    equal(err.name, "PopsubError", "the rejection: " + err);
  }
});

test("a broker stopped and started again, its port closed between: " +
  "the client comes back and resumes", async (env) => {
  const {ws} = await serve(env);
  const token = await tokenFor(env, "alice");
  const c = env.track(await env.lib.connect(ws,
    {token, minDelay: 20, maxDelay: 200}));
  const closes = [];
  c.on("close", (e) => closes.push(e));
  const opens = [];
  c.on("open", (e) => opens.push(e));
  const t = topic("serve");
  const {got, handler} = collector();
  await c.subscribe(t, handler, {after: 0});
  await c.publish(t, "before", {qos: 1});
  await control(env, "serve-stop");
  await waitUntil(() => closes.length > 0, "the close");
  // Published while the port is closed: kept, and sent once it is back.
  const pending = c.publish(t, "during", {qos: 1});
  await new Promise((r) => setTimeout(r, 300)); // refused dials meanwhile
  assert(!c.connected, "connected while the broker is down");
  await control(env, "serve-start");
  const confirm = await pending;
  equal(confirm.seq, 2, "the publish made while it was down");
  await waitUntil(() => got.length >= 2, "both delivered");
  equal(got.map((m) => m.payload), ["before", "during"], "the deliveries");
  assert(opens.some((e) => e.reconnected), "no reconnected open event");
});

test("a refused setToken is never used again", async (env) => {
  const token = await tokenFor(env, "alice");
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token, minDelay: 20, maxDelay: 100}));
  try {
    await c.setToken("not-a-token");
    throw new Error("the bad token was accepted");
  } catch (err) {
    equal(err.code, "auth_failed", "the refusal");
  }
  // A blip: the reconnect uses the token the broker accepted.
  const conn = c.conn;
  await control(env, "restart");
  await waitUntil(() => c.connected && c.conn !== conn, "a reconnect");
  const confirm = await c.publish(topic("kept"), 1, {qos: 1});
  equal([confirm.seq, c.subject], [1, "alice"], "still alice's session");
});

test("a token for another subject is refused, and never used",
  async (env) => {
    const c = env.track(await env.lib.connect(env.base + "/ws",
      {token: await tokenFor(env, "alice"), minDelay: 20, maxDelay: 100}));
    try {
      await c.setToken(await tokenFor(env, "mallory"));
      throw new Error("accepted another subject");
    } catch (err) {
      equal(err.code, "another_subject", "the refusal");
    }
    const conn = c.conn;
    await control(env, "restart");
    await waitUntil(() => c.connected && c.conn !== conn, "a reconnect");
    equal(c.subject, "alice", "the subject after the reconnect");
  });

test("group: each job goes to one member of the work queue",
  async (env) => {
    const token = await tokenFor(env, "worker");
    const t = topic("jobs");
    const members = [];
    for (let i = 0; i < 2; i++) {
      const c = env.track(await env.lib.connect(env.base + "/ws", {token}));
      const {got, handler} = collector();
      await c.subscribe(t, handler, {group: "workers"});
      members.push(got);
    }
    const shop = env.track(await env.lib.connect(env.base + "/ws", {token}));
    for (let i = 1; i <= 6; i++) await shop.publish(t, i, {qos: 1});
    await waitUntil(() => members[0].length + members[1].length === 6,
      "six jobs done");
    const all = members.flat().map((m) => m.payload).sort();
    equal(all, [1, 2, 3, 4, 5, 6], "each job once");
    assert(members.every((got) => got.length > 0), "a member got nothing");
  });

test("an option subscribe does not know is an error", async (env) => {
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token: await tokenFor(env, "alice")}));
  try {
    await c.subscribe(topic("typo"), () => {}, {grup: "workers"});
    throw new Error("the typo was taken");
  } catch (err) {
    equal(err.code, "bad_option", "the error");
  }
});

test("a silent connection is noticed by the client's pings",
  async (env) => {
    const token = await tokenFor(env, "alice");
    const c = env.track(await env.lib.connect(env.base + "/relay/ws",
      {token, pingInterval: 100, minDelay: 20, maxDelay: 100}));
    const closes = [];
    c.on("close", (e) => closes.push(e));
    // The relay stops carrying anything, either way, without closing.
    await control(env, "silence-relay");
    await waitUntil(() => closes.length > 0, "the silence noticed");
    await waitUntil(() => c.connected, "a new connection");
    const confirm = await c.publish(topic("silent"), 1, {qos: 1});
    equal(confirm.seq, 1, "a publish on the new connection");
  });

test("a connection draining its own backlog is not taken for silent",
  async (env) => {
    // A socket whose backlog the test scripts: each look at it finds
    // it smaller while it drains, and the same once it stalls. What the
    // client sends joins it, as a browser's does.
    const backlog = {bytes: 0, draining: false};
    const Backlogged = class extends globalThis.WebSocket {
      get bufferedAmount() {
        if (backlog.draining) backlog.bytes = Math.max(1, backlog.bytes - 10);
        return backlog.bytes;
      }
      send(data) {
        if (backlog.bytes > 0) backlog.bytes += String(data).length;
        super.send(data);
      }
    };
    const token = await tokenFor(env, "alice");
    const c = env.track(await env.lib.connect(env.base + "/relay/ws",
      {token, pingInterval: 100, minDelay: 20, maxDelay: 100,
        WebSocket: Backlogged}));
    const closes = [];
    c.on("close", (e) => closes.push(e));
    // The broker is heard no more, while a flood of ours drains: for
    // eight intervals, four times the silence that drops a connection.
    backlog.bytes = 1 << 20;
    backlog.draining = true;
    await control(env, "silence-relay");
    await new Promise((r) => setTimeout(r, 800));
    equal(closes.length, 0, "closes while the backlog drained");
    // A backlog that stops draining is a dead network: dropped.
    backlog.draining = false;
    await waitUntil(() => closes.length > 0, "the stalled backlog noticed");
    backlog.bytes = 0;
    await waitUntil(() => c.connected, "a new connection");
    const confirm = await c.publish(topic("backlog"), 1, {qos: 1});
    equal(confirm.seq, 1, "a publish on the new connection");
  });

test("follow renews an expired token and goes on after the last seq",
  async (env) => {
    if (!globalThis.EventSource) return; // a browser's, or npm's in Node
    // The real serve, with its HTTP gateway; this page is of another
    // origin, which serve's --origins allows.
    const {ws} = await serve(env);
    const base = ws.replace(/^ws/, "http").replace(/\/ws$/, "");
    const writer = env.track(await env.lib.connect(ws,
      {token: await tokenFor(env, "alice")}));
    // An exact topic, and a wildcard, which is live only and whose #
    // must not end the URL's path.
    const t = topic("follow");
    const w = topic("followall");
    // A token of one second: with the broker's leeway of five, each
    // stream ends with token_expired six seconds in.
    const follow = (name, options) => {
      const f = {tokens: [], got: [], closes: []};
      f.stop = env.lib.follow(base, name, {...options,
        getToken: async () => {
          const token = await tokenFor(env, "alice",
            {ttl: f.tokens.length ? 3600 : 1});
          f.tokens.push(token);
          return token;
        },
        onMessage: (m) => f.got.push(m.payload),
        onClose: (e) => f.closes.push(e.code)});
      return f;
    };
    // The wildcard gets only what is published once its stream is
    // open: publish to it until it has the value.
    const reach = (value, what) => {
      let sent = 0;
      return waitUntil(async () => {
        if (all.got.includes(value)) return true;
        if (Date.now() - sent > 250) {
          sent = Date.now();
          await writer.publish(`${w}/${value}`, value, {qos: 1});
        }
        return false;
      }, what);
    };
    await writer.publish(t, 1, {qos: 1});
    const exact = follow(t, {after: 0});
    const all = follow(`${w}/#`, {});
    try {
      await waitUntil(() => exact.got.length === 1, "the first message");
      await reach(1, "the wildcard's first message");
      await new Promise((r) => setTimeout(r, 7000));
      await writer.publish(t, 2, {qos: 1});
      await waitUntil(() => exact.got.length === 2,
        "the message after renewal");
      await reach(2, "the wildcard's message after renewal");
      equal(exact.got, [1, 2], "the topic: each message once, in order");
      equal([...new Set(all.got)], [1, 2], "the wildcard: in order");
      for (const [f, what] of [[exact, "the topic"], [all, "the wildcard"]]) {
        equal(f.closes[0], "token_expired", what + ": why its first ended");
        equal(f.tokens.length, 2, what + ": tokens asked for");
      }
    } finally {
      exact.stop();
      all.stop();
    }
  });

test("connect rejects a broker whose certificate it does not trust",
  async (env) => {
    const {untrusted} = await serve(env);
    try {
      await env.lib.connect(untrusted, {token: await tokenFor(env, "alice")});
      throw new Error("connect resolved");
    } catch (err) {
      equal(err.name, "PopsubError", "the rejection: " + err);
    }
  });

// What centrifuge-js's recovery harness (its issues #393 to #425) and
// Mercure's users found in their clients this year: deliveries after
// teardown, a message recovered twice by a resubscribe inside a handler,
// a token that expired retried for ever.

test("nothing is delivered once unsubscribe() resolves, or close() returns",
  async (env) => {
    const token = await tokenFor(env, "alice");
    const publisher = env.track(await env.lib.connect(env.base + "/ws",
      {token}));
    const t = topic("teardown");
    for (const end of ["unsubscribe", "close"]) {
      const c = env.track(await env.lib.connect(env.base + "/ws", {token}));
      let after = 0, ended = false;
      const sub = await c.subscribe(t, () => { if (ended) after++; },
        {last: 0});
      // A stream on its way as the subscription ends.
      const sending = Promise.all(Array.from({length: 200},
        (_, i) => publisher.publish(t, i, {qos: 1})));
      await new Promise((r) => setTimeout(r, 5));
      if (end === "unsubscribe") await sub.unsubscribe();
      else c.close();
      ended = true;
      await sending;
      // A reader that sees the last of them has seen them all arrive.
      const watcher = env.track(await env.lib.connect(env.base + "/ws",
        {token}));
      let last = false;
      await watcher.subscribe(t, (m) => { last ||= m.payload === "last"; },
        {last: 0});
      await publisher.publish(t, "last", {qos: 1});
      await waitUntil(() => last, "the last one");
      equal(after, 0, `deliveries after ${end}`);
    }
  });

test("a resubscribe inside a handler gets each later message once, " +
  "and none before", async (env) => {
  const token = await tokenFor(env, "alice");
  const c = env.track(await env.lib.connect(env.base + "/ws", {token}));
  const t = topic("inside");
  for (let i = 1; i <= 10; i++) await c.publish(t, i, {qos: 1});
  const first = [], second = [];
  // The replay may come in the frame that says "subscribed", before
  // subscribe resolves: the handler ends its subscription through the
  // message.
  await c.subscribe(t, async (m) => {
    first.push(m.seq);
    if (m.seq === 5) {
      await m.subscription.unsubscribe();
      await c.subscribe(t, (n) => { second.push(n.seq); }, {after: m.seq});
    }
  }, {after: 0});
  await waitUntil(() => second.length >= 5, "the second subscription");
  await c.publish(t, 11, {qos: 1});
  await waitUntil(() => second.includes(11), "a live one");
  equal(first, [1, 2, 3, 4, 5], "the first subscription's");
  equal(second, [6, 7, 8, 9, 10, 11], "the second's");
});

test("a token that expires ends the client with one error, and no dial " +
  "after", async (env) => {
  // The broker allows a token 5 s past its exp: this one ends in 6 s.
  const token = await tokenFor(env, "alice", {ttl: 1});
  let dials = 0;
  const Counting = class extends globalThis.WebSocket {
    constructor(...args) { super(...args); dials++; }
  };
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token, WebSocket: Counting, minDelay: 10, maxDelay: 20}));
  const errors = [], closes = [];
  c.on("error", (e) => errors.push(e.code));
  c.on("close", (e) => closes.push([e.name, e.reconnecting]));
  await waitUntil(() => closes.length > 0, "the session's end");
  await new Promise((r) => setTimeout(r, 500));
  equal([errors, closes, dials], [["token_expired"],
    [["token_expired", false]], 1], "errors, closes and dials");
  let rejected = "";
  await c.publish(topic("after"), 1, {qos: 1}).catch((e) => {
    rejected = e.code;
  });
  equal(rejected, "closed", "a publish after the end");
});

test("a token that getToken gives expired is never sent", async (env) => {
  // A broken getToken hands back the token that just expired: the client
  // says so once and stops, where dialling again would loop for ever.
  const expired = await tokenFor(env, "alice", {ttl: -60});
  let dials = 0;
  const Counting = class extends globalThis.WebSocket {
    constructor(...args) { super(...args); dials++; }
  };
  const errors = [];
  const c = new env.lib.Client(env.base + "/ws", {getToken: () => expired,
    WebSocket: Counting, minDelay: 10, maxDelay: 20});
  env.track(c);
  c.on("error", (e) => errors.push(e.code));
  let refused = "";
  await c.opened.catch((e) => { refused = e.code; });
  await new Promise((r) => setTimeout(r, 300));
  equal([errors, dials, refused !== ""], [["token_expired"], 1, true],
    "errors, dials, and connect's refusal");
});

test("a delayed QoS 0 publish is refused at the call", async (env) => {
  const c = env.track(await env.lib.connect(env.base + "/ws",
    {token: await tokenFor(env, "alice")}));
  let code = "";
  await c.publish(topic("delay0"), 1, {delayMs: 100}).catch((e) => {
    code = e.code;
  });
  equal(code, "invalid_delay", "the refusal");
});

test("an EventSource resumes with Last-Event-ID after the broker restarts",
  async (env) => {
    if (!globalThis.EventSource) return; // in Node, the npm package's
    const {ws} = await serve(env);
    const base = ws.replace(/^ws/, "http").replace(/\/ws$/, "");
    const token = await tokenFor(env, "alice");
    const writer = env.track(await env.lib.connect(ws,
      {token, minDelay: 20, maxDelay: 200}));
    const t = topic("sse");
    await writer.publish(t, 1, {qos: 1});
    const got = [], ids = [];
    const query = new URLSearchParams({access_token: token, after: "0"});
    const source = new EventSource(`${base}/topics/${t}?${query}`);
    source.addEventListener("message", (e) => {
      got.push(JSON.parse(e.data).payload);
      ids.push(e.lastEventId);
    });
    try {
      await writer.publish(t, 2, {qos: 1});
      await waitUntil(() => got.length === 2, "the first two");
      // The stream drops with the broker; EventSource comes back by
      // itself, sending the last id it saw, and the broker goes on after
      // it (the URL's after=0 would replay everything).
      await control(env, "serve-stop");
      await control(env, "serve-start");
      await writer.publish(t, 3, {qos: 1});
      await waitUntil(() => got.length >= 3, "the one after the restart");
      await new Promise((r) => setTimeout(r, 200));
      equal([got, ids], [[1, 2, 3], ["1", "2", "3"]],
        "each message once, with its seq as its id");
    } finally {
      source.close();
    }
  });
