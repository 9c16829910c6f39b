// The console's only door to the server: the JSON API under /v1, same origin, with the
// API key of this tab's session sent as "Authorization: Bearer". The key lives only in
// sessionStorage (gone when the tab closes; never localStorage, cookies or URLs).

import { ExactJson } from "./json.js";

const PREFIX = "orbit.console.";
const KEY = PREFIX + "key";
const NAMESPACE = PREFIX + "namespace";
const TIMEOUT_MS = 15000;

/** The tab's session: key, namespace and small remembered lists (names typed by the user). */
export const session = {
  get key() { return sessionStorage.getItem(KEY); },
  setKey(key) { sessionStorage.setItem(KEY, key); },
  get namespace() { return sessionStorage.getItem(NAMESPACE); },
  setNamespace(ns) { sessionStorage.setItem(NAMESPACE, ns); },
  /** Names the user typed for a kind of resource (most recent first, at most 10). */
  recent(kind) {
    try { return JSON.parse(sessionStorage.getItem(PREFIX + "recent." + kind) || "[]"); }
    catch { return []; }
  },
  remember(kind, name) {
    const list = [name, ...this.recent(kind).filter((n) => n !== name)].slice(0, 10);
    sessionStorage.setItem(PREFIX + "recent." + kind, JSON.stringify(list));
  },
  /** Log out: forget everything this console stored in the tab. */
  clear() {
    for (const k of Object.keys(sessionStorage)) if (k.startsWith(PREFIX)) sessionStorage.removeItem(k);
  },
};

/** An API error: HTTP status plus the API's {"error": {code, message, details}}. */
export class ApiError extends Error {
  constructor(status, code, message, details = {}, requestId = null) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code || "http_error";
    this.details = details || {};
    this.requestId = requestId;
  }

  /** The route does not exist on this server (an older or partial build): 404 on a route
   * the server does not know, 405, or 501. A 404 for an absent resource is not this. */
  get unavailable() {
    return this.status === 405 || this.status === 501 ||
      (this.status === 404 && this.message === "route not found");
  }

  /** Human text: the message plus the offending field when the API names one. */
  describe() {
    const field = this.details && this.details.field ? ` (field: ${this.details.field})` : "";
    return `${this.message}${field}`;
  }
}

/** Encode one path segment (names may hold '.', '-', '_'; ids are hex). */
export const seg = (s) => encodeURIComponent(String(s));

/** `/v1/namespaces/{ns}/...` for the session's namespace. */
export function nsPath(...parts) {
  return `/v1/namespaces/${seg(session.namespace)}/` + parts.map(seg).join("/");
}

/**
 * Call the API (`headers`: extra request headers, e.g. If-Match). Returns {status, json:
 * ExactJson, data, headers}. Throws ApiError for any
 * non-2xx answer; a 401 also fires "orbit:unauthenticated" on window (the key is no longer
 * valid: expired or revoked) so the console returns to the login form.
 */
export async function request(method, path, { body, query, signal, key, headers: extra } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
  }
  const headers = { Accept: "application/json", ...(extra || {}) };
  const token = key ?? session.key;
  if (token) headers.Authorization = `Bearer ${token}`;
  let payload;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = typeof body === "string" ? body : JSON.stringify(body);
  }
  const timeout = AbortSignal.timeout(TIMEOUT_MS);
  const response = await fetch(url, {
    method, headers, body: payload, cache: "no-store", credentials: "omit",
    referrerPolicy: "no-referrer", redirect: "error",
    signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
  });
  const text = await response.text();
  if (!response.ok) {
    let err = {};
    try { err = JSON.parse(text).error || {}; } catch { /* not JSON */ }
    const e = new ApiError(response.status, err.code, err.message || response.statusText,
      err.details, response.headers.get("X-Request-Id"));
    if (response.status === 401 && !key) {
      window.dispatchEvent(new CustomEvent("orbit:unauthenticated", { detail: e }));
    }
    throw e;
  }
  let json;
  try { json = new ExactJson(text); } catch { json = new ExactJson(""); }
  return { status: response.status, json, data: json.data, headers: response.headers, text };
}

export const get = (path, opts = {}) => request("GET", path, opts);
export const post = (path, body, opts = {}) => request("POST", path, { ...opts, body: body ?? {} });

/**
 * What this server serves, from its OpenAPI document (open endpoint): a set of
 * "METHOD /path/{template}". null when it cannot be read (then every view is tried and an
 * unavailable route is detected from the answer instead).
 */
let capabilities;
export async function loadCapabilities() {
  if (capabilities !== undefined) return capabilities;
  try {
    const { data } = await request("GET", "/openapi.json", { key: "" });
    capabilities = new Set();
    for (const [path, ops] of Object.entries(data.paths || {})) {
      for (const method of Object.keys(ops)) capabilities.add(`${method.toUpperCase()} ${path}`);
    }
  } catch {
    capabilities = null;
  }
  return capabilities;
}

/** Does the server serve `method` on `template` (e.g. "/v1/namespaces/{ns}/queues")? */
export function serves(method, template) {
  if (!capabilities) return true;
  const wanted = template.replace(/\{[^}]+\}/g, "{}");
  for (const entry of capabilities) {
    const [m, p] = entry.split(" ");
    if (m === method && p.replace(/\{[^}]+\}/g, "{}") === wanted) return true;
  }
  return false;
}
