// Ballast's admin UI: plain DOM, no framework, no build step. Every value from the server is
// put on the page as text (textContent, text nodes, attributes), never parsed as HTML. The
// credential lives in this tab's sessionStorage and travels only in the Authorization
// header of calls to this origin's /admin/ API.
"use strict";

const STORE = "ballast.admin.credential";
const PAGES = ["keys", "teams", "spend", "requests", "models", "audit"];
const COLOURS = ["#5dade2", "#2ecc71", "#f5b041", "#e74c3c", "#af7ac5", "#48c9b0",
  "#eb984e", "#f4d03f", "#85929e", "#ec7063"];
const SVG = "http://www.w3.org/2000/svg";

let credential = sessionStorage.getItem(STORE);
let canWrite = false;
let teams = [];
let refresh = null;
let editing = null; // the key or team the open form edits

// -- building the page ------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function $(selector) { return document.querySelector(selector); }

// A form's control by name (not `form.name`: that could be the form's own property).
function field(form, name) { return form.elements.namedItem(name); }

function fill(tbody, rows) { tbody.replaceChildren(...rows); }

function money(value) {
  if (value === null || value === undefined) return "-";
  if (value !== 0 && Math.abs(value) < 0.01) return "$" + value.toPrecision(2);
  return "$" + value.toFixed(2);
}

function count(value) { return value === null || value === undefined ? "-" : String(value); }

function when(seconds) {
  if (!seconds) return "-";
  const date = new Date(seconds * 1000);
  return date.toISOString().replace("T", " ").slice(0, 19);
}

function notice(text, isError) {
  const box = $("#notice");
  box.textContent = text;
  box.className = isError ? "error" : "";
  box.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { box.hidden = true; }, isError ? 8000 : 4000);
}

// -- the API ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error ? body.error : {};
    super(error.message || "HTTP " + status);
    this.status = status;
    this.code = error.code;
  }
}

async function api(method, path, body) {
  const headers = { "authorization": "Bearer " + credential };
  const options = { method, headers, credentials: "omit", cache: "no-store",
    referrerPolicy: "no-referrer" };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch("admin/" + path, options);
  const data = await response.json().catch(() => null);
  if (response.status === 401) {
    signOut("Signed out: the credential was refused.");
    throw new ApiError(401, data);
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

async function attempt(action) {
  try {
    return await action();
  } catch (error) {
    if (error.status !== 401) notice(error.message, true);
    return undefined;
  }
}

// -- signing in -------------------------------------------------------------------------

async function signIn(given) {
  credential = given;
  let who;
  try {
    who = await api("GET", "whoami");
  } catch (error) {
    credential = null;
    const message = $("#signin-error");
    message.textContent = error.status === 401
      ? "That is neither the master key nor the dashboard token." : error.message;
    message.hidden = false;
    return;
  }
  sessionStorage.setItem(STORE, given);
  canWrite = Boolean(who.can_write);
  document.body.classList.toggle("read-only", !canWrite);
  const badge = $("#who");
  badge.textContent = canWrite ? "master key" : "dashboard token (read-only)";
  badge.className = "badge" + (canWrite ? " write" : "");
  badge.hidden = false;
  $("#signin").hidden = true;
  $("#signin-error").hidden = true;
  $("#nav").hidden = false;
  $("#signout").hidden = false;
  show();
}

function signOut(message) {
  credential = null;
  sessionStorage.removeItem(STORE);
  clearInterval(refresh);
  // Nothing read with the credential stays on the page once it is gone.
  for (const body of document.querySelectorAll("main tbody")) body.replaceChildren();
  for (const box of ["#models", "#chart", "#secret-value"]) $(box).replaceChildren();
  for (const form of document.querySelectorAll("form.editor")) form.hidden = true;
  $("#secret").hidden = true;
  $("#notice").hidden = true;
  for (const page of PAGES) $("#page-" + page).hidden = true;
  $("#nav").hidden = true;
  $("#who").hidden = true;
  $("#signout").hidden = true;
  $("#signin").hidden = false;
  $("#credential").value = "";
  if (message) {
    $("#signin-error").textContent = message;
    $("#signin-error").hidden = false;
  }
}

// -- pages ------------------------------------------------------------------------------

function current() {
  const page = location.hash.slice(1);
  return PAGES.includes(page) ? page : "keys";
}

function show() {
  if (!credential) return;
  const page = current();
  for (const name of PAGES) $("#page-" + name).hidden = name !== page;
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("current", link.dataset.page === page);
  }
  clearInterval(refresh);
  const load = LOADERS[page];
  attempt(load);
  if (page === "requests" || page === "models") {
    refresh = setInterval(() => attempt(load), 3000);
  }
}

const LOADERS = { keys: loadKeys, teams: loadTeams, spend: loadSpend,
  requests: loadRequests, models: loadModels, audit: loadAudit };

// Keys

async function loadTeams_() {
  teams = (await api("GET", "teams")).data;
  const select = $("#key-form select[name=team_id]");
  select.replaceChildren(el("option", { value: "" }, "no team"),
    ...teams.map((t) => el("option", { value: t.id }, t.name)));
}

function keyStatus(key) {
  if (key.revoked) return el("span", { class: "pill revoked" }, "revoked");
  if (key.expires_at && key.expires_at * 1000 <= Date.now()) {
    return el("span", { class: "pill expired" }, "expired");
  }
  if (key.previous_until && key.previous_until * 1000 > Date.now()) {
    return el("span", { class: "pill half_open", title: "the old value works until "
      + when(key.previous_until) }, "rotating");
  }
  return el("span", { class: "pill" }, "active");
}

async function loadKeys() {
  await loadTeams_();
  const keys = (await api("GET", "keys")).data;
  const teamName = Object.fromEntries(teams.map((t) => [t.id, t.name]));
  fill($("#keys tbody"), keys.map((key) => el("tr", { "data-key": key.id },
    el("td", { "data-name": "" }, key.name),
    el("td", { class: "dim" }, key.id),
    el("td", {}, key.team_id ? (teamName[key.team_id] || key.team_id) : "-"),
    el("td", {}, key.models ? key.models.join(", ") : "every model"),
    el("td", { class: "num" }, count(key.rpm)),
    el("td", { class: "num" }, count(key.tpm)),
    el("td", { class: "num" }, count(key.max_parallel)),
    el("td", { class: "num" }, key.budget === null ? "-" : money(key.budget) + " / "
      + key.budget_period),
    el("td", { class: "num", "data-spend": key.spend }, money(key.spend)),
    el("td", { "data-status": "" }, keyStatus(key)),
    el("td", { class: "write" }, ...(key.revoked ? [] : [
      el("button", { type: "button", class: "quiet", "data-action": "edit",
        onclick: () => editKey(key) }, "Edit"),
      el("button", { type: "button", class: "quiet", "data-action": "rotate",
        onclick: () => rotateKey(key) }, "Rotate"),
      el("button", { type: "button", class: "danger", "data-action": "revoke",
        onclick: () => revokeKey(key) }, "Revoke"),
    ])),
  )));
}

function setForm(form, values) {
  for (const input of form.querySelectorAll("input[name], select[name]")) {
    const value = values[input.name];
    if (input.name === "models") input.value = value ? value.join(", ") : "";
    else input.value = value === null || value === undefined ? "" : String(value);
  }
  const period = field(form, "budget_period");
  if (period && !values.budget_period) period.value = "month";
}

// The form's fields as the API takes them: an empty field is null (a limit cleared) in an
// update and left out of something new. An update (`original` given) sends only the fields
// changed, so the audit log says what changed.
function formFields(form, original) {
  const update = Boolean(original);
  const out = {};
  for (const input of form.querySelectorAll("input[name], select[name]")) {
    const name = input.name;
    if (name === "id") continue;
    const text = input.value.trim();
    let value;
    if (text === "") value = null;
    else if (name === "models") value = text.split(",").map((m) => m.trim()).filter(Boolean);
    else if (input.type === "number") value = name === "budget" ? Number(text) : parseInt(text, 10);
    else value = text;
    if (value === null && (!update || name === "name" || name === "budget_period")) continue;
    const before = update && original[name] !== undefined ? original[name] : null;
    if (update && JSON.stringify(value) === JSON.stringify(before)) continue;
    out[name] = value;
  }
  return out;
}

function showSecret(value) {
  $("#secret-value").textContent = value;
  $("#secret").hidden = false;
}

function editKey(key) {
  const form = $("#key-form");
  $("#key-form-title").textContent = key ? "Edit " + key.name : "New key";
  editing = key;
  setForm(form, key || {});
  form.hidden = false;
  $("#rotate-form").hidden = true;
  field(form, "name").focus();
}

function rotateKey(key) {
  const form = $("#rotate-form");
  field(form, "id").value = key.id;
  $("#rotate-name").textContent = key.name;
  form.hidden = false;
  $("#key-form").hidden = true;
}

async function revokeKey(key) {
  if (!confirm("Revoke the key " + key.name + "? Clients using it are refused at once.")) return;
  await attempt(async () => {
    await api("POST", "keys/revoke", { id: key.id });
    notice("Revoked " + key.name + ".");
    await loadKeys();
  });
}

async function saveKey(event) {
  event.preventDefault();
  const form = event.target;
  const id = field(form, "id").value;
  await attempt(async () => {
    if (id) {
      await api("POST", "keys/update", { id, ...formFields(form, editing) });
      notice("Saved.");
    } else {
      const made = await api("POST", "keys", formFields(form, null));
      showSecret(made.key);
    }
    form.hidden = true;
    await loadKeys();
  });
}

async function saveRotation(event) {
  event.preventDefault();
  const form = event.target;
  await attempt(async () => {
    const rotated = await api("POST", "keys/rotate",
      { id: field(form, "id").value,
        grace_seconds: Number(field(form, "grace_seconds").value || 0) });
    showSecret(rotated.key);
    form.hidden = true;
    await loadKeys();
  });
}

// Teams

async function loadTeams() {
  await loadTeams_();
  fill($("#teams tbody"), teams.map((team) => el("tr", { "data-team": team.id },
    el("td", {}, team.name),
    el("td", { class: "dim" }, team.id),
    el("td", { class: "num" }, String(team.keys.length)),
    el("td", { class: "num" }, count(team.rpm)),
    el("td", { class: "num" }, count(team.tpm)),
    el("td", { class: "num" }, count(team.max_parallel)),
    el("td", { class: "num" }, team.budget === null ? "-" : money(team.budget) + " / "
      + team.budget_period),
    el("td", { class: "num" }, money(team.spend)),
    el("td", { class: "write" }, el("button", { type: "button", class: "quiet",
      onclick: () => editTeam(team) }, "Edit")),
  )));
}

function editTeam(team) {
  const form = $("#team-form");
  $("#team-form-title").textContent = team ? "Edit " + team.name : "New team";
  editing = team;
  setForm(form, team || {});
  form.hidden = false;
  field(form, "name").focus();
}

async function saveTeam(event) {
  event.preventDefault();
  const form = event.target;
  const id = field(form, "id").value;
  await attempt(async () => {
    if (id) await api("POST", "teams/update", { id, ...formFields(form, editing) });
    else await api("POST", "teams", formFields(form, null));
    notice("Saved.");
    form.hidden = true;
    await loadTeams();
  });
}

// Spend

async function loadSpend() {
  const form = $("#spend-form");
  const until = Math.ceil(Date.now() / 1000);
  const since = until - Number(field(form, "span").value);
  const query = new URLSearchParams({ by: field(form, "by").value,
    bucket: field(form, "bucket").value,
    since: String(since), until: String(until) });
  const report = await api("GET", "spend?" + query);
  const series = report.data;
  fill($("#spend tbody"), series.map((s, i) => {
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = COLOURS[i % COLOURS.length];
    return el("tr", { "data-series": s.id },
      el("td", {}, swatch),
      el("td", {}, s.name),
      el("td", { class: "dim" }, s.id || "-"),
      el("td", { class: "num" }, String(s.requests)),
      el("td", { class: "num", "data-cost": s.cost }, money(s.cost)));
  }));
  drawChart($("#chart"), series, report.bucket_seconds, since, until);
}

// Cost per bucket, one line per series (the ten costliest), drawn as SVG.
function drawChart(box, series, step, since, until) {
  const width = 1000, height = 260, left = 64, right = 12, top = 12, bottom = 28;
  const first = Math.floor(since / step) * step;
  const buckets = Math.max(1, Math.ceil((until - first) / step));
  const shown = series.slice(0, COLOURS.length);
  let highest = 0;
  for (const s of shown) for (const p of s.points) highest = Math.max(highest, p.cost);
  if (highest === 0) highest = 1;
  // Enough decimals that the axis' five labels differ: $0.0220, $0.0165 ...
  const decimals = Math.min(8, Math.max(2, Math.ceil(-Math.log10(highest)) + 2));
  const x = (t) => left + ((t - first) / step + 0.5) * (width - left - right) / buckets;
  const y = (v) => top + (1 - v / highest) * (height - top - bottom);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "cost per bucket" });
  for (let i = 0; i <= 4; i++) {
    const value = highest * i / 4;
    chart.append(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(value),
      y2: y(value) }));
    chart.append(svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end" },
      "$" + value.toFixed(decimals)));
  }
  const labels = Math.min(buckets, 8);
  for (let i = 0; i < labels; i++) {
    const t = first + Math.floor(i * buckets / labels) * step;
    const text = step >= 86400 ? when(t).slice(5, 10) : when(t).slice(5, 16);
    chart.append(svg("text", { x: x(t), y: height - 8, "text-anchor": "middle" }, text));
  }
  shown.forEach((s, i) => {
    const colour = COLOURS[i % COLOURS.length];
    const byTime = new Map(s.points.map((p) => [p.t, p.cost]));
    const points = [];
    for (let b = 0; b < buckets; b++) {
      const t = first + b * step;
      points.push(`${x(t).toFixed(1)},${y(byTime.get(t) || 0).toFixed(1)}`);
    }
    chart.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour,
      "stroke-width": 2 }));
    for (const p of s.points) {
      const dot = svg("circle", { cx: x(p.t), cy: y(p.cost), r: 3, fill: colour });
      dot.append(svg("title", {}, `${s.name} ${when(p.t)}: ${money(p.cost)}, `
        + `${p.requests} requests`));
      chart.append(dot);
    }
  });
  if (series.length === 0) {
    chart.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle" },
      "no spend in this span"));
  }
  box.replaceChildren(chart);
}

// Requests

async function loadRequests() {
  const rows = (await api("GET", "requests?limit=200")).data;
  fill($("#requests tbody"), rows.map((r) => el("tr", { "data-request": r.request_id,
    "data-key-id": r.key_id || "" },
    el("td", { class: "dim" }, when(r.ts)),
    el("td", {}, r.key_name || r.key_id || "-"),
    el("td", { class: "dim" }, r.path),
    el("td", {}, r.model),
    el("td", {}, r.deployment),
    el("td", { class: "num", title: r.error_code || "" }, String(r.status)),
    el("td", { class: "num" }, count(r.input_tokens)),
    el("td", { class: "num" }, count(r.output_tokens)),
    el("td", { class: "num" }, r.cost === null ? "-" : money(r.cost)),
    el("td", { class: "num" }, r.latency_ms.toFixed(1) + " ms"),
  )));
}

// Models

async function loadModels() {
  const groups = (await api("GET", "models")).data;
  $("#models").replaceChildren(...groups.map((group) => el("div", { class: "model",
    "data-model": group.name },
    el("h3", {}, group.name, el("small", {}, group.strategy
      + (group.fallbacks.length ? ", falls back to " + group.fallbacks.join(", ") : ""))),
    el("table", {},
      el("thead", {}, el("tr", {}, ...["Deployment", "Provider", "Model", "$ in / M",
        "$ out / M", "Breaker", "Calls", "Errors", "Latency", "In flight"].map((h, i) =>
        el("th", { class: i >= 3 && i !== 5 ? "num" : "" }, h)))),
      el("tbody", {}, ...group.deployments.map((d) => el("tr", { "data-deployment": d.id },
        el("td", {}, d.id),
        el("td", {}, d.provider),
        el("td", {}, d.model || group.name),
        el("td", { class: "num" }, d.price ? String(d.price.input) : "unpriced"),
        el("td", { class: "num" }, d.price ? String(d.price.output) : "unpriced"),
        el("td", {}, el("span", { class: "pill " + (d.drained ? "drained" : d.breaker),
          "data-breaker": d.breaker }, d.drained ? "drained" : d.breaker)),
        el("td", { class: "num" }, count(d.calls)),
        el("td", { class: "num" }, d.error_rate === undefined ? "-"
          : (100 * d.error_rate).toFixed(1) + "%"),
        el("td", { class: "num" }, d.latency ? (1000 * d.latency).toFixed(0) + " ms" : "-"),
        el("td", { class: "num" }, count(d.in_flight)),
      )))))));
}

// Audit

async function loadAudit() {
  const rows = (await api("GET", "audit?limit=200")).data;
  fill($("#audit tbody"), rows.map((a) => el("tr", { "data-audit": a.action },
    el("td", { class: "dim" }, when(a.created_at)),
    el("td", {}, a.actor),
    el("td", {}, a.action),
    el("td", {}, a.target || "-"),
    el("td", { class: "dim wrap" }, a.detail ? JSON.stringify(a.detail) : ""),
  )));
}

// -- wiring -----------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    signIn($("#credential").value.trim());
  });
  $("#signout").addEventListener("click", () => signOut());
  $("#new-key").addEventListener("click", () => editKey(null));
  $("#new-team").addEventListener("click", () => editTeam(null));
  $("#key-form").addEventListener("submit", saveKey);
  $("#rotate-form").addEventListener("submit", saveRotation);
  $("#team-form").addEventListener("submit", saveTeam);
  $("#spend-form").addEventListener("submit", (event) => {
    event.preventDefault();
    attempt(loadSpend);
  });
  for (const button of document.querySelectorAll("form .cancel")) {
    button.addEventListener("click", () => { button.closest("form").hidden = true; });
  }
  $("#secret-done").addEventListener("click", () => {
    $("#secret-value").textContent = "";
    $("#secret").hidden = true;
  });
  window.addEventListener("hashchange", show);
  if (credential) signIn(credential);
});
