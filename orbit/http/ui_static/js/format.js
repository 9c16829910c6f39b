// Formatting of API values for display (times in UTC, states as labelled badges).

import { h } from "./dom.js";
import { pretty, stringify } from "./json.js";

/** "2026-11-29T21:30:00.123456Z" -> <time> showing "2026-11-29 21:30:00" (UTC). */
export function time(value, { relative = false } = {}) {
  if (!value) return h("span", { class: "muted" }, "—");
  const text = String(value).replace("T", " ").replace(/\.\d+/, "").replace("Z", "");
  const rel = relative ? ` (${ago(value)})` : "";
  return h("time", { datetime: value, title: `${value} (UTC)` }, text + rel);
}

/** "3 s ago" / "in 5 min" relative to now. */
export function ago(value) {
  const t = Date.parse(value);
  if (Number.isNaN(t)) return "";
  const d = Math.round((t - Date.now()) / 1000);
  const a = Math.abs(d);
  if (a < 5) return "just now"; // within clock skew between browser and server
  const n = a < 60 ? `${a} s` : a < 3600 ? `${Math.round(a / 60)} min`
    : a < 86400 ? `${Math.round(a / 3600)} h` : `${Math.round(a / 86400)} d`;
  return d >= 0 ? `in ${n}` : `${n} ago`;
}

/** A state badge: the state name as text (colour is only a second cue). */
export function state(name) {
  if (!name) return h("span", { class: "muted" }, "—");
  return h("span", { class: `state state-${String(name).replace(/[^A-Za-z_]/g, "")}` }, String(name));
}

/** A number, or "∞"/"—" for null limits. */
export function limit(value) {
  return value === null || value === undefined ? "∞" : num(value);
}

export function num(value) {
  return typeof value === "number" ? value.toLocaleString("en-US") : String(value ?? "—");
}

export function yesno(value) {
  return value ? "yes" : "no";
}

/** A shortened id (first 12 hex) with the full id in the title; `label` for screen readers. */
export function shortId(id) {
  return id ? String(id).slice(0, 12) + "…" : "—";
}

/**
 * A block showing JSON: the pretty form (tokens re-indented, never re-encoded) and, on a
 * toggle, the exact text as returned by the server. `raw` is exact source text; when only a
 * parsed value exists (platform fields), it is stringified.
 */
export function jsonBlock(label, raw, value) {
  const exact = raw !== undefined ? raw : stringify(value);
  if (exact === "" || exact === "null") {
    return h("section", { class: "json-block" }, h("h3", {}, label), h("p", { class: "muted" }, "null"));
  }
  let prettyText;
  try { prettyText = pretty(exact); } catch { prettyText = exact; }
  const pre = h("pre", { class: "json", tabindex: "0", "aria-label": `${label} (pretty)` }, prettyText);
  const btnPretty = h("button", { type: "button", class: "seg", "aria-pressed": "true" }, "Pretty");
  const btnExact = h("button", { type: "button", class: "seg", "aria-pressed": "false" }, "Exact text");
  const show = (mode) => {
    const isExact = mode === "exact";
    pre.textContent = isExact ? exact : prettyText;
    pre.setAttribute("aria-label", `${label} (${isExact ? "exact text" : "pretty"})`);
    pre.classList.toggle("exact", isExact);
    btnPretty.setAttribute("aria-pressed", String(!isExact));
    btnExact.setAttribute("aria-pressed", String(isExact));
  };
  btnPretty.addEventListener("click", () => show("pretty"));
  btnExact.addEventListener("click", () => show("exact"));
  return h("section", { class: "json-block" },
    h("div", { class: "json-head" }, h("h3", {}, label),
      h("div", { class: "segmented", role: "group", "aria-label": `${label} view` }, btnPretty, btnExact),
      h("span", { class: "muted small" }, `${exact.length.toLocaleString("en-US")} characters`)),
    pre);
}

/** Compact one-line JSON text (exact when raw is given), truncated for tables. */
export function jsonInline(raw, value, max = 80) {
  const text = raw !== undefined ? raw : stringify(value);
  if (text === "" || text === "null" || text === undefined) return h("span", { class: "muted" }, "—");
  const short = text.length > max ? text.slice(0, max) + "…" : text;
  return h("code", { class: "inline-json", title: text.length > max ? text.slice(0, 2000) : null }, short);
}
