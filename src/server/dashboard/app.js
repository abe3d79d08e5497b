// gpupool dashboard: reads GET /admin/events (server-sent events, read
// with fetch() so that the admin key can go as a Bearer header), redraws on
// every snapshot, fetches the recent jobs and keys when they may have
// changed, and wires drain/undrain and key create/revoke to the admin API.
// Every value from the server goes into the page as text (textContent),
// never as markup: agent names and labels come from agents.
"use strict";

const KEY_STORE = "gpupool.adminKey";
let key = sessionStorage.getItem(KEY_STORE) || "";
let lastRequests = -1;
let streamAbort = null;

const $ = (id) => document.getElementById(id);

function authHeaders(extra) {
  const h = Object.assign({}, extra || {});
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k === "onclick") e.addEventListener("click", v);
    else e[k] = v;
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function ago(ms) {
  if (!ms) return "never";
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return Math.round(s / 3600) + " h ago";
}

function fmt(n, digits) {
  if (n == null || Number.isNaN(n)) return "-";
  return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits || 0 });
}

function setConn(state, text) {
  const c = $("conn");
  c.dataset.state = state;
  c.textContent = text || state;
}

// ------------------------------------------------------------ login

function showLogin(message) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("login-error").textContent = message || "";
  setConn("connecting", "signed out");
}

function showMain() {
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = !key;
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  key = $("login-key").value.trim();
  $("login-key").value = "";
  sessionStorage.setItem(KEY_STORE, key);
  start();
});

$("logout").addEventListener("click", () => {
  key = "";
  sessionStorage.removeItem(KEY_STORE);
  if (streamAbort) streamAbort.abort();
  showLogin("");
});

// ------------------------------------------------------------ API calls

async function api(method, path, body) {
  const opts = { method, headers: authHeaders(body ? { "Content-Type": "application/json" } : {}) };
  if (body) opts.body = JSON.stringify(body);
  const res = await fetch(path, opts);
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (res.status === 401 || res.status === 403) {
    showLogin((data && data.error && data.error.message) || "the key was refused");
    throw new Error("unauthorized");
  }
  if (!res.ok) throw new Error((data && data.error && data.error.message) || ("HTTP " + res.status));
  return data;
}

// ------------------------------------------------------------ rendering

function sparkline(svgId, lastId, points, field) {
  const svg = $(svgId);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const vals = points.map((p) => p[field]);
  const max = Math.max(1, ...vals);
  const n = vals.length;
  const coords = vals.map((v, i) => {
    const x = n > 1 ? (i * 600) / (n - 1) : 0;
    const y = 58 - (v / max) * 56;
    return x.toFixed(1) + "," + y.toFixed(1);
  });
  const pl = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  pl.setAttribute("points", coords.join(" "));
  svg.appendChild(pl);
  $(lastId).textContent = fmt(vals[n - 1] || 0) + " this minute";
}

function renderStatus(snap) {
  const st = snap.status;
  $("version").textContent = "v" + st.version + " · up " + Math.round(st.uptime_sec / 60) + " min";
  $("t-agents").textContent = fmt(st.agents.healthy) + " / " + fmt(st.agents.total);
  $("t-slots").textContent = fmt(st.slots.busy) + " / " + fmt(st.slots.total);
  $("t-queued").textContent = fmt(st.queued_total);
  $("t-running").textContent = fmt(st.jobs_active);
  $("t-rpm").textContent = fmt(st.throughput.requests_per_min, 1);
  $("t-tps").textContent = fmt(st.throughput.tokens_per_sec, 1);
  sparkline("spark-req", "spark-req-last", snap.history, "requests");
  sparkline("spark-err", "spark-err-last", snap.history, "errors");
}

async function drain(agent, on) {
  try {
    await api("POST", "/admin/agents/" + encodeURIComponent(agent.id) + "/drain", { on });
  } catch (e) {
    if (e.message !== "unauthorized") alert("drain failed: " + e.message);
  }
}

function gib(bytes) {
  return bytes == null ? "-" : fmt(bytes / (1 << 30), 1) + " GiB";
}

// One row per GPU under its agent: a VRAM bar (the model's share and what
// everything else uses), utilisation, temperature, power, and "fault"
// while the agent keeps the GPU out of service.
function gpuRow(a, g) {
  const total = g.vram_total || 0;
  const used = g.vram_used != null ? g.vram_used : (total && g.vram_free != null ? total - g.vram_free : null);
  const pct = (v) => (total && v != null ? Math.max(0, Math.min(100, (100 * v) / total)) : 0);
  const bar = el("div", { class: "vram", title: "VRAM: model " + gib(g.vram_model) + ", used " + gib(used) + " of " + gib(g.vram_total) },
    el("div", { class: "vram-used" }), el("div", { class: "vram-model" }));
  bar.children[0].style.width = pct(used).toFixed(1) + "%";
  bar.children[1].style.width = pct(g.vram_model).toFixed(1) + "%";
  const bits = [];
  bits.push("VRAM " + gib(used) + " / " + gib(g.vram_total) + (g.vram_model != null ? " (model " + gib(g.vram_model) + ")" : ""));
  if (g.utilization != null) bits.push("util " + fmt(100 * g.utilization) + "%");
  if (g.temperature != null) bits.push(fmt(g.temperature) + " °C");
  if (g.power_w != null) bits.push(fmt(g.power_w) + " W");
  return el("tr", { class: "gpu-row", "data-gpu-agent": a.id, "data-gpu": String(g.index), "data-gpu-state": g.state || "" },
    el("td", { class: "gpu-name", text: "GPU " + g.index + " · " + (g.name || "?") }),
    el("td", {}, el("span", { class: "state state-gpu-" + (g.state || "unused"), text: g.state || "" })),
    el("td", { colSpan: 2 }, bar),
    el("td", { colSpan: 4, class: "gpu-figures", text: bits.join(" · ") }));
}

function renderAgents(agents) {
  const tb = $("agents").querySelector("tbody");
  tb.replaceChildren();
  $("agents-empty").hidden = agents.length > 0;
  for (const a of agents) {
    const drained = a.admin_drain;
    const models = (a.models || []).map((m) => m.id + ((m.aliases || []).length ? " (" + m.aliases.join(", ") + ")" : ""));
    const btn = el("button", {
      type: "button", text: drained ? "undrain" : "drain",
      "data-drain": a.id, "data-on": drained ? "false" : "true",
      onclick: () => drain(a, !drained),
    });
    tb.append(el("tr", { class: "agent-row", "data-agent-id": a.id, "data-state": a.state },
      el("td", {}, el("strong", { text: a.name || "(unnamed)" }),
        a.backend ? el("span", { class: "backend", "data-backend": a.backend, text: a.backend }) : null,
        el("br"), el("span", { class: "mono", text: a.id })),
      el("td", {}, el("span", { class: "state state-" + a.state, text: a.state })),
      el("td", { text: models.join(", ") }),
      el("td", { text: fmt(a.slots_busy) + " / " + fmt(a.slots_total) }),
      el("td", { text: fmt(a.tokens_per_sec, 1) }),
      el("td", { text: fmt(a.jobs_done) + " / " + fmt(a.jobs_failed) }),
      el("td", { text: ago(a.last_seen) }),
      el("td", {}, btn)));
    if (a.error) {
      tb.append(el("tr", { class: "agent-error", "data-error-agent": a.id },
        el("td", { colSpan: 8, text: "error " + a.error.code + ": " + a.error.message })));
    }
    for (const g of a.gpus || []) tb.append(gpuRow(a, g));
  }
}

function renderModels(snap) {
  const rows = new Map();
  for (const a of snap.agents) {
    const live = a.state === "healthy" || a.state === "suspect" || a.state === "registering";
    for (const m of a.models || []) {
      const r = rows.get(m.id) || { agents: 0, busy: 0, total: 0 };
      if (live) { r.agents++; r.busy += a.slots_busy || 0; r.total += a.slots_total || 0; }
      rows.set(m.id, r);
    }
  }
  for (const name of Object.keys(snap.status.queue || {}))
    if (!rows.has(name)) rows.set(name, { agents: 0, busy: 0, total: 0 });
  const tb = $("models").querySelector("tbody");
  tb.replaceChildren();
  for (const [name, r] of [...rows.entries()].sort()) {
    tb.append(el("tr", { "data-model": name },
      el("td", { text: name }), el("td", { text: fmt(r.agents) }),
      el("td", { text: fmt(r.busy) + " / " + fmt(r.total) }),
      el("td", { text: fmt((snap.status.queue || {})[name] || 0) })));
  }
}

// The servers sharing the database (docs/scaling.md section 3): each with
// its lease state (alive, lease_expired, stopped); this one is marked.
function renderServers(info) {
  const tb = $("servers").querySelector("tbody");
  tb.replaceChildren();
  for (const v of (info && info.servers) || []) {
    const ago = v.heartbeat_at ? fmt((Date.now() - v.heartbeat_at) / 1000, 1) + " s ago" : "";
    tb.append(el("tr", { "data-server-id": v.id, "data-state": v.state },
      el("td", { text: v.name + (v.self ? " (this one)" : "") }), el("td", { text: v.state }),
      el("td", { text: v.version || "" }), el("td", { text: String(v.pid) }),
      el("td", { text: ago }), el("td", { text: v.url || "" })));
  }
}

// Deployed models (docs/admin.md "Deployments"): one row per replica with
// its state and download progress; a short deployment gets a row saying
// how many replicas fit nowhere and, on hover, why each agent was refused.
function progressText(r) {
  const mib = (b) => fmt(b / (1 << 20), 1) + " MiB";
  if (r.state !== "downloading") return r.total ? mib(r.total) : "";
  let t = r.total ? fmt((100 * r.bytes) / r.total) + "% of " + mib(r.total) : mib(r.bytes || 0);
  if (r.rate) t += ", " + mib(r.rate) + "/s";
  if (r.eta_sec != null) t += ", ETA " + fmt(r.eta_sec) + " s";
  return t;
}

function renderDeployments(deps) {
  const tb = $("deployments").querySelector("tbody");
  tb.replaceChildren();
  $("deployments-empty").hidden = deps.length > 0;
  for (const d of deps) {
    const want = fmt(d.ready) + " / " + fmt(d.replicas);
    const rows = (d.placed || []).map((r) => el("tr", { "data-deployment": d.name, "data-agent-id": r.agent_id, "data-state": r.state },
      el("td", { text: d.name }), el("td", { text: want }), el("td", { text: r.agent || r.agent_id }),
      el("td", {}, el("span", { class: "state state-" + r.state, text: r.state })),
      el("td", { text: progressText(r) }), el("td", { text: r.reason || "" })));
    if (d.unplaced > 0) {
      const why = (d.refusals || []).map((x) => (x.agent || x.agent_id) + ": " + x.reason).join("\n");
      rows.push(el("tr", { "data-deployment": d.name, "data-state": "unplaced", title: why },
        el("td", { text: d.name }), el("td", { text: want }), el("td", { text: "-" }),
        el("td", {}, el("span", { class: "state state-unplaced", text: fmt(d.unplaced) + " unplaced" })),
        el("td", { text: "" }), el("td", { text: why ? "fits no agent (hover for why)" : "no agent offers itself" })));
    }
    tb.append(...rows);
  }
}

async function refreshJobs() {
  let data;
  try { data = await api("GET", "/admin/jobs?limit=20"); } catch (e) { return; }
  const tb = $("jobs").querySelector("tbody");
  tb.replaceChildren();
  for (const j of data.jobs || []) {
    const att = el("td", { text: String(j.attempts) });
    if (j.attempts > 1) att.append(el("span", { class: "failover", text: " (" + (j.attempts - 1) + " failover" + (j.attempts > 2 ? "s" : "") + ")" }));
    tb.append(el("tr", { "data-job-id": j.id, "data-status": j.status },
      el("td", { class: "mono", text: j.id }), el("td", { text: j.api || "" }),
      el("td", { text: j.model || "" }), el("td", { class: "mono", text: (j.agent_id || "").slice(0, 8) }),
      el("td", {}, el("span", { class: "state state-" + j.status, text: j.status })),
      att,
      el("td", { text: fmt(j.prompt_tokens) + " / " + fmt(j.completion_tokens) }),
      el("td", { text: fmt(j.ttft_ms) + " / " + fmt(j.total_ms) }),
      el("td", { text: j.created_at ? new Date(j.created_at).toLocaleTimeString() : "" })));
  }
}

async function refreshKeys() {
  let data;
  try { data = await api("GET", "/admin/keys"); } catch (e) { return; }
  const tb = $("keys").querySelector("tbody");
  tb.replaceChildren();
  for (const k of data.keys || []) {
    if (k.revoked_at) continue;
    const u = k.usage_today || {};
    tb.append(el("tr", { "data-key-id": k.id },
      el("td", { text: k.name }), el("td", { class: "mono", text: k.id }),
      // A spent or expired token refuses every enrollment: say so next to its role.
      el("td", { text: k.role + (k.state && k.state !== "active" ? " (" + k.state.replace("_", " ") + ")" : "") }),
      el("td", { text: fmt(u.requests) }),
      el("td", { text: fmt((u.prompt_tokens || 0) + (u.completion_tokens || 0)) }),
      el("td", { text: ago(k.last_used_at) }),
      el("td", {}, el("button", {
        type: "button", text: "revoke", "data-revoke": k.id,
        onclick: async () => {
          if (!confirm("Revoke key " + k.name + " (" + k.id + ")?")) return;
          try { await api("DELETE", "/admin/keys/" + encodeURIComponent(k.id)); } catch (e) { $("key-error").textContent = e.message; }
          refreshKeys();
        },
      }))));
  }
}

$("key-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("key-error").textContent = "";
  try {
    const k = await api("POST", "/admin/keys", { role: $("key-role").value, name: $("key-name").value || undefined });
    $("key-created-value").textContent = k.key;
    $("key-created").hidden = false;
    $("key-name").value = "";
    refreshKeys();
  } catch (e) {
    if (e.message !== "unauthorized") $("key-error").textContent = e.message;
  }
});

function onSnapshot(snap) {
  showMain();
  renderStatus(snap);
  renderAgents(snap.agents);
  renderModels(snap);
  renderDeployments(snap.deployments || []);
  renderServers(snap.status.servers);
  if (snap.requests_total !== lastRequests) {
    lastRequests = snap.requests_total;
    refreshJobs();
  }
}

// ------------------------------------------------------------ event stream

function handleBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (event === "snapshot" && data.length) onSnapshot(JSON.parse(data.join("\n")));
}

async function stream() {
  let backoff = 500;
  for (;;) {
    const ctl = new AbortController();
    streamAbort = ctl;
    try {
      const res = await fetch("/admin/events", { headers: authHeaders(), cache: "no-store", signal: ctl.signal });
      if (res.status === 401 || res.status === 403) {
        let msg = "this page needs an admin key";
        try { const b = await res.json(); if (key && b.error) msg = b.error.message; } catch (e) { /* keep */ }
        showLogin(msg);
        return;
      }
      if (!res.ok) throw new Error("HTTP " + res.status);
      setConn("live");
      backoff = 500;
      const reader = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r\n/g, "\n");
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          handleBlock(buf.slice(0, i));
          buf = buf.slice(i + 2);
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
    }
    setConn("reconnecting");
    await new Promise((r) => setTimeout(r, backoff));
    backoff = Math.min(backoff * 2, 10000);
  }
}

function start() {
  setConn("connecting");
  refreshKeys();
  stream();
}

// A key in the URL fragment (never sent to the server, so never in its
// logs) is taken once and removed from the address bar.
if (location.hash.startsWith("#key=")) {
  key = decodeURIComponent(location.hash.slice(5));
  sessionStorage.setItem(KEY_STORE, key);
  history.replaceState(null, "", location.pathname);
}
start();
