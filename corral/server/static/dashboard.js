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
    s.name + " " + s.version + " · " + s.repository + " · up " + duration(s.uptime_s);
  const cards = [
    ["requests/s", num(s.requests_per_s)], ["errors/s", num(s.errors_per_s)],
    ["p50 ms", num(s.p50_ms, 2)], ["p99 ms", num(s.p99_ms, 2)],
    ["loaded models", s.loaded_models], ["queue depth", s.queue_depth],
    ["compute busy", s.runs_in_flight + " / " + s.compute_workers],
    ["threads", s.threads], ["RSS", bytes(s.rss_bytes)],
    ["loads", s.loads], ["load failures", s.load_failures], ["evictions", s.evictions],
  ];
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
    card.append(element("div", label, "label"), element("div", String(value), "value"));
    return card;
  }));
  drawBudget(s);
  sparkline($("chart-rate"), doc.history.requests_per_s);
  sparkline($("chart-p99"), doc.history.p99_ms);
  sparkline($("chart-memory"), doc.history.memory_used_bytes);
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

function sparkline(svg, values) {
  const points = values.map((v, i) => [i, v === null ? 0 : v]);
  svg.replaceChildren();
  if (points.length < 2) return;
  const top = Math.max(...points.map((p) => p[1])) || 1;
  const step = 300 / (points.length - 1);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.map(([i, v]) =>
    (i * step).toFixed(1) + "," + (58 - (v / top) * 56).toFixed(1)).join(" "));
  const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
  title.textContent = "last " + num(values[values.length - 1]) + ", top " + num(top);
  svg.append(title, line);
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
      element("td", num(row.p50_ms, 2), "num"), element("td", num(row.p99_ms, 2), "num"),
      element("td", num(row.mean_batch), "num"), element("td", String(row.queue), "num"),
      element("td", row.last_error || "", "error"),
    );
    if (row.last_error) tr.lastChild.title = row.last_error;
    tr.addEventListener("click", () => { openModel = row.name; showDetail(row.name); });
    return tr;
  }));
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
  ["concurrency", "concurrency"], ["instance_count", "instances"],
  ["providers", "providers"], ["provider_options", "provider options"],
  ["pinned", "pinned"], ["warmup", "warm-up"], ["warmup_samples", "warm-up samples"],
  ["version_policy", "version policy"], ["default_model_filename", "model file"],
  ["graph_optimization_level", "graph optimization"], ["execution_mode", "execution mode"],
  ["intra_op_threads", "intra-op threads"],
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
