// The lab's host: it runs the Go of lab.wasm.gz (the real broker and its
// world) on a clock and random numbers the page owns, and wires the page
// to it. Everything the page draws comes from Go; this file keeps time,
// records the run, and replays it.
//
// Time. Go asks its host what time it is and, when every goroutine
// waits, for a wake-up after a delay (wasm_exec.js's nanotime1,
// walltime and scheduleTimeoutEvent). Here the answers come from a
// virtual clock that moves only to the next wake-up Go asked for, when
// the learner plays or steps: one step is one such move.
//
// Replay. Go's random numbers (its scheduler's, its maps', crypto/rand's)
// come from getRandomData, here a generator seeded by the run's seed. A
// run is then the seed and the learner's actions, each at the step it
// came after; the page calls popsubLab.view once after every step and
// every action, in a run as in its replay, so the Go side sees the same
// calls in the same order. The share link carries all of it.
"use strict";

(async function () {
	const $ = (id) => document.getElementById(id);
	const startedAt = performance.now();

	// A small seeded generator (mulberry32): the run's random numbers.
	function generator(seed) {
		let a = seed >>> 0;
		return () => {
			a = (a + 0x6d2b79f5) >>> 0;
			let t = a;
			t = Math.imul(t ^ (t >>> 15), t | 1);
			t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
			return ((t ^ (t >>> 14)) >>> 0);
		};
	}

	// host gives a Go instance the page's clock and the seed's random
	// numbers, in place of the browser's.
	function host(go, seed) {
		const clock = { now: 1e9, timeouts: new Map(), next: 1 };
		const wallStart = Date.UTC(2026, 0, 1) / 1000; // whole seconds
		const random = generator(seed);
		const setInt64 = (addr, v) => {
			go.mem.setUint32(addr, v % 4294967296, true);
			go.mem.setUint32(addr + 4, Math.floor(v / 4294967296), true);
		};
		const getInt64 = (addr) =>
			go.mem.getUint32(addr, true) + go.mem.getInt32(addr + 4, true) * 4294967296;
		const gojs = go.importObject.gojs;
		gojs["runtime.nanotime1"] = (sp) => { setInt64((sp >>> 0) + 8, clock.now); };
		gojs["runtime.walltime"] = (sp) => {
			sp >>>= 0;
			setInt64(sp + 8, wallStart + Math.floor(clock.now / 1e9));
			go.mem.setInt32(sp + 16, clock.now % 1e9, true);
		};
		gojs["runtime.scheduleTimeoutEvent"] = (sp) => {
			sp >>>= 0;
			const id = clock.next++;
			clock.timeouts.set(id, clock.now + getInt64(sp + 8) * 1e6);
			go.mem.setInt32(sp + 16, id, true);
		};
		gojs["runtime.clearTimeoutEvent"] = (sp) => {
			clock.timeouts.delete(go.mem.getInt32((sp >>> 0) + 8, true));
		};
		gojs["runtime.getRandomData"] = (sp) => {
			sp >>>= 0;
			const bytes = new Uint8Array(go._inst.exports.mem.buffer,
				getInt64(sp + 8), getInt64(sp + 16));
			for (let i = 0; i < bytes.length; i++) bytes[i] = random() & 255;
		};
		// nextWake returns the wake-up due first, lowest id first on a tie.
		clock.nextWake = () => {
			let id = null, at = Infinity;
			for (const [i, t] of clock.timeouts) {
				if (t < at) { id = i; at = t; }
			}
			return id === null ? null : { id, at };
		};
		return clock;
	}

	// The compiled module, fetched once: a run is a new instance of it.
	const module = await (async () => {
		const response = await fetch(document.body.dataset.wasm);
		if (!response.ok) throw new Error("lab.wasm.gz: " + response.status);
		const bytes = await new Response(response.body.pipeThrough(
			new DecompressionStream("gzip"))).arrayBuffer();
		return WebAssembly.compile(bytes);
	})();
	const scenarios = [];

	// run is the run on screen: its Go, clock, steps, and the actions
	// taken, each after the step it came after.
	let run = null;

	// start starts a fresh run of seed, its Go instance's main waiting,
	// on brokers: "popsub", "article" (the article's model of the
	// original), or "both", side by side.
	async function start(seed, brokers = "popsub") {
		const go = new Go();
		const clock = host(go, seed);
		const ready = new Promise((resolve) => { globalThis.popsubLabReady = resolve; });
		const instance = await WebAssembly.instantiate(module, go.importObject);
		go.run(instance);
		await ready;
		const problem = popsubLab.start(brokers);
		if (problem) throw new Error(problem);
		run = { go, clock, seed, brokers, steps: 0, actions: [], view: null, scenario: null,
			choice: null, phase: "free" };
		$("brokers").value = brokers;
		if (scenarios.length === 0) scenarios.push(...JSON.parse(popsubLab.scenarios()));
		look();
		return run;
	}

	// look asks Go for the run now: once after every step and action.
	function look(draw = true) {
		run.view = JSON.parse(popsubLab.view());
		if (draw) paint(run.view);
		return run.view;
	}

	// advance moves the clock to the next wake-up and lets Go run; it
	// reports whether there was one.
	function advance(draw = true) {
		const wake = run.clock.nextWake();
		if (wake === null) return false;
		run.clock.timeouts.delete(wake.id);
		run.clock.now = Math.max(run.clock.now, wake.at);
		run.go._resume();
		run.steps++;
		look(draw);
		return true;
	}

	// act does one action and records it.
	function act(action, draw = true) {
		run.actions.push([run.steps, action]);
		const problem = popsubLab.do(JSON.stringify(action));
		$("error").textContent = problem;
		look(draw);
	}

	// paint draws a view.
	// The diagram follows the newest event, unless the learner has
	// scrolled up to look at an older one.
	const follow = { diagram: true, "beside-diagram": true };
	for (const id in follow) {
		$(id).addEventListener("scroll", () => {
			const wrap = $(id);
			follow[id] = wrap.scrollTop + wrap.clientHeight >= wrap.scrollHeight - 30;
		});
	}
	function draw(id, html) {
		const wrap = $(id);
		wrap.innerHTML = html;
		if (follow[id]) wrap.scrollTop = wrap.scrollHeight;
	}
	const brokerName = (kind) => kind === "article" ? "the article's broker" : "popsub.go";
	function paint(v) {
		draw("diagram", v.diagram);
		$("checker").innerHTML = v.checker;
		$("stage-checker").innerHTML = v.checker;
		// The article's broker beside popsub.go: its own checker and
		// diagram, in a column of its own.
		const beside = v.beside || null;
		document.body.classList.toggle("side-by-side", beside !== null);
		$("beside").hidden = beside === null;
		if (beside) {
			draw("beside-diagram", beside.diagram);
			$("beside-checker").innerHTML = beside.checker;
		}
		document.querySelectorAll(".ours-name").forEach((e) => { e.textContent = brokerName(v.kind); });
		$("tables").innerHTML = v.tables;
		$("time").textContent = (v.now / 1000).toFixed(3) + " s";
		const state = $("broker-state");
		state.textContent = (v.kind === "article" ? "the article's broker " : "broker ") + v.broker;
		state.className = "state " + v.broker;
		document.body.classList.toggle("broken", v.broken);
		share();
	}

	// share makes the address the run: copy it, and it replays, to the
	// phase it had (a scenario's answer and verdict once it is done).
	function share() {
		const hash = "#" + shareHash();
		$("share").href = hash;
		history.replaceState(null, "", hash);
	}

	// The clock: play moves to each next wake-up after as much real time
	// as it is away (at the chosen speed, and never more than 0.4 s).
	let playing = false, timer = null;
	function realDelay() {
		const wake = run.clock.nextWake();
		if (wake === null) return null;
		const speed = Number($("speed").value);
		return Math.min(400, (wake.at - run.clock.now) / 1e6 / speed);
	}
	function play() {
		if (playing) return;
		playing = true;
		document.body.classList.add("playing");
		const tick = () => {
			if (!playing) return;
			const delay = realDelay();
			if (delay === null) { pause(); return; }
			timer = setTimeout(() => { if (playing) { advance(); tick(); } }, delay);
		};
		tick();
	}
	function pause() {
		playing = false;
		clearTimeout(timer);
		document.body.classList.remove("playing");
	}

	// The guided scenarios: each step an action, a wait or an until,
	// played at the clock's pace; the page stops to ask before the fault.
	let scriptRun = 0; // a new scenario or run cancels the one playing
	const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
	async function playSteps(steps, fast) {
		const mine = scriptRun;
		const pace = async () => {
			const delay = realDelay();
			if (!fast && delay !== null) await sleep(delay);
			return mine === scriptRun;
		};
		// An until waits for an event since the step before it: one the
		// action just before caused within the action (Go ran until
		// every goroutine waited) counts, as it does in Lab.Play.
		let acted = false;
		for (const step of steps) {
			if (mine !== scriptRun) return false;
			if (step.do) {
				act(step.do, !fast);
			} else if (step.wait) {
				const end = run.view.now + step.wait;
				while (run.view.now < end) {
					if (!(await pace()) || !advance(!fast)) break;
				}
			} else if (step.until) {
				const [kind, lane] = step.until.split(" ");
				const seen = () => run.view.fresh.some((e) =>
					e.kind === kind && (!lane || e.to === lane));
				const end = run.view.now + 60000;
				while (!(acted && seen())) {
					acted = true;
					if (!(await pace()) || !advance(!fast) || run.view.now > end) break;
				}
			}
			acted = !!step.do;
		}
		return mine === scriptRun;
	}

	function scenarioNamed(name) { return scenarios.find((s) => s.name === name); }

	// tell shows a scenario's question, or its answer once the fault ran.
	function tell(s) {
		$("story-title").textContent = s ? s.title : "Free play";
		const choices = $("choices"), explain = $("explain");
		choices.innerHTML = "";
		explain.hidden = true;
		document.body.dataset.phase = run.phase;
		share();
		if (!s) {
			$("story-text").textContent = "The clock waits for you: press play (or space) to let time run, or step (→) to the next timer. Make alice, bob and carol subscribe and publish below, then break something: the checker judges every event. The broker menu beside the clock runs the article's broker instead, or both side by side.";
			return;
		}
		$("story-text").textContent = s.question;
		s.choices.forEach((text, i) => {
			const b = document.createElement("button");
			b.className = "choice";
			b.textContent = text;
			b.dataset.choice = i;
			if (run.phase === "asking") b.onclick = () => answer(s, i);
			else b.disabled = true;
			if (run.choice === i) b.classList.add("picked");
			if (run.phase === "done" && i === s.answer) b.classList.add("right");
			choices.append(b);
		});
		if (run.phase === "done") {
			explain.innerHTML = "";
			const p = document.createElement("p");
			p.textContent = (run.choice === s.answer ? "Right. " : "Not quite. ") + s.explain;
			explain.append(p);
			for (const v of [run.view, run.view.beside].filter(Boolean)) {
				const line = document.createElement("p");
				line.className = "verdict " + (v.broken ? "broken" : "held");
				line.dataset.kind = v.kind;
				line.textContent = (run.view.beside ? brokerName(v.kind) + ": " : "") + (v.broken ?
					"the checker found a broken promise: the highlighted events break it." :
					"every promise it makes held.");
				explain.append(line);
			}
			if (s.figures && s.figures.length) explain.append(figureTable(s));
			const links = document.createElement("p");
			links.className = "links";
			links.append("Where popsub.go decides it: ");
			s.links.forEach((l, i) => {
				const a = document.createElement("a");
				a.href = "source.html#" + l.anchor;
				a.textContent = l.text;
				if (i > 0) links.append(" · ");
				links.append(a);
			});
			explain.append(links);
			explain.hidden = false;
		}
	}

	// figureTable sets the costs a scenario measures side by side, as
	// each broker's run measured them.
	function figureTable(s) {
		const table = document.createElement("table");
		table.className = "figures";
		const head = table.createTHead().insertRow();
		for (const text of ["what it cost", "popsub.go", "the article's"]) {
			const th = document.createElement("th");
			th.textContent = text;
			head.append(th);
		}
		const measured = JSON.parse(popsubLab.figures(JSON.stringify(s.figures)));
		const body = table.createTBody();
		for (const each of measured) {
			const row = body.insertRow();
			row.dataset.spec = each[0].spec;
			row.insertCell().textContent = each[0].name;
			for (const f of each) {
				const cell = row.insertCell();
				cell.textContent = f.value.toLocaleString("en") + (f.unit ? " " + f.unit : "");
				cell.dataset.value = f.value;
			}
		}
		return table;
	}

	// begin starts a scenario: the scene, then the question. Free play
	// runs on the brokers the learner picked.
	async function begin(name, seed) {
		pause();
		scriptRun++;
		const s = scenarioNamed(name) || null;
		await start(seed, s ? (s.beside ? "both" : "popsub") : $("brokers").value);
		run.scenario = s ? s.name : null;
		run.phase = s ? "setting" : "free";
		tell(s);
		if (!s) return;
		if (await playSteps(s.setup, false)) {
			run.phase = "asking";
			tell(s);
		}
	}

	// answer records the prediction and runs the fault.
	async function answer(s, choice) {
		run.choice = choice;
		run.phase = "running";
		tell(s);
		if (await playSteps(s.fault, false)) {
			run.phase = "done";
			tell(s);
			document.body.dataset.verdict = run.view.broken ? "broken" : "held";
		}
	}

	// shareHash is the run as a URL fragment: seed, scenario, prediction,
	// actions with their steps, and the step it ended at.
	function shareHash() {
		const p = new URLSearchParams();
		p.set("seed", run.seed);
		if (run.brokers !== "popsub") p.set("brokers", run.brokers);
		if (run.scenario) p.set("scenario", run.scenario);
		if (run.choice !== null) p.set("choice", run.choice);
		p.set("phase", run.phase);
		p.set("run", btoa(JSON.stringify(run.actions)));
		p.set("end", run.steps);
		return p.toString();
	}

	// replay opens a shared run: the same seed, each action after the same
	// step, and every step up to the end, without drawing until the end.
	async function replay(p) {
		scriptRun++;
		await start(Number(p.get("seed")) || 1, p.get("brokers") || "popsub");
		const actions = JSON.parse(atob(p.get("run") || "W10="));
		const end = Number(p.get("end")) || 0;
		for (const [at, action] of actions) {
			while (run.steps < at && advance(false)) { }
			act(action, false);
		}
		while (run.steps < end && advance(false)) { }
		run.scenario = p.get("scenario");
		run.choice = p.has("choice") ? Number(p.get("choice")) : null;
		run.phase = p.get("phase") || "free";
		paint(run.view);
		tell(scenarioNamed(run.scenario) || null);
		document.body.dataset.verdict = run.view.broken ? "broken" : "held";
	}

	// The controls.
	let client = "alice";
	document.querySelectorAll(".tab").forEach((tab) => {
		tab.onclick = () => {
			client = tab.dataset.client;
			document.querySelectorAll(".tab").forEach((t) =>
				t.setAttribute("aria-selected", String(t === tab)));
		};
	});
	document.querySelectorAll("[data-act]").forEach((button) => {
		button.onclick = () => {
			const action = { do: button.dataset.act };
			if (!button.dataset.broker) action.client = client;
			if (action.do === "subscribe" || action.do === "publish") action.topic = $("topic").value;
			if (button.dataset.qos) action.qos = Number(button.dataset.qos);
			if (button.dataset.count) action.count = Number(button.dataset.count);
			if (action.do === "subscribe") {
				const mode = $("mode").value;
				if (mode === "durable") action.durable = client + "-" + action.topic;
				if (mode === "group") action.group = "workers";
				if (mode === "after") action.after = Math.max(0, Math.floor(Number($("after").value)) || 0);
			}
			act(action);
		};
	});
	// The seq box is for "after seq" alone.
	$("mode").onchange = () => { $("after").hidden = $("mode").value !== "after"; };
	$("brokers").onchange = () => {
		document.querySelectorAll(".pick").forEach((o) => o.classList.toggle("current", o.dataset.scenario === ""));
		begin("", 1);
	};
	$("play").onclick = play;
	$("pause").onclick = pause;
	$("step").onclick = () => { pause(); advance(); };
	// The keyboard, outside the form's fields: space plays or pauses,
	// the right arrow steps.
	document.addEventListener("keydown", (e) => {
		if (e.target.closest("input, select, textarea") || e.altKey ||
			e.ctrlKey || e.metaKey) return;
		if (e.key === " ") { e.preventDefault(); playing ? pause() : play(); }
		if (e.key === "ArrowRight") { e.preventDefault(); pause(); advance(); }
	});
	document.querySelectorAll(".pick").forEach((b) => {
		b.onclick = () => {
			document.querySelectorAll(".pick").forEach((o) => o.classList.toggle("current", o === b));
			begin(b.dataset.scenario, 1);
		};
	});

	// Open the run the address names, or a fresh one.
	const params = new URLSearchParams(location.hash.slice(1));
	if (params.has("run")) await replay(params);
	else {
		await start(Number(params.get("seed")) || 1, params.get("brokers") || "popsub");
		tell(null);
	}
	document.body.dataset.ready = String(Math.round(performance.now() - startedAt));
	// For tests and the curious: the run's history and its verdicts.
	globalThis.lab = {
		history: () => popsubLab.history(),
		view: () => run.view,
		hash: shareHash,
	};
})().catch((err) => {
	document.getElementById("story-text").textContent = "The lab did not start: " + err;
	document.body.dataset.failed = String(err);
});
