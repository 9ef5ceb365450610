// popsub.js: the PopSub client for browsers and Node, one ES module with
// no dependencies. The broker serves it at /popsub.js.
//
//   import {connect} from "/popsub.js";
//   const c = await connect("ws://127.0.0.1:8080/ws", {token});
//   await c.subscribe("chat", (m) => console.log(m.payload), {after: 0});
//   const {seq} = await c.publish("chat", "hello", {qos: 1});
//   c.close();
//
// What it does for you, so a page or a script need not:
//
//   - reconnects after a drop, with backoff and jitter, and resumes each
//     subscription after the last seq it handled (or from its durable
//     cursor), saying so with a "gap" event when the broker no longer
//     has what came between (recovered:false); a connection that fails
//     to open counts as a drop even where no close event follows (Node
//     20 fires only "error" for a refused port or certificate), and one
//     that goes silent (half-open) is noticed by its own pings, while
//     one still sending a flood of its own is not taken for silent;
//   - sends a QoS 1 publish again, with the same message_id, until the
//     broker confirms it: its dedup makes that safe, and the promise
//     resolves once, with the seq;
//   - acks each QoS 1 delivery once its handler returns (or its promise
//     resolves), or leaves that to message.ack(), or message.nak() to
//     hand it back (retried later, or dead-lettered with {dead: true});
//   - refreshes its token in place, without reconnecting, when given a
//     way to get a new one (getToken), before the old one expires; a
//     token the broker refuses is never used again, and a client is one
//     subject for its whole life (a token for another is refused);
//   - joins a work queue with subscribe's group option;
//   - sends what one tick sends (a loop of publishes, its acks) in one
//     WebSocket frame, with no timer, and reads the broker's frames the
//     same way ("batch":true);
//   - names close codes: 4008 "cut_off", 4003 "token_expired", 4001
//     "auth_failed", 1001 "going_away"; a token that expires, or that
//     the broker refuses, ends the client with one error, unless
//     getToken gives a fresh one: it never dials again with a token it
//     knows the broker will refuse.
//
// What it promises about a subscription's end, and a new one begun in
// a handler: once unsubscribe() or close() returns, no handler of that
// subscription (or client) is called again, even for a delivery
// already on its way. A subscription started inside a handler,
// {after: message.seq} say, gets what at-least-once promises: every
// message after that seq, each handled once (one handled may come
// again only after a reconnect, before its ack arrived), and none at or
// before it, including the one being handled.
//
// In Node 20, start with --experimental-websocket (Node 22 has
// WebSocket built in), or pass a WebSocket class as options.WebSocket.
// The protocol it speaks is docs/protocol.md.

/** The most characters #flush joins into one WebSocket frame: 16 Ki, at
 * most 48 KiB of UTF-8, far under the broker's 1 MiB frames, and under
 * the 64 KiB past which a frame must wait for one of its places. */
const maxJoined = 16 << 10;

/** Close codes by name. */
export const closeCodes = Object.freeze({
  1000: "normal",
  1001: "going_away",
  1006: "dropped",
  1008: "policy",
  1009: "too_large",
  1011: "server_error",
  4001: "auth_failed",
  4003: "token_expired",
  4008: "cut_off",
});

/**
 * An error the broker answered with, or the client's own.
 * code is the protocol's error code (forbidden, rate_limited, …).
 */
export class PopsubError extends Error {
  /** @param {string} code @param {string} message @param {object} [frame] */
  constructor(code, message, frame) {
    super(message ? `${code}: ${message}` : code);
    this.name = "PopsubError";
    /** @type {string} */ this.code = code;
    /** @type {object|undefined} */ this.frame = frame;
  }
}

/**
 * @typedef {object} ConnectOptions
 * @property {string} [token] the JWT to authenticate with
 * @property {() => (string|Promise<string>)} [getToken] returns a fresh
 *   token: called before the current one expires, and to reconnect after
 *   the broker refused or expired it
 * @property {string} [client] a name for this client in the broker's logs
 * @property {number} [minDelay] first reconnect delay in ms (250)
 * @property {number} [maxDelay] longest reconnect delay in ms (10000)
 * @property {number} [refreshBefore] ms before expiry to refresh (60000)
 * @property {number} [pingInterval] ms between the client's own pings on
 *   a quiet connection; one silent for two of them, its own backlog
 *   not draining, is dropped (20000)
 * @property {typeof WebSocket} [WebSocket] the WebSocket class to use
 */

/**
 * @typedef {object} SubscribeOptions
 * @property {number} [after] replay only seqs after this one
 * @property {number} [last] replay only the newest N (0: live only)
 * @property {string} [durable] resume from this name's cursor on the broker
 * @property {string} [group] join this work queue: each message goes to
 *   one member of the group (docs/9-work-queues.md)
 * @property {"auto"|"manual"} [ack] auto (default) acks a QoS 1 delivery
 *   once its handler returns; manual leaves it to message.ack()
 */

/**
 * @typedef {object} Message
 * @property {string} topic
 * @property {any} payload
 * @property {number} seq its place in its topic's log
 * @property {string} messageId
 * @property {number} qos
 * @property {number} timestamp Unix ms, set by the broker
 * @property {number} attempt 1, then 2, 3, … on each retry
 * @property {number} [expiresAt] Unix ms after which it is not delivered,
 *   when it was published with ttlMs
 * @property {number} [deliverAt] Unix ms when it was due, when it was
 *   published with delayMs or deliverAt
 * @property {Subscription} subscription the subscription it came
 *   through: a handler may end it, replayed messages come before
 *   subscribe's promise resolves
 * @property {() => void} ack acks it (a QoS 0 delivery needs none)
 * @property {(options?: {delayMs?: number, dead?: boolean,
 *   reason?: string}) => void} nak hands it back: retried after delayMs
 *   (or the broker's backoff), or sent to $dead/<topic> with dead: true
 */

/**
 * @typedef {object} Confirm
 * @property {string} topic
 * @property {number} seq
 * @property {string} messageId
 * @property {boolean} duplicate the broker had it already
 */

/**
 * Connects and authenticates. It resolves once the broker answers
 * "authenticated", and rejects if the first attempt fails; after that
 * the client reconnects by itself until close().
 * @param {string} url ws://host:port/ws, wss://…, or the broker's http(s) URL
 * @param {ConnectOptions} options
 * @returns {Promise<Client>}
 */
export async function connect(url, options = {}) {
  const client = new Client(url, options);
  await client.opened;
  return client;
}

/** A connection to the broker that survives drops. */
export class Client {
  #url;
  #options;
  #token;
  #WebSocket;
  /** @type {WebSocket|null} */ #ws = null;
  #authenticated = false;
  #closed = false;
  #attempt = 0;
  #retryTimer = null;
  #refreshTimer = null;
  #pingTimer = null;
  #heard = 0; // when the socket last received anything, in ms
  #buffered = 0; // the socket's bufferedAmount at the last ping tick
  // characters handed to ws.send since that tick: no more than their
  // bytes, which bufferedAmount counts, so no drain is seen where none was
  #sentChars = 0;
  #refusedToken = ""; // the last token the broker refused or expired
  #subject = ""; // the subject the broker accepted first, for good
  /** @type {Map<string, Subscription>} by topic */ #subscriptions = new Map();
  /** @type {Map<string, object>} by topic and message_id */ #publishes = new Map();
  /** @type {Array<{resolve: Function, reject: Function}>} */ #refreshes = [];
  /** @type {Map<string, Array<Function>>} */ #listeners = new Map();
  #firstOpen; // connect's promise, settled by the first attempt
  #outgoing = []; // frames sent in this tick, as JSON text, for #outgoingWS
  #outgoingWS = null;

  /** @param {string} url @param {ConnectOptions} options */
  constructor(url, options = {}) {
    this.#url = socketURL(url);
    this.#options = {minDelay: 250, maxDelay: 10000, refreshBefore: 60000,
      pingInterval: 20000, ...options};
    this.#token = options.token;
    this.#WebSocket = options.WebSocket || globalThis.WebSocket;
    if (!this.#WebSocket) {
      throw new PopsubError("no_websocket", "this runtime has no " +
        "WebSocket: run Node 20 with --experimental-websocket, or pass " +
        "options.WebSocket");
    }
    /** The connection number the broker gave, for its logs. */
    this.conn = 0;
    /** Resolves on the first authentication, rejects if it fails. */
    this.opened = new Promise((resolve, reject) => {
      this.#firstOpen = {resolve, reject};
    });
    this.opened.catch(() => {});
    this.#dial();
  }

  /**
   * Listens for an event: "open" ({conn, reconnected}), "close" ({code,
   * name, reason, reconnecting, delay}), "gap" ({topic, after, seq,
   * missed}: the log no longer had what came after after, up to seq),
   * "refresh" ({sub, conn}), "error" (a PopsubError no call is waiting
   * for). Returns a function that stops listening.
   * @param {string} name @param {(event: object) => void} listener
   */
  on(name, listener) {
    const list = this.#listeners.get(name) || [];
    list.push(listener);
    this.#listeners.set(name, list);
    return () => list.splice(list.indexOf(listener) >>> 0, 1);
  }

  #emit(name, event) {
    for (const listener of this.#listeners.get(name) || []) {
      try { listener(event); } catch (err) { console.error(err); }
    }
  }

  /** Whether the client is connected and authenticated now. */
  get connected() { return this.#authenticated; }

  /** The subject the broker accepted, for the client's whole life. */
  get subject() { return this.#subject; }

  // # Connecting, and reconnecting

  #dial() {
    let ws;
    try {
      ws = new this.#WebSocket(this.#url);
    } catch (err) {
      // A malformed URL, or a scheme the runtime refuses.
      this.#firstOpen.reject(new PopsubError("bad_url", String(err)));
      this.#fail(new PopsubError("bad_url", String(err)));
      return;
    }
    this.#ws = ws;
    this.#heard = Date.now();
    this.#buffered = this.#sentChars = 0;
    ws.addEventListener("open", () => this.#authenticate(ws));
    ws.addEventListener("message", (e) => this.#receive(ws, e.data));
    ws.addEventListener("close", (e) => this.#dropped(ws, e.code, e.reason));
    // Browsers follow "error" with "close"; Node 20's WebSocket, on a
    // refused port or an untrusted certificate, does not. So an error is
    // a drop here, and the close that may follow finds it handled.
    ws.addEventListener("error", () => {
      this.#dropped(ws, 1006, "the connection failed");
      try { ws.close(); } catch {}
    });
  }

  async #authenticate(ws) {
    if (!this.#token && this.#options.getToken) {
      const token = await this.#options.getToken();
      // A token the broker refused, or one expired already, would only
      // be refused again, and again: a reconnect loop, never served.
      const exp = expiryOf(token);
      if (token === this.#refusedToken || exp && exp < Date.now()) {
        const err = new PopsubError("token_expired", "getToken gave a " +
          "token that is expired, or that the broker refused: not used");
        this.#emit("error", err);
        this.#fail(err);
        ws.close(1000, "");
        return;
      }
      this.#token = token;
    }
    // batch: the broker then reads several frames a WebSocket frame,
    // one per line, and sends them so too (#flush, #receive).
    this.#send(ws, {type: "auth", token: this.#token || "",
      client: this.#options.client, batch: true});
  }

  // Called with the broker's first "authenticated" on a socket.
  #welcome(ws, frame) {
    // A client is one subject for its whole life: its subscriptions and
    // durable cursors are that subject's.
    if (this.#subject && frame.sub !== this.#subject) {
      this.#fail(new PopsubError("another_subject", `the token is ` +
        `${frame.sub}'s; this client is ${this.#subject}'s`));
      ws.close(1000, "");
      return;
    }
    this.#subject = frame.sub;
    const reconnected = this.#attempt > 0 || this.conn !== 0;
    this.#authenticated = true;
    this.#attempt = 0;
    this.conn = frame.conn;
    this.#scheduleRefresh();
    this.#schedulePing(ws);
    // Subscriptions first, then the publishes the broker never confirmed,
    // each with its own message_id: a repeat is confirmed as duplicate.
    for (const sub of this.#subscriptions.values()) sub._resubscribe(ws);
    for (const entry of this.#publishes.values()) this.#send(ws, entry.frame);
    this.#firstOpen.resolve(this);
    this.#emit("open", {conn: frame.conn, reconnected});
  }

  #dropped(ws, code, reason) {
    if (ws !== this.#ws) return;
    const wasAuthenticated = this.#authenticated;
    this.#authenticated = false;
    this.#ws = null;
    clearTimeout(this.#refreshTimer);
    clearTimeout(this.#pingTimer);
    for (const r of this.#refreshes.splice(0)) {
      r.reject(new PopsubError("closed", "the connection closed"));
    }
    const name = closeCodes[code] || String(code);
    // A refused or expired token is final unless there is a way to get
    // another one; the first attempt's failure goes to connect's caller.
    const tokenProblem = code === 4001 || code === 4003;
    let reconnecting = !this.#closed &&
      (!tokenProblem || !!this.#options.getToken);
    if (!wasAuthenticated && this.conn === 0) {
      reconnecting = false;
      this.#firstOpen.reject(new PopsubError(name, reason ||
        "could not connect to " + this.#url));
    }
    if (tokenProblem) [this.#refusedToken, this.#token] = [this.#token, undefined];
    const delay = reconnecting ? this.#backoff() : 0;
    this.#emit("close", {code, name, reason, reconnecting, delay});
    if (reconnecting) {
      this.#retryTimer = setTimeout(() => this.#dial(), delay);
    } else if (!this.#closed) {
      this.#fail(new PopsubError(name, reason || "connection closed"));
    }
  }

  // Equal jitter: half the doubled delay, plus up to as much again, so
  // that many clients dropped at once do not return at once.
  #backoff() {
    const {minDelay, maxDelay} = this.#options;
    const ceiling = Math.min(maxDelay, minDelay * 2 ** this.#attempt++);
    return ceiling / 2 + Math.random() * ceiling / 2;
  }

  #fail(err) {
    this.#closed = true;
    for (const entry of this.#publishes.values()) entry.reject(err);
    this.#publishes.clear();
  }

  // A connection can go silent without a close: a laptop's lid, a NAT
  // that forgot the flow. The broker's own pings cannot be seen from a
  // page, so the client sends its own on a quiet connection, and drops
  // one that has heard nothing for two intervals.
  //
  // A backlog of our own that drains is no silence: a flood the page
  // sent queues the ping, and so the broker's pong, behind it. The
  // buffer drains only while the network takes our bytes; on a dead
  // one it stops once the system's buffer is full, and the silence
  // counts again.
  #schedulePing(ws) {
    clearTimeout(this.#pingTimer);
    const every = this.#options.pingInterval;
    if (!every) return;
    this.#pingTimer = setTimeout(() => {
      if (ws !== this.#ws) return;
      const buffered = ws.bufferedAmount || 0;
      if (buffered > 0 && buffered < this.#buffered + this.#sentChars) {
        this.#heard = Date.now();
      }
      this.#buffered = buffered;
      this.#sentChars = 0;
      if (Date.now() - this.#heard > 2 * every) {
        this.#dropped(ws, 1006, "no answer for " + 2 * every + " ms");
        try { ws.close(); } catch {}
        return;
      }
      if (Date.now() - this.#heard >= every) this.#send(ws, {type: "ping"});
      this.#schedulePing(ws);
    }, every);
  }

  /** Closes the connection for good; unconfirmed publishes reject. */
  close() {
    this.#closed = true;
    clearTimeout(this.#retryTimer);
    clearTimeout(this.#refreshTimer);
    clearTimeout(this.#pingTimer);
    this.#fail(new PopsubError("closed", "the client was closed"));
    if (this.#ws) this.#ws.close(1000, "");
  }

  // # Tokens refreshed in place

  #scheduleRefresh() {
    clearTimeout(this.#refreshTimer);
    const exp = expiryOf(this.#token);
    if (!this.#options.getToken || !exp) return;
    const wait = Math.max(0, exp - Date.now() - this.#options.refreshBefore);
    // setTimeout holds at most 2^31-1 ms (24.8 days).
    this.#refreshTimer = setTimeout(() => this.#refresh(),
      Math.min(wait, 2 ** 31 - 1));
  }

  async #refresh() {
    try {
      await this.setToken(await this.#options.getToken());
    } catch (err) {
      this.#emit("error", err);
      // Try again in a while; the session lasts until the old token ends.
      this.#refreshTimer = setTimeout(() => this.#refresh(),
        Math.max(1000, this.#options.refreshBefore / 4));
    }
  }

  /**
   * Replaces the token on the open connection, without reconnecting:
   * its grants and expiry take effect at once. Resolves once the broker
   * answers "authenticated"; rejects if it refuses the token, and the
   * connection then goes on with the old one, which is also the one a
   * reconnect uses: a refused token is never used again. A token for
   * another subject is refused here, without asking. While the client
   * is not connected, the token is the one its next attempt uses.
   * @param {string} token
   */
  setToken(token) {
    const sub = subjectOf(token);
    if (this.#subject && sub && sub !== this.#subject) {
      return Promise.reject(new PopsubError("another_subject",
        `the token is ${sub}'s; this client is ${this.#subject}'s`));
    }
    const ws = this.#ws;
    if (!ws || !this.#authenticated) {
      this.#token = token;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      this.#refreshes.push({token, resolve, reject});
      this.#send(ws, {type: "auth", token, client: this.#options.client});
    });
  }

  // # Frames from the broker

  #receive(ws, data) {
    // Nothing is delivered once close() returns, though the socket may
    // bring more before its close handshake ends.
    if (ws !== this.#ws || this.#closed) return;
    this.#heard = Date.now();
    // One WebSocket frame may hold several of the broker's, one a line.
    for (const line of String(data).split("\n")) {
      if (line !== "" && ws === this.#ws) this.#receiveOne(ws, line);
    }
  }

  #receiveOne(ws, line) {
    let frame;
    try { frame = JSON.parse(line); } catch { return; }
    switch (frame.type) {
      case "authenticated":
        return this.#authenticated ? this.#refreshed(frame)
          : this.#welcome(ws, frame);
      case "message":
        return this.#deliver(ws, frame);
      case "published":
        return this.#confirmed(frame);
      case "subscribed":
      case "unsubscribed":
        return this.#subscriptions.get(frame.topic)?._reply(frame);
      case "skipped":
        // A wildcard's names it as its filter; the topic is the one
        // whose messages are gone.
        return this.#subscriptions.get(frame.filter ?? frame.topic)
          ?._skipped(frame);
      case "error":
        return this.#refused(frame);
    }
  }

  #refreshed(frame) {
    const refresh = this.#refreshes.shift();
    if (refresh) this.#token = refresh.token;
    this.#scheduleRefresh();
    refresh?.resolve();
    this.#emit("refresh", {sub: frame.sub, conn: frame.conn});
  }

  #deliver(ws, frame) {
    for (const sub of this.#subscriptions.values()) {
      if (covers(sub.topic, frame.topic)) sub._deliver(ws, frame);
    }
  }

  #confirmed(frame) {
    const key = publishedTo(frame.topic) + "\u0000" + frame.message_id;
    const entry = this.#publishes.get(key);
    if (!entry) return;
    this.#publishes.delete(key);
    entry.resolve({topic: frame.topic, seq: frame.seq,
      messageId: frame.message_id, duplicate: !!frame.duplicate});
  }

  #refused(frame) {
    const err = new PopsubError(frame.code, frame.message, frame);
    // A refused publish names its message_id; a refused subscribe, its
    // topic; a refused refresh is an auth_failed on an open session.
    const key = publishedTo(frame.topic) + "\u0000" + frame.message_id;
    if (frame.message_id && this.#publishes.has(key)) {
      const entry = this.#publishes.get(key);
      this.#publishes.delete(key);
      return entry.reject(err);
    }
    if (frame.code === "auth_failed" && this.#refreshes.length > 0) {
      return this.#refreshes.shift().reject(err);
    }
    const sub = frame.topic && this.#subscriptions.get(frame.topic);
    if (sub && sub._refused(err)) return;
    if (frame.code === "auth_failed" && !this.#authenticated) return;
    this.#emit("error", err);
  }

  // # Sending: what one tick sends leaves in one frame
  //
  // Frames sent in the same tick (a loop of publishes, a resubscribe
  // after a reconnect, acks) wait for the end of the tick, and leave
  // joined by newlines, a WebSocket frame per 16 Ki characters: one
  // system call for the browser and one for the broker, where each
  // frame alone cost both. No timer: the frames leave when the caller
  // yields, as nats.js and centrifuge-js do. The first auth frame goes
  // alone and at once, because the broker reads it whole.

  #send(ws, frame) {
    if (!ws || ws.readyState !== 1) return;
    const text = JSON.stringify(frame);
    if (frame.type === "auth" && !this.#authenticated) {
      this.#flush();
      this.#sendJoined(ws, [text]);
      return;
    }
    if (this.#outgoingWS !== ws) {
      this.#flush();
      this.#outgoingWS = ws;
    }
    this.#outgoing.push(text);
    if (this.#outgoing.length === 1) queueMicrotask(() => this.#flush());
  }

  #flush() {
    const ws = this.#outgoingWS, texts = this.#outgoing;
    this.#outgoing = [];
    if (!ws || ws.readyState !== 1) return;
    let run = [], size = 0;
    for (const text of texts) {
      if (run.length > 0 && size + text.length > maxJoined) {
        this.#sendJoined(ws, run);
        run = [];
        size = 0;
      }
      run.push(text);
      size += text.length + 1;
    }
    if (run.length > 0) this.#sendJoined(ws, run);
  }

  // #sendJoined sends texts as one frame, joined by newlines, and counts
  // its characters for the ping's look at the backlog (#schedulePing).
  #sendJoined(ws, texts) {
    const data = texts.join("\n");
    if (ws === this.#ws) this.#sentChars += data.length;
    ws.send(data);
  }

  // # Publishing

  /**
   * Publishes payload, any JSON value, to topic. QoS 0 (the default)
   * resolves once sent, and rejects if the client is not connected. QoS
   * 1 resolves with the broker's confirm once the message is on disk,
   * sending it again after each reconnect until then.
   * @param {string} topic @param {any} payload
   * ttlMs delivers it only that many milliseconds from now. delayMs (or
   * deliverAt, Unix ms) delivers it then, not before: it needs qos 1, and
   * its confirm names $delayed/<topic>, where it waits.
   * @param {{qos?: 0|1, messageId?: string, ttlMs?: number,
   *   delayMs?: number, deliverAt?: number}} [options]
   * @returns {Promise<Confirm|undefined>}
   */
  publish(topic, payload, {qos = 0, messageId, ttlMs, delayMs,
    deliverAt} = {}) {
    if (this.#closed) {
      return Promise.reject(new PopsubError("closed", "the client is closed"));
    }
    const frame = {type: "publish", topic, payload, qos,
      message_id: messageId || newID()};
    if (ttlMs !== undefined) frame.ttl_ms = ttlMs;
    if (delayMs !== undefined) frame.delay_ms = delayMs;
    if (deliverAt !== undefined) frame.deliver_at = deliverAt;
    if (qos === 0 && (delayMs !== undefined || deliverAt !== undefined)) {
      return Promise.reject(new PopsubError("invalid_delay", "a delayed " +
        "publish needs qos 1: it is confirmed once stored"));
    }
    if (qos === 0) {
      if (!this.#authenticated) {
        return Promise.reject(new PopsubError("not_connected",
          "a QoS 0 publish is not kept while the client reconnects; " +
          "use qos: 1"));
      }
      this.#send(this.#ws, frame);
      return Promise.resolve(undefined);
    }
    return new Promise((resolve, reject) => {
      this.#publishes.set(topic + "\u0000" + frame.message_id,
        {frame, resolve, reject});
      if (this.#authenticated) this.#send(this.#ws, frame);
    });
  }

  // # Subscribing

  /**
   * Subscribes to topic (or a filter with + and #) and calls onMessage
   * for each delivery. Resolves once the broker answers "subscribed".
   * @param {string} topic
   * @param {(message: Message) => (void|Promise<void>)} onMessage
   * @param {SubscribeOptions} [options]
   * @returns {Promise<Subscription>}
   */
  subscribe(topic, onMessage, options = {}) {
    const unknown = Object.keys(options).filter((k) =>
      !["after", "last", "durable", "group", "ack"].includes(k));
    if (unknown.length > 0) {
      return Promise.reject(new PopsubError("bad_option", "subscribe " +
        "knows after, last, durable, group and ack, not " + unknown));
    }
    const old = this.#subscriptions.get(topic);
    if (old) old._end(new PopsubError("replaced", "subscribed again"));
    const sub = new Subscription(this, topic, onMessage, options,
      (ws, frame) => this.#send(ws, frame), (name, e) => this.#emit(name, e),
      () => this.#subscriptions.delete(topic));
    this.#subscriptions.set(topic, sub);
    if (this.#authenticated) sub._resubscribe(this.#ws);
    return sub.ready;
  }

  /** @param {Subscription} sub */
  _unsubscribe(sub) {
    if (this.#subscriptions.get(sub.topic) !== sub) return Promise.resolve();
    this.#subscriptions.delete(sub.topic);
    this.#send(this.#ws, {type: "unsubscribe", topic: sub.topic});
    return Promise.resolve();
  }
}

/** One subscription, which outlives the sockets under it. */
export class Subscription {
  #send;
  #emit;
  #forget;
  #handler;
  #options;
  #pendingReply = null;
  /** per topic: the highest seq seen, and the seqs not yet handled */
  #seen = new Map();
  #open = new Map();
  #baseline = 0;
  #subscribedOnce = false;
  #live = false; // the broker's "subscribed" came on this socket
  #asked; // the after of the last subscribe frame, for a gap event

  constructor(client, topic, handler, options, send, emit, forget) {
    this.client = client;
    /** @type {string} */ this.topic = topic;
    this.#handler = handler;
    this.#options = {ack: "auto", ...options};
    this.#send = send;
    this.#emit = emit;
    this.#forget = forget;
    this.wildcard = /[+#]/.test(topic);
    this.ready = new Promise((resolve, reject) => {
      this.#pendingReply = {resolve, reject};
    });
    this.ready.catch(() => {});
  }

  /** Stops the subscription; a durable cursor stays on the broker. */
  unsubscribe() { return this.client._unsubscribe(this); }

  /**
   * The seq to resume after on this topic: everything up to it was
   * handled. undefined before the first delivery or reply.
   */
  get position() {
    if (this.wildcard || !this.#subscribedOnce) return undefined;
    const open = this.#open.get(this.topic);
    if (open && open.size > 0) return Math.min(...open) - 1;
    return Math.max(this.#baseline, this.#seen.get(this.topic) || 0);
  }

  // The subscribe frame: the options as given the first time, and after
  // a reconnect the position reached (or the durable cursor).
  _resubscribe(ws) {
    const frame = {type: "subscribe", topic: this.topic};
    const {after, last, durable, group} = this.#options;
    const resuming = this.#subscribedOnce;
    if (group) {
      // A group keeps its own place in the log: a member resumes where
      // the group is, and its unacked jobs went to the others.
      frame.group = group;
      if (!resuming && after !== undefined) frame.after = after;
      else if (!resuming && last !== undefined) frame.last = last;
    } else if (durable) {
      frame.durable = durable;
    } else if (resuming && !this.wildcard) {
      frame.after = this.position;
    } else if (after !== undefined) {
      frame.after = after;
    } else if (last !== undefined) {
      frame.last = last;
    }
    this.#asked = frame.after;
    this.#live = false;
    // What comes after the resume point comes again, unacked or not: the
    // old socket's acks may not have arrived. A durable cursor may be
    // further back still, so it starts afresh.
    if (resuming) {
      if (durable || group) this.#seen.clear();
      else if (!this.wildcard) this.#seen.set(this.topic, frame.after);
      this.#open.clear();
    }
    this.#send(ws, frame);
  }

  _reply(frame) {
    if (frame.type === "unsubscribed") {
      if (frame.reason) this._end(new PopsubError("unsubscribed", frame.reason));
      return;
    }
    if (!this.#subscribedOnce && !this.wildcard) {
      // Where this subscription starts, for a resume before any delivery.
      const {after, last} = this.#options;
      this.#baseline = after ?? (last !== undefined
        ? Math.max(0, (frame.seq || 0) - last) : 0);
    }
    this.#subscribedOnce = true;
    this.#live = true;
    if (frame.recovered === false) {
      this.#emit("gap", {topic: this.topic, after: this.#asked,
        seq: frame.seq});
    }
    this.#pendingReply?.resolve(this);
    this.#pendingReply = null;
  }

  // The log overtook this subscription: what came up to frame.seq on
  // frame.topic (one a wildcard covers) is gone, and delivery goes on
  // after it.
  _skipped(frame) {
    if (!this.#live) return;
    const seen = this.#seen.get(frame.topic) || 0;
    this.#seen.set(frame.topic, Math.max(seen, frame.seq));
    this.#emit("gap", {topic: frame.topic, after: frame.seq - frame.missed,
      seq: frame.seq, missed: frame.missed});
  }

  _refused(err) {
    if (!this.#pendingReply) return false;
    this._end(err);
    return true;
  }

  _end(err) {
    this.#forget();
    this.#pendingReply?.reject(err);
    this.#pendingReply = null;
  }

  _deliver(ws, frame) {
    // The broker says "subscribed" before any message of a subscription,
    // so what comes on this topic before it was sent to the subscription
    // this one replaced, or to one unsubscribed a moment ago: the broker
    // dropped those with it, and this one's replay brings them again, in
    // order. Taken here, they would run ahead of the replay.
    if (!this.#live) return;
    // A delivery this subscription already handled comes again when two
    // overlapping subscriptions both match, and at a resume's hand-over.
    const seen = this.#seen.get(frame.topic) || 0;
    if (frame.attempt === 1 && frame.seq <= seen) return;
    this.#seen.set(frame.topic, Math.max(seen, frame.seq));
    const open = this.#open.get(frame.topic) || new Set();
    this.#open.set(frame.topic, open);
    open.add(frame.seq);

    // Settling it once, by ack or nak, is what counts; a second is
    // ignored.
    let acked = false;
    const settle = (extra) => {
      if (acked) return;
      acked = true;
      open.delete(frame.seq);
      if (frame.qos === 1) {
        this.#send(ws, {type: "ack", topic: frame.topic,
          message_id: frame.message_id, ...extra});
      }
    };
    const ack = () => settle({});
    const nak = ({delayMs, dead, reason} = {}) => settle({type: "nak",
      ...(delayMs !== undefined && {delay_ms: delayMs}),
      ...(dead && {dead: true}), ...(reason && {reason})});
    /** @type {Message} */
    const message = {topic: frame.topic, payload: frame.payload,
      seq: frame.seq, messageId: frame.message_id, qos: frame.qos,
      timestamp: frame.timestamp, attempt: frame.attempt, ack, nak,
      subscription: this};
    if (frame.expires_at) message.expiresAt = frame.expires_at;
    if (frame.deliver_at) message.deliverAt = frame.deliver_at;
    const manual = this.#options.ack === "manual" && frame.qos === 1;
    let result;
    try {
      result = this.#handler(message);
    } catch (err) {
      // An auto-acked handler that throws leaves the message unacked:
      // the broker sends it again after its ack timeout.
      console.error(err);
      return;
    }
    if (manual) return;
    Promise.resolve(result).then(ack, (err) => console.error(err));
  }
}

// # Following a topic over HTTP, with tokens that renew

/**
 * Follows topic with EventSource (Server-Sent Events, GET /topics/…),
 * for a page that only reads. EventSource resumes by itself after a
 * drop, but not after its token expires: the stream's last event says
 * token_expired, and its own reconnect, with the old token in the URL,
 * is refused. follow then asks getToken for a fresh one and opens the
 * stream again after the last seq it saw. It returns a function that
 * stops following.
 * @param {string} base the broker's http(s) URL, "" for this page's
 * @param {string} topic
 * @param {{getToken: () => (string|Promise<string>),
 *   onMessage: (m: object) => void, after?: number,
 *   onGap?: (e: object) => void, onClose?: (e: object) => void}} options
 * @returns {() => void}
 */
export function follow(base, topic, options) {
  const {getToken, onMessage, onGap = () => {}, onClose = () => {}} =
    options;
  // A wildcard is live only: it has no seq to go on after. Each level
  // goes into the path escaped, a wildcard's # above all, which would
  // otherwise end the path.
  const wildcard = /[+#]/.test(topic);
  const path = topic.split("/").map(encodeURIComponent).join("/");
  let after = options.after;
  let source = null;
  let stopped = false;
  const open = async () => {
    const token = await getToken();
    if (stopped) return;
    const query = new URLSearchParams({access_token: token});
    if (after !== undefined) query.set("after", String(after));
    source = new EventSource(`${base}/topics/${path}?${query}`);
    source.addEventListener("message", (e) => {
      const m = JSON.parse(e.data);
      if (m.seq && !wildcard) after = m.seq;
      onMessage(m);
    });
    source.addEventListener("subscribed", (e) => {
      const f = JSON.parse(e.data);
      if (f.recovered === false) onGap(f);
    });
    source.addEventListener("skipped", (e) => {
      const f = JSON.parse(e.data);
      if (!wildcard) after = Math.max(after ?? 0, f.seq);
      onGap(f);
    });
    source.addEventListener("closed", (e) => {
      const f = JSON.parse(e.data);
      onClose(f);
      // An expired token: this stream's own reconnect would be refused.
      if (f.code === "token_expired" || f.code === "auth_failed") {
        source.close();
        if (!stopped) open();
      }
    });
  };
  open();
  return () => {
    stopped = true;
    source?.close();
  };
}

// # Helpers

/** socketURL turns http(s)://host into ws(s)://host/ws. */
function socketURL(url) {
  const u = new URL(url, globalThis.location?.href);
  if (u.protocol === "http:") u.protocol = "ws:";
  if (u.protocol === "https:") u.protocol = "wss:";
  if (u.pathname === "/" || u.pathname === "") u.pathname = "/ws";
  return u.toString();
}

/** expiryOf returns a JWT's exp in Unix ms, or 0 if it has none. */
export function expiryOf(token) {
  const {exp} = claimsOf(token);
  return typeof exp === "number" ? exp * 1000 : 0;
}

/** subjectOf returns a JWT's sub, or "" if it has none. */
export function subjectOf(token) {
  return claimsOf(token).sub || "";
}

/** claimsOf decodes a JWT's claims, unverified, or returns {}. */
function claimsOf(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part + "=".repeat((4 - part.length % 4) % 4)));
  } catch {
    return {};
  }
}

/** covers reports whether a subscription's filter covers a topic. */
export function covers(filter, topic) {
  if (filter === topic) return true;
  if (topic.startsWith("$") && /^[+#]/.test(filter)) return false;
  const f = filter.split("/"), t = topic.split("/");
  for (let i = 0; i < f.length; i++) {
    if (f[i] === "#") return true;
    if (i >= t.length || (f[i] !== "+" && f[i] !== t[i])) return false;
  }
  return f.length === t.length;
}

/**
 * publishedTo is the topic a confirm or a refusal answers for: a delayed
 * publish's names $delayed/<topic>, where the message waits.
 */
function publishedTo(topic) {
  return topic?.startsWith("$delayed/") ? topic.slice(9) : topic;
}

/** newID returns a random message id. */
function newID() {
  if (globalThis.crypto?.randomUUID) return globalThis.crypto.randomUUID();
  return Date.now().toString(36) + Math.random().toString(36).slice(2);
}
