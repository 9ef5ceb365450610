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
    assert(closes.includes("going_away"), "closes: " + closes.join(","));
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

test("setToken refuses another subject and keeps the session",
  async (env) => {
    const c = env.track(await env.lib.connect(env.base + "/ws",
      {token: await tokenFor(env, "alice")}));
    try {
      await c.setToken(await tokenFor(env, "mallory"));
      throw new Error("accepted another subject");
    } catch (err) {
      equal(err.code, "auth_failed", "the refusal");
    }
    const confirm = await c.publish(topic("still"), 1, {qos: 1});
    equal(confirm.seq, 1, "a publish after the refusal");
    assert(c.connected, "still connected");
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
