// Polls the dashboard's JSON endpoints every two seconds and redraws.
"use strict";

const POLL_MS = 2000;
const HOUR_MS = 3600 * 1000;
const MAX_NODE_SERIES = 8;

const state = { samples: [], lastId: null, status: null, polls: 0 };
const charts = {
  queue: new LineChart(document.getElementById("chart-queue"), { integer: true }),
  pages: new LineChart(document.getElementById("chart-pages")),
  errors: new LineChart(document.getElementById("chart-errors"), { integer: true }),
  items: new LineChart(document.getElementById("chart-items"), { integer: true }),
};
window.dashboard = { state, charts };

function $(id) { return document.getElementById(id); }

function text(id, value) { $(id).textContent = value; }

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}

function duration(s) {
  if (s === null || s === undefined) return "unknown";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || url + ": HTTP " + response.status);
  return body;
}

function row(cells, classes) {
  const tr = document.createElement("tr");
  cells.forEach((cell, i) => {
    const td = document.createElement("td");
    if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
    if (classes && classes[i]) td.className = classes[i];
    tr.appendChild(td);
  });
  return tr;
}

function renderStatus(s) {
  const p = s.progress, f = s.fleet, mongo = s.mongo || {};
  text("spider", s.spider);
  $("progress-fill").style.width = (100 * p.fraction).toFixed(1) + "%";
  text("progress-text", `${p.done} / ${p.total} pages (${(100 * p.fraction).toFixed(0)}%) · ETA ` +
       duration(p.eta_seconds) +
       (p.drain_per_s === null ? "" : p.drain_per_s > 0
         ? ` · draining ${p.drain_per_s.toFixed(1)}/s`
         : ` · growing ${(-p.drain_per_s).toFixed(1)}/s`));
  text("c-queued", s.queued);
  text("c-bands", Object.entries(s.queued_by_priority).map(([k, v]) => `p${k}: ${v}`).join(", "));
  text("c-delayed", s.delayed_retries);
  text("c-inflight", s.in_flight);
  text("c-seen", s.seen);
  text("c-seen-bytes", bytes(s.seen_bytes));
  text("c-rate", (f.pages_per_min / 60).toFixed(1));
  text("c-items", mongo.error ? "n/a" : mongo.products ?? "n/a");
  text("c-journal", "journal backlog " + (s.journal_backlog === null ? "n/a" : s.journal_backlog));
  text("c-dead", s.dead_letters);
  text("c-rejects", mongo.error ? mongo.error : `${mongo.rejects ?? "n/a"} rejects, ` +
       `${f.seeds_rejected} bad seeds`);
  text("c-nodes", f.nodes_alive);
  text("c-nodes-more", `${f.nodes_dead} dead, ${f.nodes_finished} finished`);

  const nodes = $("nodes").tBodies[0];
  nodes.replaceChildren(...s.nodes.map((n) => row([
    n.id,
    n.state === "finished" && n.finish_reason ? `finished (${n.finish_reason})` : n.state,
    n.pages_per_min.toFixed(0), n.items_per_min.toFixed(0), n.pages, n.in_flight,
    bytes(n.rss_bytes + n.children_rss_bytes), n.errors + n.download_errors, n.retries,
    duration(n.age_seconds) + " ago",
  ], ["", "state " + n.state])));

  const failures = $("failures").tBodies[0];
  const rows = s.failures.map((g) => {
    const link = document.createElement("a");
    link.href = "api/dead-letters?error=" + encodeURIComponent(g.error);
    link.textContent = g.count;
    return row([link, `dead (${g.kind}): ${g.error}`, g.last_url, g.node || ""]);
  });
  for (const [reason, count] of Object.entries(f.retry_reasons).sort((a, b) => b[1] - a[1])) {
    rows.push(row([count, "retried: " + reason, "", ""]));
  }
  if (!rows.length) rows.push(row(["0", "no failures", "", ""]));
  failures.replaceChildren(...rows);

  const b = s.blocking || {sites: [], proxies: []};
  const blocking = b.sites.slice(0, 10).map((r) => row([
    r.site, r.responses, r.blocks, (100 * r.block_rate).toFixed(0) + "%", r.sessions,
    r.tier === null ? "-" : r.tier, r.cooling.join(", "),
  ]));
  for (const r of b.proxies.slice(0, 20)) {
    blocking.push(row([
      "proxy " + r.proxy, r.requests, r.blocked,
      r.health === null ? "-" : (100 * r.health).toFixed(0) + "% ok", "", "",
      Object.entries(r.cooling).map(([site, secs]) => `${site} ${secs}s`).join(", "),
    ]));
  }
  if (!blocking.length) blocking.push(row(["no blocks", "", "", "", "", "", ""]));
  $("blocking").tBodies[0].replaceChildren(...blocking);

  const r = s.rendering || {count: 0, modes: {}, patterns: []};
  const rendering = r.patterns.slice(0, 20).map((p) => row([
    p.site, p.template, p.callback, p.mode, p.agreed, p.missed,
  ]));
  if (!rendering.length) rendering.push(row(["no patterns learnt", "", "", "", "", ""]));
  $("rendering").tBodies[0].replaceChildren(...rendering);
  const m = r.modes;
  $("render-modes").textContent = r.count
    ? `${r.count} patterns: ${m.http || 0} plain HTTP, ${m.browser || 0} browser, ${m.learn || 0} learning`
    : "";
}

function renderCharts() {
  const samples = state.samples;
  const times = samples.map((s) => s.t);
  const pick = (key) => samples.map((s) => s[key] ?? null);
  charts.queue.setData(times, [
    { name: "queued", values: pick("queued") },
    { name: "delayed", values: pick("delayed") },
    { name: "in flight", values: pick("in_flight") },
  ]);
  const last = samples.length ? samples[samples.length - 1].nodes : {};
  const seen = new Set();
  samples.forEach((s) => Object.keys(s.nodes).forEach((id) => seen.add(id)));
  const ids = [...seen].sort((a, b) => (last[b] ?? -1) - (last[a] ?? -1)).slice(0, MAX_NODE_SERIES);
  charts.pages.setData(times, [
    { name: "fleet", values: pick("pages_per_s") },
    ...ids.map((id) => ({ name: id, values: samples.map((s) => s.nodes[id] ?? null) })),
  ]);
  charts.errors.setData(times, [
    { name: "errors", values: pick("errors") },
    { name: "retries", values: pick("retries") },
    { name: "dead letters", values: pick("dead") },
  ]);
  charts.items.setData(times, [{ name: "items", values: pick("items") }]);
}

async function poll() {
  try {
    const since = state.lastId ? "?since=" + encodeURIComponent(state.lastId) : "";
    const [fresh, status] = await Promise.all([getJSON("api/history" + since),
                                               getJSON("api/status")]);
    if (fresh.length) {
      state.samples.push(...fresh);
      state.lastId = fresh[fresh.length - 1].id;
      const cutoff = state.samples[state.samples.length - 1].t - HOUR_MS;
      while (state.samples.length && state.samples[0].t < cutoff) state.samples.shift();
    }
    state.status = status;
    renderStatus(status);
    renderCharts();
    state.polls++;
    text("updated", "updated " + new Date().toLocaleTimeString());
  } catch (err) {
    text("updated", "update failed: " + err.message);
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.draw()));
poll();
