// The tlaunch dashboard: plain JavaScript of our own, no build step.
// Data: the job server's /v1 API with the user's bearer token; live updates are
// server-sent events read with fetch() (EventSource cannot send a token).
"use strict";

const COLORS = { running: "#0b6bcb", serving: "#0b6bcb", done: "#1b873f", failed: "#c62828",
  stopped: "#6d4c41", pending: "#b26a00", starting: "#b26a00", restarting: "#b26a00" };
let token = sessionStorage.getItem("tlaunch-token") || "";
let current = null;  // { runId, aborts: [AbortController] }

function headers() { return token ? { Authorization: "Bearer " + token } : {}; }

async function api(path) {
  const r = await fetch(path, { headers: headers() });
  if (r.status === 401) { askToken(); throw new Error("unauthorized"); }
  const body = await r.json();
  if (!r.ok) throw new Error(body.error ? body.error.message : r.statusText);
  return body;
}

// Server-sent events over fetch: calls onEvent(name, data) per event until the stream ends.
async function events(path, onEvent, abort) {
  const r = await fetch(path, { headers: headers(), signal: abort.signal });
  if (!r.ok) return;
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      onEvent(name, data ? JSON.parse(data) : null);
    }
  }
}

// A stream followed across server restarts: reconnects a second after it breaks, until its
// "end" event or the abort; ``again`` runs before each reconnection (a log starts over).
async function follow(path, onEvent, abort, again) {
  let ended = false, first = true;
  while (!abort.signal.aborted && !ended) {
    if (!first && again) again();
    first = false;
    try {
      await events(path, (name, data) => { if (name === "end") ended = true; onEvent(name, data); }, abort);
    } catch (e) { /* a broken stream: the server restarts, or the network */ }
    if (!ended && !abort.signal.aborted) await new Promise(r => setTimeout(r, 1000));
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function row(cells, state, onClick) {
  const tr = el("tr", {});
  cells.forEach((c, i) => tr.append(el("td", i === cells.length - 1 ? { class: "state " + state } : {}, String(c ?? ""))));
  tr.onclick = onClick;
  return tr;
}

// Filters and the page of runs live in the URL's query (?q=&state=&user=&label=&page=): a reload,
// a bookmark or a shared link shows the same lists; the open run is the URL's #hash.
const FILTERS = { q: "filter-text", state: "filter-state", user: "filter-user", label: "filter-label" };
const PAGE = 50;

function filters() {
  const params = new URLSearchParams(location.search);
  return { q: params.get("q") || "", state: params.get("state") || "", user: params.get("user") || "",
    label: params.get("label") || "", page: Math.max(0, Number(params.get("page") || 0)) };
}

function setFilter(name, value) {
  const params = new URLSearchParams(location.search);
  if (value === "" || value === 0) params.delete(name); else params.set(name, String(value));
  if (name !== "page") params.delete("page");
  history.replaceState(null, "", `${location.pathname}${params.size ? "?" + params : ""}${location.hash}`);
  refreshLists();
}

function matches(f, state, texts, owner, labels) {
  if (f.state && state !== f.state) return false;
  if (f.q && !texts.some(t => String(t || "").toLowerCase().includes(f.q.toLowerCase()))) return false;
  if (f.user && owner !== undefined && owner !== f.user) return false;
  if (f.label && labels !== undefined) {
    const [k, v] = f.label.split("=");
    if (!labels || labels[k] !== v) return false;
  }
  return true;
}

// The server's pool of hosts (none: the box stays hidden): each GPU with the job on it.
function showPool(pool) {
  document.getElementById("pool-box").hidden = false;
  document.querySelector("#pool tbody").replaceChildren(...pool.hosts.map(h => {
    const tr = el("tr", { "data-host": h.name, class: h.up ? "up" : "down" });
    tr.append(el("td", h.up ? {} : { class: "state LOST", title: h.reason || "" },
      h.up ? h.name : `${h.name} (down)`));
    const gpus = el("td", {});
    for (const g of h.gpus) {
      const other = g.others.map(o => `pid ${o.pid} ${o.name}`).join(", ");
      const who = g.job || other || "free";
      gpus.append(el("span", { class: "gpu " + (g.job ? "held" : other ? "other" : "free"),
        "data-index": String(g.index), title: `${g.name} ${g.uuid || ""}` }, `${g.index}: ${who}`), " ");
    }
    tr.append(gpus, el("td", {}, `${h.cpus_used}/${h.cpus}`));
    return tr;
  }));
}

async function refreshLists() {
  const f = filters();
  try {
    const [jobs, runs] = await Promise.all([api("/v1/jobs"), api(`/v1/runs?limit=${PAGE}&offset=${f.page * PAGE}`)]);
    const jb = document.querySelector("#jobs tbody");
    jb.replaceChildren(...jobs.jobs.filter(j => matches(f, j.state, [j.name, j.owner], j.owner, j.labels || {}))
      .map(j => {
        const state = j.queue ? `${j.state} #${j.queue.position}` : j.state;  // a pool's: its place
        const tr = row([j.name, j.owner, state], j.state, () => j.refs.run_id && openRun(j.refs.run_id));
        if (j.queue) tr.title = j.queue.reason;  // why it waits, on hover
        tr.dataset.job = j.name;
        const ended = ["SUCCEEDED", "FAILED", "STOPPED", "LOST"].includes(j.state);
        const stop = el("button", { type: "button", class: "stop-job" }, "stop");
        stop.disabled = ended;
        stop.onclick = e => { e.stopPropagation(); jobAction(j, "stop"); };
        const restart = el("button", { type: "button", class: "restart-job" }, "restart");
        restart.disabled = !ended;
        restart.onclick = e => { e.stopPropagation(); jobAction(j, "restart"); };
        const del = el("button", { type: "button", class: "delete-job" }, "delete");
        del.onclick = e => { e.stopPropagation(); jobAction(j, "delete"); };
        tr.append(el("td", {}, stop, restart, del));
        return tr;
      }));
    api("/v1/pool").then(showPool, () => { document.getElementById("pool-box").hidden = true; });
    const rb = document.querySelector("#runs tbody");
    rb.replaceChildren(...runs.runs.filter(r => matches(f, r.state, [r.run_id, r.program, r.backend, ...(r.hosts || [])]))
      .map(r => {
        const tr = row([r.run_id, r.backend, r.state], r.state, () => openRun(r.run_id));
        tr.dataset.run = r.run_id;
        return tr;
      }));
    const pages = Math.max(1, Math.ceil(runs.total / PAGE));
    document.getElementById("page-of").textContent = `page ${f.page + 1} of ${pages} (${runs.total} runs)`;
    document.getElementById("prev").disabled = f.page === 0;
    document.getElementById("next").disabled = f.page + 1 >= pages;
  } catch (e) { /* shown by askToken, or retried */ }
}

function initFilters() {
  const f = filters();
  for (const [name, id] of Object.entries(FILTERS)) {
    const input = document.getElementById(id);
    input.value = f[name];
    input.oninput = () => setFilter(name, input.value.trim());
  }
  document.getElementById("filters").onsubmit = e => e.preventDefault();
  document.getElementById("prev").onclick = () => setFilter("page", Math.max(0, filters().page - 1));
  document.getElementById("next").onclick = () => setFilter("page", filters().page + 1);
}

// A traceback with the user's frames first and tlaunch's (and libraries') folded.
function foldedTraceback(text) {
  const lines = (text || "").trimEnd().split("\n");
  const frames = [];
  let head = [], tail = [];
  for (const line of lines) {
    if (line.startsWith("  File ")) frames.push([line]);
    else if (frames.length && line.startsWith("    ")) frames[frames.length - 1].push(line);
    else if (frames.length) tail.push(line); else head.push(line);
  }
  const ours = f => /[\/]tlaunch[\/]|site-packages|dist-packages|<frozen /.test(f[0]);
  const user = frames.filter(f => !ours(f)), folded = frames.filter(ours);
  const box = el("div", {});
  box.append(el("div", { class: "exception" }, tail.join("\n")));
  box.append(el("pre", { class: "user-frames" }, user.map(f => f.join("\n")).join("\n")));
  if (folded.length) {
    const d = el("details", { class: "tlaunch-frames" }, el("summary", {}, `${folded.length} frames of tlaunch and libraries`));
    d.append(el("pre", {}, [...head, ...folded.map(f => f.join("\n"))].join("\n")));
    box.append(d);
  }
  return box;
}

const JOB_ACTIONS = {  // what each asks, its request, what it says once done
  stop: { ask: j => `Stop job ${j.name} of ${j.owner}?`, method: "POST", path: "/stop?", done: "stopping" },
  restart: { ask: j => `Restart job ${j.name} of ${j.owner}? A new run of the same spec and package starts.`,
             method: "POST", path: "/restart?", done: "restarted" },
  delete: { ask: j => `Delete job ${j.name} of ${j.owner}? A running one is stopped first.`,
            method: "DELETE", path: "?force=true&", done: "deleted" },
};

async function jobAction(job, what) {  // its owner's (or an admin's), once confirmed
  const action = JOB_ACTIONS[what];
  if (!confirm(action.ask(job))) return;
  const path = `/v1/jobs/${encodeURIComponent(job.name)}${action.path}owner=${encodeURIComponent(job.owner)}`;
  const r = await fetch(path, { method: action.method, headers: headers() });
  const body = await r.json().catch(() => ({}));
  document.getElementById("job-result").textContent = r.ok ? `${action.done}: ${job.name}`
    : `${what} refused: ${body.error ? body.error.message : r.statusText}`;
  refreshLists();
}

async function stopRun() {
  const runId = current && current.runId;
  if (!runId || !confirm(`Stop run ${runId} on every host? Its nodes get their grace, then are killed.`)) return;
  const out = document.getElementById("action-result");
  out.textContent = "stopping...";
  const r = await fetch(`/v1/runs/${encodeURIComponent(runId)}/stop`, { method: "POST", headers: headers() });
  const body = await r.json();
  out.textContent = r.ok ? `stopped: ${body.state}` : `not stopped: ${body.error ? body.error.message : r.statusText}`;
}

async function downloadLog(runId, node) {
  const r = await fetch(`/v1/runs/${encodeURIComponent(runId)}/nodes/${node}/log`, { headers: headers() });
  if (!r.ok) return;
  const url = URL.createObjectURL(await r.blob());
  const a = el("a", { href: url, download: `${runId}-${node.replace("/", "_")}.log` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function drawGraph(snapshot) {
  const svg = document.getElementById("graph");
  const graph = snapshot.graph.length ? snapshot.graph
    : snapshot.nodes.map(n => ({ key: n.key, label: n.key.split("/")[0], host: n.host, handles: [] }));
  const states = Object.fromEntries(snapshot.nodes.map(n => [n.key, n]));
  const groups = [...new Set(graph.map(n => n.label))];
  const pos = {};
  const W = 150, H = 34, GAP = 24;
  let height = 60;
  const parts = [];
  groups.forEach((g, gi) => {
    const members = graph.filter(n => n.label === g);
    const x = 10 + gi * (W + 40);
    parts.push(`<rect class="group" x="${x - 6}" y="8" width="${W + 12}" rx="6" height="${members.length * (H + GAP) + 30}"></rect>`);
    parts.push(`<text x="${x}" y="24" font-weight="600">${escapeXml(g)}</text>`);
    members.forEach((n, i) => {
      const y = 34 + i * (H + GAP);
      pos[n.key] = { x, y };
      const st = states[n.key] || {};
      const color = COLORS[st.state] || "#9aa5b5";
      parts.push(`<g class="node" data-key="${escapeXml(n.key)}" data-state="${escapeXml(st.state || "")}">` +
        `<rect x="${x}" y="${y}" width="${W}" height="${H}" rx="4" fill="#fff" stroke="${color}" stroke-width="2"></rect>` +
        `<text x="${x + 6}" y="${y + 14}">${escapeXml(n.key)}${st.restarts ? " ↻" + st.restarts : ""}</text>` +
        `<text x="${x + 6}" y="${y + 28}" fill="${color}">${escapeXml(st.state || "")} · ${escapeXml(st.host || n.host || "")}</text></g>`);
      height = Math.max(height, y + H + 30);
    });
  });
  const edges = [];
  for (const n of graph) for (const target of n.handles || []) {
    const a = pos[n.key], b = pos[target];
    if (!a || !b) continue;
    // From the side of the holder that faces the node it calls, to that node's facing side.
    const right = b.x > a.x;
    const x1 = right ? a.x + W : a.x, x2 = right ? b.x : b.x + W, bend = right ? 30 : -30;
    const y1 = a.y + H / 2, y2 = b.y + H / 2;
    edges.push(`<path class="edge" d="M${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}"></path>`);
  }
  svg.setAttribute("height", String(height));
  svg.innerHTML = `<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto"><path d="M0 0 L10 5 L0 10 z" fill="#8a94a6"></path></marker></defs>` + parts.join("") + edges.join("");
}

function escapeXml(s) {
  return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function showSnapshot(s) {
  document.getElementById("run-title").textContent = `${s.program} — ${s.run_id}`;
  const state = document.getElementById("run-state");
  state.replaceChildren(el("span", { class: "state " + s.state, id: "state" }, s.state), ` on ${s.backend}` + (s.reason ? ` — ${s.reason}` : ""));
  const failure = document.getElementById("failure");
  if (s.failure) {
    const f = s.failure;
    failure.hidden = false;
    failure.replaceChildren(`root cause: node ${f.node} on ${f.host || "?"} ` +
      (f.reason || `exited with code ${f.exit_code}`) + "\n", foldedTraceback(f.traceback));
  } else failure.hidden = true;
  document.querySelector("#nodes tbody").replaceChildren(...s.nodes.map(n => {
    const tr = el("tr", { "data-key": n.key });
    const ran = n.started_at ? duration((n.finished_at || Date.now() / 1000) - n.started_at) : "";
    for (const c of [n.key, n.host, n.state, n.pid, n.exit_code, n.restarts, when(n.started_at), ran])
      tr.append(el("td", c === n.state ? { class: "state " + n.state } : {}, String(c ?? "")));
    const link = el("a", { href: "#", class: "log", "data-node": n.key }, "log");
    link.onclick = e => { e.preventDefault(); downloadLog(s.run_id, n.key); };
    tr.append(el("td", {}, link));
    if (n.paused) {  // waiting in a debugger: where, and the command that attaches
      const p = n.paused;
      const td = el("td", { class: "paused", colspan: "9", title: `tlaunch debug ${s.run_id} ${n.key}` },
        `paused at ${p.at} (${p.kind}${p.rank != null ? ", rank " + p.rank : ""}${p.attached ? ", a debugger attached" : ""}): tlaunch debug ${s.run_id} ${n.key}`);
      return [tr, el("tr", { "data-paused": n.key }, td)];
    }
    return [tr];
  }).flat());
  showTimes(s);
  drawGraph(s);
}

function when(t) { return t ? new Date(t * 1000).toLocaleTimeString() : ""; }

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  return s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${Math.floor(s / 3600)} h ${Math.floor(s % 3600 / 60)} min`;
}

function showTimes(s) {  // submitted, started, ended, how long
  const started = s.nodes.map(n => n.started_at).filter(Boolean);
  const ended = s.nodes.map(n => n.finished_at).filter(Boolean);
  const start = started.length ? Math.min(...started) : null;
  const end = ["SUCCEEDED", "FAILED", "STOPPED", "LOST"].includes(s.state) && ended.length ? Math.max(...ended) : null;
  const parts = [`submitted ${s.created ? new Date(s.created * 1000).toLocaleString() : "?"}`];
  if (start) parts.push(`started ${when(start)} (${duration(start - s.created)} after)`);
  if (end) parts.push(`ended ${when(end)}`);
  if (start) parts.push(`ran ${duration((end || Date.now() / 1000) - start)}`);
  document.getElementById("run-times").textContent = parts.join(" · ");
}

function sparkline(kind, values, top) {  // our own small chart: a polyline over the window
  const W = 180, H = 28;
  const n = values.length;
  const pts = values.map((v, i) => `${n > 1 ? (i * W / (n - 1)).toFixed(1) : 0},${(H - (v / top) * (H - 2) - 1).toFixed(1)}`);
  return `<svg class="${kind}" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img" aria-label="${kind}"><polyline points="${pts.join(" ")}"></polyline></svg>`;
}

function mib(bytes) { return bytes >= (1 << 30) ? (bytes / (1 << 30)).toFixed(1) + " GiB" : (bytes / (1 << 20)).toFixed(0) + " MiB"; }

async function drawCharts(runId) {
  const since = Date.now() / 1000 - 300;
  const m = await api(`/v1/runs/${encodeURIComponent(runId)}/metrics?since=${since}`);
  if (!current || current.runId !== runId) return;
  const rows = Object.entries(m.nodes).map(([key, samples]) => ({ key, samples, last: samples[samples.length - 1] }));
  rows.sort((a, b) => b.last.cpu - a.last.cpu || b.last.rss - a.last.rss);  // hottest first
  const charts = document.getElementById("charts");
  charts.innerHTML = rows.map(r => {
    const cpu = r.samples.map(s => s.cpu), mem = r.samples.map(s => s.rss);
    const over = r.last.host_available != null && r.last.rss > r.last.host_available;
    const gpu = r.last.gpu != null ? ` · GPU ${r.last.gpu.toFixed(0)} %` : "";
    const gmem = r.last.gpu_mem != null ? ` ${mib(r.last.gpu_mem)}` : "";
    return `<div class="chart${over ? " flagged" : ""}" data-key="${escapeXml(r.key)}" data-samples="${r.samples.length}"` +
      (over ? ` title="uses more memory than its host has left (${mib(r.last.host_available)})"` : "") + `>` +
      `<span class="name">${escapeXml(r.key)}</span>` +
      sparkline("cpu", cpu, Math.max(100, ...cpu)) + `<span class="value cpu">${r.last.cpu.toFixed(0)} % CPU</span>` +
      sparkline("mem", mem, Math.max(...mem, 1)) + `<span class="value mem">${mib(r.last.rss)}${over ? " !" : ""}</span>` +
      `<span class="value">${escapeXml(gpu + gmem)}</span></div>`;
  }).join("");
}

function openRun(runId) {
  if (current) { current.aborts.forEach(a => a.abort()); clearInterval(current.timer); }
  const aborts = [new AbortController(), new AbortController()];
  current = { runId, aborts };
  document.getElementById("run").hidden = false;
  const logs = document.getElementById("logs");
  logs.textContent = "";
  follow(`/v1/runs/${encodeURIComponent(runId)}/events`, (name, data) => {
    if (name === "snapshot") showSnapshot(data);
  }, aborts[0]);
  follow(`/v1/runs/${encodeURIComponent(runId)}/logs?follow=true`, (name, data) => {
    if (name !== "message") return;
    logs.append((data.where ? `[${data.where}] ` : "") + data.text + "\n");
    logs.scrollTop = logs.scrollHeight;
  }, aborts[1], () => { logs.textContent = ""; });
  const charts = () => drawCharts(runId).catch(() => {});
  charts();
  current.timer = setInterval(charts, 2000);
  history.replaceState(null, "", "#" + runId);
}

function askToken() {
  document.getElementById("login").hidden = false;
}

document.getElementById("login").onsubmit = e => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("tlaunch-token", token);
  document.getElementById("login").hidden = true;
  refreshLists();
};

document.getElementById("stop-run").onclick = stopRun;
initFilters();
refreshLists();
setInterval(refreshLists, 2000);
if (location.hash.length > 1) openRun(decodeURIComponent(location.hash.slice(1)));
