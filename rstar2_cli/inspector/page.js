// The trajectory browser: builds the page from the JSON in #rstar2-data (rstar2_cli/inspector/page.py).
// Model output is untrusted: every text goes into the DOM through textContent / createTextNode.
// DATA.on_demand (`rstar2 inspect --serve`): a section holds no trajectory until it is opened; then
// its trajectories come from the server at section.url (rstar2_cli/inspector/serve.py).
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("rstar2-data").textContent);
  const TAGS = DATA.tags;
  const num = (v) => (typeof v === "number" && isFinite(v) ? v : 0);
  const COLORS = ["#3366cc", "#dc3912", "#109618", "#ff9900", "#990099", "#0099c6", "#dd4477"];
  const FOLD_CHARS = 1200, FOLD_LINES = 25;

  function repeatedCalls(t) {
    const seen = new Set(); let n = 0;
    for (const turn of t.turns || []) {
      const code = turn.role === "assistant" && typeof turn.tool_code === "string" ? turn.tool_code.trim() : null;
      if (!code) continue;
      if (seen.has(code)) n++; else seen.add(code);
    }
    return n;
  }
  // a trajectory's mean |trainer - engine| log-prob gap above GAP_FACTOR x its step's
  // (train/logprob_abs_diff_vllm: the token-weighted mean of every trained trajectory's)
  const GAP_FACTOR = 2;
  const STEP_GAP = new Map(DATA.metrics.filter((r) => typeof r["train/logprob_abs_diff_vllm"] === "number")
    .map((r) => [r.step, r["train/logprob_abs_diff_vllm"]]));
  const largeGap = (t) => !!t.logprob_gap && STEP_GAP.has(t.step) &&
    num(t.logprob_gap.mean_abs) > GAP_FACTOR * STEP_GAP.get(t.step);
  const FILTERS = [
    ["tool_error_positive", "tool errors in positives", (t) => num(t.reward) >= 1 && num(t.tool_errors) > 0],
    ["void_turns", "void turns", (t) => num(t.void_turns) > 0],
    ["repeated_tool_calls", "repeated tool calls", (t) => repeatedCalls(t) > 0],
    ["fault", "faults", (t) => !!t.fault],
    ["large_gap", "log-prob gap > " + GAP_FACTOR + "x its step's", largeGap],
    ["wrong", "wrong answers", (t) => !(num(t.reward) > 0)],
  ];

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  const fmt = (v, d = 3) =>
    (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toFixed(d)) : v == null ? "-" : String(v));

  // ---- state in the URL hash: #filter=a,b&section=3&traj=2.5.1 -------------------------------
  // a filter, section or trajectory in the URL that the page does not have is named on it (#url-note)
  function readHash() {
    const p = new URLSearchParams(location.hash.replace(/^#/, ""));
    const asked = (p.get("filter") || "").split(",").filter((f) => f);
    const filters = asked.filter((f) => FILTERS.some(([k]) => k === f));
    const problems = asked.filter((f) => !filters.includes(f)).map((f) => "filter " + JSON.stringify(f) +
      " is not one of this page's (" + FILTERS.map(([k]) => k).join(", ") + ")");
    let section = p.has("section") ? Number(p.get("section")) : null;
    if (section !== null && !(Number.isInteger(section) && section >= 0 && section < DATA.sections.length)) {
      problems.push("section " + JSON.stringify(p.get("section")) + " is not one of this page's " +
        (DATA.sections.length ? "0.." + (DATA.sections.length - 1) : "(it has none)"));
      section = null;
    }
    return { filters, section, traj: p.get("traj"), problems };
  }
  function drawUrlNote() {
    const box = document.getElementById("url-note");
    box.replaceChildren(...state.problems.map((m) => el("div", {}, "in the URL: " + m + "; left aside")));
    box.hidden = !state.problems.length;
  }
  let state = readHash();
  function writeHash() {
    const p = new URLSearchParams();
    if (state.filters.length) p.set("filter", state.filters.join(","));
    if (state.section !== null) p.set("section", String(state.section));
    if (state.traj) p.set("traj", state.traj);
    history.replaceState(null, "", "#" + p.toString().replace(/%2C/g, ","));
  }
  const matches = (t) => state.filters.every((f) => FILTERS.find(([k]) => k === f)[2](t));

  // ---- curves -------------------------------------------------------------------------------
  const tick = (v) => (Math.abs(v) >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(3))));
  function series(rows, key) {
    return rows.filter((r) => typeof r[key] === "number" && typeof r.step === "number").map((r) => [r.step, r[key]]);
  }
  function panel(title, lines) {
    const present = lines.map(([key, label]) => [label, series(DATA.metrics, key)]).filter(([, pts]) => pts.length);
    if (!present.length) return null;
    const W = 300, H = 150, L = 44, B = 22, T = 8, R = 8, NS = "http://www.w3.org/2000/svg";
    const all = present.flatMap(([, pts]) => pts);
    let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - B - T);
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    const add = (tag, attrs, text) => {
      const n = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
      if (text !== undefined) n.textContent = text;
      svg.appendChild(n); return n;
    };
    add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#999" });
    add("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#999" });
    add("text", { x: L - 3, y: T + 8, "text-anchor": "end" }, tick(y1));
    add("text", { x: L - 3, y: H - B, "text-anchor": "end" }, tick(y0));
    add("text", { x: L, y: H - 6 }, "step " + fmt(x0));
    add("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "step " + fmt(x1));
    const legend = el("div", { class: "legend" });
    present.forEach(([label, pts], i) => {
      const color = COLORS[i % COLORS.length];
      add("polyline", { points: pts.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" "),
        fill: "none", stroke: color, "stroke-width": 1.5, "stroke-dasharray": i % 2 ? "5,3" : "none" });
      if (pts.length < 40) pts.forEach(([x, y]) => add("circle", { cx: sx(x), cy: sy(y), r: 2, fill: color }));
      legend.appendChild(el("span", {}, el("i", { class: "swatch", style: "background:" + color }), label));
    });
    return el("div", { class: "panel" }, el("h3", {}, title), svg, legend);
  }
  function drawCurves() {
    const box = document.getElementById("curves");
    const evalSets = [...new Set(DATA.metrics.flatMap((r) => Object.keys(r))
      .filter((k) => /^eval\/[^/]+\/accuracy$/.test(k)).map((k) => k.split("/")[1]))].sort();
    const panels = [
      panel("reward / accuracy", [["rollout/reward_mean", "reward"], ["rollout/accuracy", "accuracy"],
        ["eval/accuracy", "validation accuracy"],
        ...evalSets.map((n) => ["eval/" + n + "/accuracy", n + " (validation)"])]),
      panel("response length (tokens)", [["rollout/response_length_mean", "training"],
        ...evalSets.map((n) => ["eval/" + n + "/response_tokens_mean", n + " (validation)"])]),
      panel("tool calls per trajectory", [["rollout/tool_calls_mean", "mean"]]),
      panel("tool-error ratio", [["rollout/tool_error_ratio", "all"],
        ["rollout/tool_error_ratio_positive", "positives"]]),
    ].filter(Boolean);
    panels.forEach((p) => box.appendChild(p));
    if (DATA.kind === "eval") box.appendChild(evalTable());
    if (!box.children.length) box.appendChild(el("p", { class: "note" }, "no metrics.jsonl rows to draw"));
  }
  function evalTable() {
    const keys = [...new Set(DATA.sections.flatMap((s) => Object.keys(s.summary)))].slice(0, 10);
    return el("table", { class: "summary" },
      el("tr", {}, el("th", {}, "benchmark"), ...keys.map((k) => el("th", {}, k))),
      ...DATA.sections.map((s) => el("tr", {}, el("td", {}, s.name),
        ...keys.map((k) => el("td", {}, fmt(s.summary[k]))))));
  }

  // ---- filters and section list ---------------------------------------------------------------
  function drawFilters() {
    const nav = document.getElementById("filters");
    nav.replaceChildren(el("b", {}, "filters: "));
    const everything = DATA.sections.flatMap((s) => s.trajectories);
    for (const [key, label, test] of FILTERS) {
      const box = el("input", { type: "checkbox", id: "f-" + key, "data-filter": key,
        onchange: (e) => {
          state.filters = FILTERS.map(([k]) => k)
            .filter((k) => (k === key ? e.target.checked : state.filters.includes(k)));
          state.section = null; state.traj = null; writeHash(); render(); } });
      if (state.filters.includes(key)) { box.checked = true; box.setAttribute("checked", ""); }
      const count = el("span", { class: "n" }, "(" + everything.filter(test).length + ")");
      nav.appendChild(el("label", {}, box, " " + label + " ", count));
    }
    if (DATA.on_demand) nav.appendChild(el("span", { class: "n" }, "(counts over the steps loaded)"));
  }
  function drawSections() {
    const list = document.getElementById("sections");
    list.replaceChildren();
    DATA.sections.forEach((s, i) => {
      const hits = s.trajectories.filter(matches).length;
      const acc = s.summary["rollout/accuracy"] ?? s.summary["accuracy"];
      const sub = (pending(s) ? "not loaded"
        : hits + (state.filters.length ? " matching of " : " shown of ") + s.total) +
        (acc !== undefined ? ", acc " + fmt(acc) : "");
      const empty = !hits && !pending(s);
      list.appendChild(el("li", { class: "section" + (i === state.section ? " selected" : "") + (empty ? " empty" : ""),
        "data-section": i, onclick: () => { state.section = i; state.traj = null; writeHash(); render(); } },
        s.name, el("span", { class: "sub" }, sub)));
    });
  }

  // ---- sections loaded on demand (DATA.on_demand) ---------------------------------------------
  const pending = (s) => !!s.url && !s.loaded;
  function load(s) {
    if (s.loading) return;
    s.loading = true;
    fetch(s.url, { cache: "no-store" })
      .then((r) => r.json().catch(() => ({})).then((body) => {
        if (!r.ok || !Array.isArray(body.trajectories)) throw new Error(body.error || "HTTP " + r.status);
        s.trajectories = body.trajectories; s.total = body.total; s.loaded = true; s.error = null;
        DATA.shown += body.trajectories.length;
      }))
      .catch((e) => { s.error = "could not load " + s.url + ": " + e.message +
        (location.protocol === "file:" ? " (steps load from `rstar2 inspect RUN_DIR --serve PORT`)" : ""); })
      .finally(() => { s.loading = false; drawCounts(); drawFilters(); render(); });
  }
  function drawPending(main, s) {
    main.appendChild(el("h2", {}, s.name));
    if (!s.error) {
      main.appendChild(el("p", { class: "note" }, "loading " + s.name + " from the server ..."));
      load(s);
      return;
    }
    main.appendChild(el("p", { class: "note load-error" }, s.error, " ",
      el("button", { onclick: () => { s.error = null; render(); } }, "retry")));
  }

  // ---- one section: groups, trajectories, turns -----------------------------------------------
  const PY_KW = new RegExp("^(?:False|None|True|and|as|assert|async|await|break|class|continue|def|del|elif|else|" +
    "except|finally|for|from|global|if|import|in|is|lambda|nonlocal|not|or|pass|raise|return|try|while|with|" +
    "yield|print|range|len)$");
  function highlight(code) {
    const pre = el("pre", { class: "code" });
    const token = new RegExp([/(#[^\n]*)/.source,                                     // comment
      /("""[\s\S]*?"""|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')/.source,   // string
      /\b(\d+(?:\.\d+)?)\b/.source, /([A-Za-z_]\w*)/.source].join("|"), "g");         // number, name
    let last = 0, m;
    while ((m = token.exec(code))) {
      if (m.index > last) pre.appendChild(document.createTextNode(code.slice(last, m.index)));
      const cls = m[1] ? "com" : m[2] ? "str" : m[3] ? "num" : PY_KW.test(m[4]) ? "kw" : null;
      pre.appendChild(cls ? el("span", { class: cls }, m[0]) : document.createTextNode(m[0]));
      last = token.lastIndex;
    }
    pre.appendChild(document.createTextNode(code.slice(last)));
    return pre;
  }
  function folded(text, node) {
    const lines = text.split("\n").length;
    if (text.length <= FOLD_CHARS && lines <= FOLD_LINES) return node;
    const head = text.slice(0, 100).split("\n")[0] + " ... (" + lines + " lines, " + text.length + " characters)";
    return el("details", {}, el("summary", {}, head), node);
  }
  function turnNode(turn) {
    if (turn.role === "tool") {
      const bad = turn.status && turn.status !== "ok";
      return el("div", { class: "turn tool" + (bad ? " bad" : "") }, el("span", { class: "role" }, "tool",
        el("span", { class: "badge " + (turn.status || "ok") }, turn.status || "?"),
        turn.tokens != null ? " " + turn.tokens + " tokens" : ""),
        folded(turn.text || "", el("div", {}, turn.text || "")));
    }
    let text = turn.text || "";
    const hasCode = typeof turn.tool_code === "string";
    if (hasCode) {
      const open = text.indexOf(TAGS.call_open), close = text.indexOf(TAGS.call_close, open);
      if (open >= 0) text = text.slice(0, open) + (close >= 0 ? text.slice(close + TAGS.call_close.length) : "");
    }
    const role = el("span", { class: "role" }, "assistant", turn.tokens != null ? " " + turn.tokens + " tokens" : "");
    return el("div", { class: "turn assistant" }, role,
      folded(text, el("div", {}, text.trim())), hasCode ? folded(turn.tool_code, highlight(turn.tool_code)) : null,
      turn.parse_error ? el("div", { class: "badge parse_error" }, "parse error: " + turn.parse_error) : null);
  }
  function trajBody(t) {
    const roc = t.roc || {};
    const rows = [["reward", fmt(t.reward)], ["extracted / gold", fmt(t.extracted) + " / " + fmt(t.gold)],
      ["grade reason", t.grade_reason], ["finish reason", t.finish_reason], ["fault", t.fault],
      ["RoC", t.roc ? [roc.decision, roc.as ? "as " + roc.as : null, roc.rule].filter(Boolean).join(" · ") : null],
      ["RoC p_err / p_format", t.roc && (roc.p_err != null || roc.p_format != null)
        ? fmt(roc.p_err) + " / " + fmt(roc.p_format) : null],
      ["advantage", t.advantage != null ? fmt(t.advantage, 4) : null],
      ["log-prob gap (trainer vs engine)", t.logprob_gap
        ? "mean |d| " + fmt(t.logprob_gap.mean_abs, 4) + ", max " + fmt(t.logprob_gap.max_abs, 4) +
          (t.logprob_gap.tokens != null ? " over " + t.logprob_gap.tokens + " tokens" : "") +
          (STEP_GAP.has(t.step) ? "; step mean " + fmt(STEP_GAP.get(t.step), 4) : "") : null],
      ["tokens / tool calls / errors / void turns",
        [t.response_tokens, t.tool_calls, t.tool_errors, t.void_turns].map((v) => fmt(v)).join(" / ")]];
    return el("div", { class: "body" },
      el("table", { class: "meta" }, ...rows.filter(([, v]) => v != null && v !== "")
        .map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v)))),
      ...(t.turns || []).map(turnNode));
  }
  function trajNode(t, id, open) {
    const roc = t.roc;
    const reward = num(t.reward);
    const flags = FILTERS.filter(([k, , test]) => k !== "wrong" && test(t))
      .map(([, label]) => el("span", { class: "badge flag" }, label));
    const d = el("details", { class: "traj", "data-traj": id },
      el("summary", {}, "sample " + fmt(t.sample),
        el("span", { class: "badge " + (reward > 0 ? "pos" : "neg") }, "reward " + fmt(t.reward)),
        " " + fmt(t.response_tokens) + " tok, " + fmt(t.tool_calls) + " calls, " + fmt(t.tool_errors) + " errors",
        roc ? el("span", { class: "badge roc" }, "RoC " + roc.decision + (roc.as ? " (" + roc.as + ")" : "")) : null,
        t.advantage != null ? el("span", { class: "badge" }, "adv " + fmt(t.advantage)) : null,
        t.fault ? el("span", { class: "badge fault" }, "fault: " + t.fault) : null, ...flags));
    let filled = false;
    const fill = () => { if (!filled && d.open) { filled = true; d.appendChild(trajBody(t)); } };
    d.addEventListener("toggle", () => { fill(); if (d.open) { state.traj = id; writeHash(); } });
    if (open) { d.open = true; fill(); }
    return d;
  }
  function drawDetail() {
    const main = document.getElementById("detail");
    main.replaceChildren();
    const s = DATA.sections[state.section];
    if (!s) { main.appendChild(el("p", { class: "note" }, "no trajectory matches the filters")); return; }
    if (pending(s)) { drawPending(main, s); return; }
    const shown = s.trajectories.map((t, i) => [t, i]).filter(([t]) => matches(t));
    main.appendChild(el("h2", {}, s.name));
    main.appendChild(el("p", { class: "note" }, shown.length + " trajectories shown here, " + s.trajectories.length +
      (s.url ? " loaded from the server" : " embedded") + " of " + s.total + " in this " +
      (DATA.kind === "rl" ? "step" : "benchmark")));
    const groups = new Map();
    for (const [t, i] of shown) {
      const key = (t.node ?? "") + "/" + (t.group ?? "");
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push([t, i]);
    }
    let first = true;
    for (const members of groups.values()) {
      const t0 = members[0][0];
      const where = DATA.kind === "rl"
        ? "group " + fmt(t0.group) + (t0.node != null ? " (node " + t0.node + ")" : "") + " · " : "problem ";
      const head = where + fmt(t0.prompt_id) + " · gold " + fmt(t0.gold);
      const box = el("div", { class: "group" }, el("h3", {}, head));
      if (t0.problem) box.appendChild(folded(t0.problem, el("div", { class: "problem" }, t0.problem)));
      for (const [t, i] of members) {
        const id = state.section + "." + i;
        box.appendChild(trajNode(t, id, state.traj ? state.traj === id : first));
        first = false;
      }
      main.appendChild(box);
    }
  }

  function render() {
    const current = DATA.sections[state.section];
    if (DATA.on_demand) {             // a step is opened where asked (loaded if need be), never skipped
      if (!current) state.section = DATA.sections.length ? 0 : null;
    } else if (state.section === null || !current || !current.trajectories.some(matches)) {
      const i = DATA.sections.findIndex((s) => s.trajectories.some(matches));
      state.section = i >= 0 ? i : null;
    }
    drawSections();
    drawDetail();
  }
  function drawCounts() {
    const unit = DATA.kind === "rl" ? "steps" : "benchmarks";
    const loaded = DATA.sections.filter((s) => s.loaded).length;
    document.getElementById("counts").textContent = DATA.on_demand
      ? DATA.sections.length + " " + unit + "; each step's trajectories load from the server when opened: " +
        DATA.shown + " trajectories of " + loaded + " " + (loaded === 1 ? "step" : unit) + " loaded so far"
      : "showing " + DATA.shown + " of " + DATA.total + " trajectories from " + DATA.sections.length + " " + unit +
        (DATA.skipped ? " (" + DATA.skipped + " unreadable lines skipped)" : "");
  }
  drawCounts();
  drawUrlNote();
  drawCurves();
  drawFilters();
  render();
  window.addEventListener("hashchange", () => { state = readHash(); drawUrlNote(); drawFilters(); render(); });
})();
