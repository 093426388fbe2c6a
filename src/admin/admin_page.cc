// The admin page itself: HTML, CSS and script in one string, embedded in the binary (no CDN,
// no build step). It polls /api/status, /api/history and /api/logs once a second.
#include "admin/admin_server.h"

namespace pgrelay::admin {

const std::string& admin_page_html() {
  static const std::string page = R"PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pgrelay</title>
<style>
  :root { --fg: #1d2330; --muted: #677085; --line: #dde1ea; --accent: #2f6fde; --bad: #c23b3b; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: #f6f7fa; }
  header { display: flex; gap: 24px; align-items: baseline; padding: 14px 20px; background: #fff;
           border-bottom: 1px solid var(--line); flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  .kv { color: var(--muted); } .kv b { color: var(--fg); font-weight: 600; }
  main { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; padding: 16px 20px; }
  section { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 12px 14px; }
  section.wide { grid-column: 1 / -1; }
  h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 0 0 8px; }
  table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
  th, td { text-align: left; padding: 4px 8px 4px 0; border-bottom: 1px solid var(--line); vertical-align: top; }
  th { color: var(--muted); font-weight: 500; }
  canvas { width: 100%; height: 160px; display: block; }
  .controls { display: flex; gap: 8px; align-items: center; margin-bottom: 8px; flex-wrap: wrap; }
  button { font: inherit; padding: 4px 10px; border: 1px solid var(--line); background: #fff; border-radius: 4px; cursor: pointer; }
  button.on { border-color: var(--accent); color: var(--accent); }
  button.danger { border-color: var(--bad); color: var(--bad); }
  button:disabled { opacity: .45; cursor: default; }
  input { font: inherit; padding: 4px 8px; border: 1px solid var(--line); border-radius: 4px; min-width: 220px; }
  pre { margin: 0; height: 320px; overflow: auto; background: #11151d; color: #d7dce6; padding: 8px 10px;
        border-radius: 4px; font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
  #notice { color: var(--bad); }
  .legend span { margin-right: 12px; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
</style>
</head>
<body>
<header>
  <h1>pgrelay</h1>
  <span class="kv">upstream <b id="upstream">…</b></span>
  <span class="kv">capture <b id="capture-mode">…</b></span>
  <span class="kv">zero-cache <b id="zero-state">…</b></span>
  <span id="notice"></span>
</header>
<main>
  <section>
    <h2>Change logs</h2>
    <table><thead><tr><th>database</th><th>head</th><th>size</th><th>transactions</th></tr></thead>
    <tbody id="logs-table"></tbody></table>
  </section>
  <section>
    <h2>zero-cache</h2>
    <div class="controls">
      <button id="restart-zero">Restart zero-cache</button>
      <button id="reset-zero" class="danger">Reset zero</button>
    </div>
    <div id="zero-detail" class="kv"></div>
  </section>
  <section class="wide">
    <h2>Slots</h2>
    <table><thead><tr><th>slot</th><th>database</th><th>active</th><th>confirmed</th>
      <th>lag (bytes)</th><th>lag (s)</th><th>consumers</th></tr></thead>
    <tbody id="slots"></tbody></table>
  </section>
  <section>
    <h2>Capture rate (transactions/s, 10 min)</h2>
    <canvas id="rate-chart" width="600" height="160"></canvas>
  </section>
  <section>
    <h2>Slot lag (bytes, 10 min)</h2>
    <canvas id="lag-chart" width="600" height="160"></canvas>
    <div id="lag-legend" class="legend"></div>
  </section>
  <section class="wide">
    <h2>Logs</h2>
    <div class="controls">
      <button data-source="pgrelay" class="on">pgrelay</button>
      <button data-source="postgres">PostgreSQL</button>
      <button data-source="zero-cache">zero-cache</button>
      <input id="log-filter" placeholder="filter">
    </div>
    <pre id="log-lines"></pre>
  </section>
</main>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const headers = token ? { "Authorization": "Bearer " + token } : {};
let logSource = "pgrelay";
const colors = ["#2f6fde", "#d9822b", "#2a9d62", "#b8408f", "#6a5acd", "#8c8c1f"];

function text(id, value) { document.getElementById(id).textContent = value; }
function size(bytes) {
  const units = ["B", "kB", "MB", "GB", "TB"]; let i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return (i ? bytes.toFixed(1) : bytes) + " " + units[i];
}
async function api(path, options) {
  const res = await fetch(path, Object.assign({ headers: headers, cache: "no-store" }, options || {}));
  const body = await res.json();
  if (!res.ok) throw new Error(body.error + (body.hint ? " " + body.hint : ""));
  return body;
}
function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.setAttribute(k, v);
  for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.appendChild(td); }
  return tr;
}
function fill(id, rows) { document.getElementById(id).replaceChildren(...rows); }

function chart(id, series, format) {
  const canvas = document.getElementById(id);
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 4, left = 56;
  ctx.clearRect(0, 0, w, h);
  let max = 1, t0 = Infinity, t1 = -Infinity;
  for (const s of series) for (const [t, v] of s.points) { max = Math.max(max, v); t0 = Math.min(t0, t); t1 = Math.max(t1, t); }
  ctx.fillStyle = "#677085"; ctx.font = "11px system-ui";
  ctx.fillText(format(max), 2, 12); ctx.fillText(format(0), 2, h - pad);
  ctx.strokeStyle = "#dde1ea"; ctx.beginPath(); ctx.moveTo(left, h - pad); ctx.lineTo(w, h - pad); ctx.stroke();
  if (!(t1 > t0)) return;
  series.forEach((s, i) => {
    ctx.strokeStyle = s.color || colors[i % colors.length]; ctx.lineWidth = 1.5; ctx.beginPath();
    s.points.forEach(([t, v], j) => {
      const x = left + (w - left) * (t - t0) / (t1 - t0), y = h - pad - (h - 2 * pad) * v / max;
      j ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
  });
}

async function refreshStatus() {
  const s = await api("/api/status");
  text("upstream", s.upstream); text("capture-mode", s.capture_mode);
  text("zero-state", s.zero ? s.zero.state : "not run here");
  fill("logs-table", s.databases.map(d => row([d.database, d.head_lsn, size(d.log_bytes), d.captured_transactions])));
  fill("slots", s.slots.map(sl => row([sl.name, sl.database, sl.active ? "yes" : "no", sl.confirmed_flush_lsn,
    sl.lag_bytes, sl.lag_seconds.toFixed(1),
    sl.consumers.map(c => (c.application_name || "?") + " (" + (c.client_addr || "local") + ", " + c.state + ")").join(", ")],
    { "data-slot": sl.name })));
  const zero = !!s.zero;
  document.getElementById("restart-zero").disabled = !zero;
  document.getElementById("reset-zero").disabled = !zero;
  text("zero-detail", zero ? s.zero.url + " · pid " + (s.zero.pid || "-") + " · started " + s.zero.starts + " time(s)" : "");
}
async function refreshHistory() {
  const h = await api("/api/history");
  chart("rate-chart", [{ points: h.samples.map(p => [p.time, p.capture_rate]) }], v => v.toFixed(v < 10 ? 1 : 0));
  const slots = {};
  for (const p of h.samples) for (const [name, lag] of Object.entries(p.slot_lag_bytes)) (slots[name] = slots[name] || []).push([p.time, lag]);
  const names = Object.keys(slots).sort();
  chart("lag-chart", names.map(n => ({ points: slots[n] })), size);
  document.getElementById("lag-legend").replaceChildren(...names.map((n, i) => {
    const span = document.createElement("span"); const mark = document.createElement("i");
    mark.style.background = colors[i % colors.length]; span.append(mark, n); return span;
  }));
}
async function refreshLogs() {
  const filter = document.getElementById("log-filter").value;
  const l = await api("/api/logs?source=" + encodeURIComponent(logSource) + "&lines=300&filter=" + encodeURIComponent(filter));
  const pre = document.getElementById("log-lines");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = l.lines.join("\n");
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}
async function refresh() {
  try {
    await Promise.all([refreshStatus(), refreshHistory(), refreshLogs()]);
    text("notice", "");
  } catch (e) {
    text("notice", "pgrelay does not answer: " + e.message);
  }
}
async function act(path, question) {
  if (!confirm(question)) return;
  try {
    await api(path, { method: "POST", headers: Object.assign({ "X-Pgrelay-Admin": "1" }, headers) });
    text("notice", "");
  } catch (e) {
    text("notice", e.message);
  }
  refresh();
}
document.getElementById("restart-zero").onclick = () => act("/api/zero/restart", "Restart zero-cache?");
document.getElementById("reset-zero").onclick = () => act("/api/zero/reset",
  "Reset zero? zero-cache stops, its replication slots and replica file are dropped, and it syncs again from scratch.");
for (const b of document.querySelectorAll("button[data-source]")) {
  b.onclick = () => {
    logSource = b.dataset.source;
    for (const o of document.querySelectorAll("button[data-source]")) o.classList.toggle("on", o === b);
    refreshLogs().catch(() => {});
  };
}
document.getElementById("log-filter").oninput = () => refreshLogs().catch(() => {});
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)PAGE";
  return page;
}

}  // namespace pgrelay::admin
