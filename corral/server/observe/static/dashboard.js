// corral's status page: reads GET /v2/corral/status every few seconds and draws it.
// Every value from the server is written as text (textContent), never as HTML.
"use strict";

const REFRESH_MS = 2000;
const TOKEN_KEY = "corral-token";
const view = { page: 1, pageSize: 50, sort: "name", order: "asc", filter: "" };
let timer = null;
let openModel = null;
// At least REFRESH_MS, and 20 times what the last status cost the server to build: one open
// page never takes more than a twentieth of a core, however many models the server holds.
let nextRefresh = REFRESH_MS;

const $ = (id) => document.getElementById(id);

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function getJson(path) {
  const headers = {};
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  const answer = await fetch(path, { headers, cache: "no-store" });
  if (answer.status === 401) throw new NeedToken();
  const body = await answer.json();
  if (!answer.ok) throw new Error(body.error || answer.statusText);
  return body;
}

class NeedToken extends Error {}

function showLogin(message) {
  $("dashboard").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

function statusPath() {
  const q = new URLSearchParams({
    page: view.page, page_size: view.pageSize, sort: view.sort, order: view.order,
  });
  if (view.filter) q.set("filter", view.filter);
  return "/v2/corral/status?" + q.toString();
}

async function refresh() {
  clearTimeout(timer);
  try {
    const doc = await getJson(statusPath());
    $("login").hidden = true;
    $("dashboard").hidden = false;
    $("logout").hidden = !token();
    $("fetch-error").hidden = true;
    nextRefresh = Math.max(REFRESH_MS, 20000 * doc.built_s);
    draw(doc);
    if (openModel) await showDetail(openModel);
  } catch (error) {
    if (error instanceof NeedToken) {
      showLogin(token() ? "The token was refused." : "");
      return;  // no refresh until a token is typed
    }
    $("fetch-error").hidden = false;
    $("fetch-error").textContent = "Could not read the status: " + error.message;
  }
  timer = setTimeout(refresh, nextRefresh);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

function num(n, digits) {
  if (n === null || n === undefined) return "–";
  return Number(n).toFixed(digits === undefined ? 1 : digits);
}

// A quantile's hover text: the histogram bucket it falls in, and how it was estimated.
function bucketTitle(bucket) {
  if (!bucket) return "";
  const [lower, upper] = bucket;
  const within = upper === null ? "above " + ms(lower) + " (the highest bucket bound)"
    : "in the bucket from " + ms(lower) + " to " + ms(upper);
  return within + ", estimated linearly within it, as Prometheus' histogram_quantile does";
}

function ms(n) {
  if (n === 0) return "0 ms";
  return (n >= 1 ? num(n, n >= 100 ? 0 : 1) : num(n, 2)) + " ms";
}

// A rate on an axis, short: 0, 2.5, 40, 1.5k, 30k.
function compact(n) {
  if (n >= 1000) return num(n / 1000, n >= 10000 ? 0 : 1) + "k";
  return n === 0 ? "0" : num(n, n >= 10 ? 0 : 1);
}

function duration(s) {
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? h + "h " + m + "m" : m + "m " + Math.floor(s % 60) + "s";
}

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function draw(doc) {
  const s = doc.server;
  $("server-line").textContent =
    s.name + " " + s.version + " · " + s.repository + " · " + s.edge + " edge · up " +
    duration(s.uptime_s);
  const cards = [
    ["requests/s", num(s.requests_per_s)], ["errors/s", num(s.errors_per_s)],
    ["p50 ms", num(s.p50_ms, 2)], ["p99 ms", num(s.p99_ms, 2)],
    ["loaded models", s.loaded_models], ["queue depth", s.queue_depth],
    ["compute busy", s.runs_in_flight + " / " + s.compute_workers],
    ["threads", s.threads], ["RSS", bytes(s.rss_bytes)],
    ["loads", s.loads], ["load failures", s.load_failures], ["evictions", s.evictions],
  ];
  const titles = { "p50 ms": bucketTitle(s.p50_bucket_ms), "p99 ms": bucketTitle(s.p99_bucket_ms) };
  const c = s.cache;  // a repository in object storage: its local cache
  if (c) {
    cards.push(
      ["cache", bytes(c.bytes) + (c.cache_bytes === null ? "" : " / " + bytes(c.cache_bytes))],
      ["store fetches", c.fetches + " (" + c.failures + " failed)"], ["cache hits", c.hits],
    );
  }
  const figures = $("figures");
  figures.replaceChildren(...cards.map(([label, value]) => {
    const card = element("div", undefined, "card");
    card.dataset.figure = label;
    card.append(element("div", label, "label"), element("div", String(value), "value"));
    if (titles[label]) card.title = titles[label];
    return card;
  }));
  drawBudget(s);
  const times = doc.history.time;
  chart($("chart-rate"), times, doc.history.requests_per_s, (v) => compact(v) + " req/s");
  chart($("chart-p99"), times, doc.history.p99_ms, (v) => ms(v));
  chart($("chart-memory"), times, doc.history.memory_used_bytes, bytes);
  drawModels(doc.models);
  drawEvents(doc.events);
}

function drawBudget(s) {
  const bar = $("budget"), fill = $("budget-fill");
  bar.dataset.used = s.memory_used_bytes;
  bar.dataset.budget = s.memory_budget_bytes === null ? "" : s.memory_budget_bytes;
  if (s.memory_budget_bytes) {
    const share = Math.min(1, s.memory_used_bytes / s.memory_budget_bytes);
    fill.style.width = (share * 100).toFixed(1) + "%";
    fill.classList.toggle("full", share > 0.9);
    $("budget-text").textContent = bytes(s.memory_used_bytes) + " of " +
      bytes(s.memory_budget_bytes) + " (" + (share * 100).toFixed(0) + " %)";
  } else {
    fill.style.width = "0";
    $("budget-text").textContent = bytes(s.memory_used_bytes) + " used, no budget";
  }
}

// The smallest of 1, 2, 2.5, 5 times a power of ten at or above n: the y axis's top.
function niceTop(n) {
  if (!(n > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(n)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= n) return step * power;
  return 10 * power;
}

const SVG = "http://www.w3.org/2000/svg";
// The plot's area inside the chart's viewBox (0 0 360 130): labels to its left and below.
const PLOT = { left: 80, right: 354, top: 8, bottom: 104 };

function svgNode(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// A line chart with its scale: three y ticks (0, half, top) labelled with their unit by
// `label`, and the times of its first and last points below.
function chart(svg, times, values, label) {
  svg.replaceChildren();
  if (values.length < 2) return;
  const top = niceTop(Math.max(...values.map((v) => (v === null ? 0 : v))));
  const width = PLOT.right - PLOT.left, height = PLOT.bottom - PLOT.top;
  const x = (i) => PLOT.left + (i * width) / (values.length - 1);
  const y = (v) => PLOT.bottom - (v / top) * height;
  for (const tick of [0, top / 2, top]) {
    svg.append(svgNode("line", { x1: PLOT.left, x2: PLOT.right, y1: y(tick), y2: y(tick),
      class: "grid" }));
    svg.append(svgNode("text", { x: PLOT.left - 4, y: y(tick) + 4, class: "tick tick-y",
      "text-anchor": "end" }, label(tick)));
  }
  const clock = (t) => new Date(t * 1000).toLocaleTimeString();
  svg.append(svgNode("text", { x: PLOT.left, y: 124, class: "tick tick-x" }, clock(times[0])));
  svg.append(svgNode("text", { x: PLOT.right, y: 124, class: "tick tick-x", "text-anchor": "end" },
    clock(times[times.length - 1])));
  const points = values.map((v, i) => x(i).toFixed(1) + "," + y(v === null ? 0 : v).toFixed(1));
  svg.append(svgNode("polyline", { points: points.join(" ") }));
  const last = values[values.length - 1];
  svg.append(svgNode("title", {}, "last " + (last === null ? "–" : label(last)) + ", scale 0 to " +
    label(top)));
}

function drawModels(models) {
  const counts = Object.entries(models.by_state).map(([k, v]) => v + " " + k).join(", ");
  $("model-counts").textContent = "(" + models.total + ": " + counts + ")";
  $("page-info").textContent = "page " + models.page + " of " + models.pages +
    " · " + models.matching + " matching";
  $("prev").disabled = models.page <= 1;
  $("next").disabled = models.page >= models.pages;
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.classList.toggle("sorted-asc", th.dataset.sort === view.sort && view.order === "asc");
    th.classList.toggle("sorted-desc", th.dataset.sort === view.sort && view.order === "desc");
  }
  $("models").tBodies[0].replaceChildren(...models.rows.map((row) => {
    const tr = element("tr");
    tr.dataset.model = row.name;
    const versions = row.versions.map((v) => v.version + ":" + v.state).join(" ");
    tr.append(
      element("td", row.name, "name"), element("td", versions),
      element("td", row.state, "state state-" + row.state),
      element("td", bytes(row.size_bytes), "num"), element("td", num(row.requests_per_s), "num"),
      quantileCell(row.p50_ms, row.p50_bucket_ms, "p50"),
      quantileCell(row.p99_ms, row.p99_bucket_ms, "p99"),
      element("td", num(row.mean_batch), "num"), element("td", String(row.queue), "num"),
      element("td", row.last_error || "", "error"),
    );
    if (row.last_error) tr.lastChild.title = row.last_error;
    tr.addEventListener("click", () => { openModel = row.name; showDetail(row.name); });
    return tr;
  }));
}

function quantileCell(value, bucket, which) {
  const cell = element("td", num(value, 2), "num " + which);
  if (bucket) cell.title = bucketTitle(bucket);
  return cell;
}

function drawEvents(events) {
  $("events").replaceChildren(...events.map((e) => {
    const li = element("li");
    li.dataset.kind = e.kind;
    const when = new Date(e.time * 1000).toLocaleTimeString();
    const size = e.size_bytes ? " (" + bytes(e.size_bytes) + ")" : "";
    li.append(element("span", when + " "), element("span", e.kind, "kind kind-" + e.kind),
      element("span", " " + e.model + (e.version ? ":" + e.version : "") + " " + e.detail + size));
    return li;
  }));
}

async function showDetail(name) {
  try {
    const doc = await getJson("/v2/corral/status/models/" + encodeURIComponent(name));
    $("detail").hidden = false;
    $("detail-name").textContent = name;
    drawConfig(doc);
    $("detail-body").textContent = JSON.stringify(doc, null, 2);
  } catch (error) {
    $("detail").hidden = false;
    $("detail-name").textContent = name;
    $("detail-config").replaceChildren();
    $("detail-body").textContent = "Could not read the model's status: " + error.message;
  }
}

// The settings each loaded version runs with, as a key/value table headed by their source.
const CONFIG_ROWS = [
  ["max_batch_size", "max batch size"], ["batching", "batching"], ["inline", "inline lane"],
  ["batch_window_us", "batch window µs"], ["max_queue_size", "queue limit"],
  ["queue_timeout_us", "queue timeout µs"], ["queue_timeout_override", "timeout override"],
  ["concurrency", "concurrency"], ["instance_count", "instances"], ["device_lanes", "device lanes"],
  ["providers", "providers"], ["provider_options", "provider options"],
  ["pinned", "pinned"], ["warmup", "warm-up"], ["warmup_samples", "warm-up samples"],
  ["version_policy", "version policy"], ["default_model_filename", "model file"],
  ["graph_optimization_level", "graph optimization"], ["execution_mode", "execution mode"],
  ["intra_op_threads", "intra-op threads"], ["preferred_batch_sizes", "preferred batch sizes"],
  ["session_config", "session config"], ["without_effect", "accepted without effect"],
];

function drawConfig(doc) {
  const parts = [];
  if (doc.config_note) parts.push(element("p", doc.config_note, "note"));
  const loaded = doc.versions.filter((v) => v.config);
  for (const version of loaded) {
    const config = version.config;
    const from = config.source === "default" ? "corral's defaults" : "from " + config.source;
    const which = loaded.length > 1 ? " of version " + version.version : "";
    const heading = element("h3", "Configuration" + which + " — " + from);
    const table = element("table", undefined, "config");
    table.dataset.version = version.version;
    const body = element("tbody");
    for (const [key, label] of CONFIG_ROWS) {
      const value = key === "batching" || key === "inline" ? version[key] : config[key];
      const tr = element("tr");
      tr.dataset.key = key;
      tr.append(element("th", label), element("td", setting(key, value)));
      body.append(tr);
    }
    table.append(body);
    parts.push(heading, table);
  }
  $("detail-config").replaceChildren(...parts);
}

function setting(key, value) {
  if (value === null || value === undefined) return "–";
  if (key === "version_policy") {
    if (value.latest) return "latest " + value.latest.num_versions;
    if (value.specific) return "versions " + value.specific.versions.join(", ");
    return "all";
  }
  if (key === "session_config") {
    const entries = Object.entries(value).map(([k, v]) => k + "=" + v);
    return entries.length ? entries.join(", ") : "none";
  }
  if (key === "without_effect") return value.length ? value.join("; ") : "none";
  if (key === "provider_options") {
    const entries = Object.entries(value).map(([provider, options]) => provider + ": " +
      Object.entries(options).map(([k, v]) => k + "=" + v).join(", "));
    return entries.length ? entries.join("; ") : "none";
  }
  if (Array.isArray(value)) return value.length ? value.join(", ") : "none";
  if (typeof value === "boolean") return value ? "yes" : "no";
  return String(value);
}

function start() {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    refresh();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(timer);
    showLogin("");
  });
  let typing = null;
  $("filter").addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { view.filter = $("filter").value; view.page = 1; refresh(); }, 250);
  });
  $("prev").addEventListener("click", () => { view.page -= 1; refresh(); });
  $("next").addEventListener("click", () => { view.page += 1; refresh(); });
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      const column = th.dataset.sort;
      view.order = view.sort === column && view.order === "asc" ? "desc" : "asc";
      view.sort = column;
      view.page = 1;
      refresh();
    });
  }
  $("detail-close").addEventListener("click", () => { openModel = null; $("detail").hidden = true; });
  refresh();
}

document.addEventListener("DOMContentLoaded", start);
