// The console's shell: sign in / out, namespace selection, hash routing, live refresh.

import { ApiError, get, loadCapabilities, request, session } from "./api.js";
import { clear, h } from "./dom.js";
import { createPoller } from "./poller.js";
import { errorPanel } from "./widgets.js";
import * as audit from "./views/audit.js";
import * as retention from "./views/retention.js";
import * as events from "./views/events.js";
import * as queues from "./views/queues.js";
import * as review from "./views/review.js";
import * as schedules from "./views/schedules.js";
import * as subscriptions from "./views/subscriptions.js";
import * as task from "./views/task.js";
import * as tasks from "./views/tasks.js";
import * as workers from "./views/workers.js";
import * as workflows from "./views/workflows.js";

const $ = (id) => document.getElementById(id);

/** What the key may do (GET /v1/whoami), or null when the server has no such route. */
let principal = null;
let current = null; // {view, controller}
let reviewTicks = 0;

// ---------------------------------------------------------------------------- announcements

/** Say something to screen readers (polite) — results of actions, notable changes. */
function announce(message) {
  const el = $("announcer");
  el.textContent = "";
  window.setTimeout(() => { el.textContent = message; }, 30);
}

// ---------------------------------------------------------------------------- routing

const ROUTES = [
  { match: /^queues$/, view: queues, nav: "queues" },
  { match: /^tasks$/, view: tasks, nav: "tasks" },
  { match: /^tasks\/([0-9a-f]{32})$/, view: task, nav: "tasks" },
  { match: /^review$/, view: review, nav: "review" },
  { match: /^schedules(?:\/(.+))?$/, view: schedules, nav: "schedules" },
  { match: /^workflows(?:\/(.+))?$/, view: workflows, nav: "workflows" },
  { match: /^instances\/([0-9a-f]{32})$/, view: workflows, nav: "workflows", instance: true },
  { match: /^subscriptions(?:\/(.+))?$/, view: subscriptions, nav: "subscriptions" },
  { match: /^events$/, view: events, nav: "events" },
  { match: /^workers$/, view: workers, nav: "workers" },
  { match: /^audit$/, view: audit, nav: "audit" },
  { match: /^retention$/, view: retention, nav: "retention" },
];

function parseHash() {
  const hash = window.location.hash.replace(/^#\/?/, "");
  const [path, qs] = hash.split("?", 2);
  return { path: path || "queues", query: new URLSearchParams(qs || "") };
}

/** Go to a console location ("#/tasks?queue=x"). */
function navigate(hash) {
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

function safeDecode(part) {
  if (part === undefined) return undefined;
  try { return decodeURIComponent(part); } catch { return part; }
}

function notFoundView() {
  return {
    mount(ctx) {
      ctx.root.append(h("h1", {}, "Page not found"),
        h("p", {}, "No view has this address. ", h("a", { href: "#/queues" }, "Go to queues"), "."));
      return {};
    },
  };
}

async function route() {
  if (!session.key || !session.namespace) return;
  const { path, query } = parseHash();
  let found = null;
  let params = [];
  for (const r of ROUTES) {
    const m = r.match.exec(path);
    if (m) { found = r; params = m.slice(1).map(safeDecode); break; }
  }
  if (current) current.controller.abort();
  const controller = new AbortController();
  const root = $("view");
  clear(root);
  for (const a of document.querySelectorAll("#nav a")) {
    if (found && a.dataset.view === found.nav) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const ctx = {
    root, params, query, signal: controller.signal, principal, announce, navigate,
    instance: Boolean(found && found.instance),
    setTitle: (t) => { document.title = `${t} · Orbit console`; },
  };
  const module = found ? found.view : notFoundView();
  let view;
  try {
    view = module.mount(ctx) || {};
  } catch (e) {
    root.append(errorPanel(e));
    view = {};
  }
  current = { view, controller };
  poller.now();
}

// ---------------------------------------------------------------------------- live refresh

async function tick() {
  if (!current || !session.key) return;
  const { view, controller } = current;
  const focused = document.activeElement;
  const typing = focused && focused.matches("input, textarea, select") && focused.closest("#view .live-region");
  let ok = true;
  if (view.refresh && !typing && !document.querySelector("#view [data-hold]")) {
    try {
      await view.refresh();
    } catch (e) {
      if (!controller.signal.aborted && !(e instanceof DOMException && e.name === "AbortError")) {
        ok = false;
        showViewError(e);
      }
    }
  }
  reviewTicks += 1;
  if (reviewTicks % 3 === 1) refreshReviewCount();
  const now = new Date().toLocaleTimeString("en-GB");
  $("live-state").textContent = ok ? `Live · updated ${now}` : `Live · refresh failed ${now}`;
}

const poller = createPoller(tick, {
  intervalMs: 5000,
  onPause: (why) => { $("live-state").textContent = why; },
});

function showViewError(e) {
  const root = $("view");
  let box = root.querySelector(":scope > .refresh-error");
  if (!box) {
    box = h("p", { class: "error refresh-error", role: "alert" });
    root.prepend(box);
  }
  box.textContent = `Could not refresh: ${e instanceof ApiError ? e.describe() : e.message}`;
}

async function refreshReviewCount() {
  const badge = $("review-count");
  if (!principal || !(principal.actions || []).includes("tasks.read") || principal.queues) {
    badge.hidden = true;
    return;
  }
  try {
    const { data } = await get(`/v1/namespaces/${encodeURIComponent(session.namespace)}/tasks`,
      { query: { state: "NEEDS_REVIEW", limit: 100 } });
    const n = data.items.length;
    const text = data.next_cursor ? "100+" : String(n);
    const changed = badge.textContent !== text;
    badge.textContent = text;
    badge.hidden = n === 0;
    badge.title = `${text} tasks need review`;
    if (changed && n > 0 && badge.dataset.seen) announce(`${text} tasks need review`);
    badge.dataset.seen = "1";
  } catch {
    badge.hidden = true;
  }
}

// ---------------------------------------------------------------------------- sign in / out

async function whoami(key) {
  try {
    const { data } = await request("GET", "/v1/whoami", { key });
    return data;
  } catch (e) {
    if (e instanceof ApiError && e.unavailable) return null; // older server: no whoami
    throw e;
  }
}

/** Namespaces the key may use: whoami's list; for a "*" key with admin, the application's. */
async function namespacesOf(p, key) {
  if (!p) return null;
  if (!p.namespaces.includes("*")) return p.namespaces;
  if (!p.actions.includes("admin")) return null;
  try {
    const { data } = await request("GET", `/v1/applications/${p.application_id}/namespaces`,
      { key, query: { limit: 500 } });
    return data.items.map((n) => n.name);
  } catch {
    return null;
  }
}

function showLogin(message) {
  $("session-bar").hidden = true;
  $("nav").hidden = true;
  clear($("view"));
  $("login").hidden = false;
  const err = $("login-error");
  err.hidden = !message;
  err.textContent = message || "";
  document.title = "Sign in · Orbit console";
  $("login-key").focus();
}

function showConsole(namespaces) {
  $("login").hidden = true;
  $("session-bar").hidden = false;
  $("nav").hidden = false;
  const who = principal
    ? `key ${principal.credential_id.slice(0, 8)}… · ${principal.actions.length} actions`
    : "";
  $("whoami").textContent = who;
  $("whoami").title = principal ? principal.actions.join(", ") : "";
  renderNamespaceSelector(namespaces);
}

function renderNamespaceSelector(namespaces) {
  const select = $("ns-select");
  const input = $("ns-input");
  const apply = $("ns-apply");
  const ns = session.namespace;
  if (namespaces && namespaces.length) {
    clear(select);
    const names = namespaces.includes(ns) ? namespaces : [ns, ...namespaces];
    for (const n of names) select.append(h("option", { value: n, selected: n === ns }, n));
    select.hidden = false;
    input.hidden = true;
    apply.hidden = true;
  } else {
    select.hidden = true;
    input.hidden = false;
    apply.hidden = false;
    input.value = ns || "";
    const list = clear($("ns-recent"));
    for (const n of session.recent("namespace")) list.append(h("option", { value: n }));
  }
}

function useNamespace(name) {
  if (!/^[A-Za-z0-9_.-]{1,63}$/.test(name)) {
    announce("A namespace name is 1 to 63 letters, digits, '_', '-' or '.'");
    return;
  }
  session.setNamespace(name);
  session.remember("namespace", name);
  announce(`Namespace ${name}`);
  $("review-count").hidden = true;
  reviewTicks = 0;
  route();
}

async function start(key, typedNamespace) {
  principal = await whoami(key);
  const namespaces = await namespacesOf(principal, key);
  let ns = typedNamespace || session.namespace;
  if (!ns && namespaces && namespaces.length) ns = namespaces[0];
  if (!ns) {
    principal = null;
    throw new Error("This key does not list its namespaces: type the namespace name.");
  }
  session.setKey(key);
  session.setNamespace(ns);
  session.remember("namespace", ns);
  showConsole(namespaces);
  if (!window.location.hash || window.location.hash === "#") window.location.hash = "#/queues";
  else route();
}

async function onLogin(event) {
  event.preventDefault();
  const keyInput = $("login-key");
  const key = keyInput.value.trim();
  const ns = $("login-ns").value.trim();
  if (!key) { showLogin("Enter an API key."); return; }
  if (ns && !/^[A-Za-z0-9_.-]{1,63}$/.test(ns)) { showLogin("That is not a valid namespace name."); return; }
  $("login-submit").disabled = true;
  try {
    await start(key, ns);
    keyInput.value = ""; // the key lives in sessionStorage only, not in the page
    announce("Signed in");
    $("main").focus();
  } catch (e) {
    const msg = e instanceof ApiError && e.status === 401
      ? "The server rejected this key (unknown, revoked or expired)."
      : e instanceof ApiError ? `The server answered ${e.status}: ${e.describe()}` : e.message;
    showLogin(msg);
  } finally {
    $("login-submit").disabled = false;
  }
}

function logout(message) {
  if (current) current.controller.abort();
  current = null;
  principal = null;
  session.clear();
  $("review-count").hidden = true;
  if (window.location.hash) history.replaceState(null, "", window.location.pathname);
  showLogin(message);
  announce(message || "Logged out");
}

// ---------------------------------------------------------------------------- boot

function boot() {
  $("login-form").addEventListener("submit", onLogin);
  $("logout").addEventListener("click", () => logout(""));
  $("skip-link").addEventListener("click", (e) => { e.preventDefault(); $("main").focus(); });
  $("ns-form").addEventListener("submit", (e) => { e.preventDefault(); useNamespace($("ns-input").value.trim()); });
  $("ns-select").addEventListener("change", (e) => useNamespace(e.target.value));
  $("live-toggle").addEventListener("click", (e) => {
    const paused = e.currentTarget.getAttribute("aria-pressed") !== "true";
    e.currentTarget.setAttribute("aria-pressed", String(paused));
    e.currentTarget.textContent = paused ? "Resume updates" : "Pause updates";
    poller.setEnabled(!paused);
    announce(paused ? "Live updates paused" : "Live updates resumed");
  });
  window.addEventListener("hashchange", route);
  window.addEventListener("orbit:changed", () => refreshReviewCount());
  window.addEventListener("orbit:unauthenticated", () =>
    logout("The server no longer accepts this key (revoked or expired). Sign in again."));
  loadCapabilities();
  const key = session.key;
  if (!key) { showLogin(""); return; }
  start(key, session.namespace).catch((e) => {
    if (e instanceof ApiError && e.status === 401) logout("The saved key was rejected. Sign in again.");
    else showLogin(e.message);
  });
}

boot();
