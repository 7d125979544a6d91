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

async function refreshLists() {
  try {
    const [jobs, runs] = await Promise.all([api("/v1/jobs"), api("/v1/runs")]);
    const jb = document.querySelector("#jobs tbody");
    jb.replaceChildren(...jobs.jobs.map(j => row([j.name, j.owner, j.state], j.state,
      () => j.refs.run_id && openRun(j.refs.run_id))));
    const rb = document.querySelector("#runs tbody");
    rb.replaceChildren(...runs.runs.map(r => {
      const tr = row([r.run_id, r.backend, r.state], r.state, () => openRun(r.run_id));
      tr.dataset.run = r.run_id;
      return tr;
    }));
  } catch (e) { /* shown by askToken, or retried */ }
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
    failure.textContent = `root cause: node ${f.node} on ${f.host || "?"} ` +
      (f.reason || `exited with code ${f.exit_code}`) + "\n" + (f.traceback || "");
  } else failure.hidden = true;
  document.querySelector("#nodes tbody").replaceChildren(...s.nodes.map(n => {
    const tr = el("tr", { "data-key": n.key });
    for (const c of [n.key, n.host, n.state, n.pid, n.exit_code, n.restarts])
      tr.append(el("td", c === n.state ? { class: "state " + n.state } : {}, String(c ?? "")));
    return tr;
  }));
  drawGraph(s);
}

function openRun(runId) {
  if (current) current.aborts.forEach(a => a.abort());
  const aborts = [new AbortController(), new AbortController()];
  current = { runId, aborts };
  document.getElementById("run").hidden = false;
  const logs = document.getElementById("logs");
  logs.textContent = "";
  events(`/v1/runs/${encodeURIComponent(runId)}/events`, (name, data) => {
    if (name === "snapshot") showSnapshot(data);
  }, aborts[0]).catch(() => {});
  events(`/v1/runs/${encodeURIComponent(runId)}/logs?follow=true`, (name, data) => {
    if (name !== "message") return;
    logs.append((data.where ? `[${data.where}] ` : "") + data.text + "\n");
    logs.scrollTop = logs.scrollHeight;
  }, aborts[1]).catch(() => {});
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

refreshLists();
setInterval(refreshLists, 2000);
if (location.hash.length > 1) openRun(decodeURIComponent(location.hash.slice(1)));
