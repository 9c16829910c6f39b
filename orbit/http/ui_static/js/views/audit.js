// Audit: the namespace's audit trail, newest first, with the API's filters (outcome, action,
// time range) in the address, cursor paging. Needs a key with `admin`.

import { get, nsPath } from "../api.js";
import { field, h, table, uid } from "../dom.js";
import { jsonInline, shortId, state, time } from "../format.js";
import { liveRegion, missing } from "../widgets.js";

const FILTERS = ["outcome", "action", "since", "until"];
const OUTCOMES = ["ok", "denied", "conflict", "error"];

export function mount(ctx) {
  ctx.setTitle("Audit");
  const { root, query } = ctx;
  root.append(h("h1", {}, "Audit"),
    h("p", { class: "lede" }, "Who did what to which resource, with what outcome — newest first."));
  if (missing(root, "The audit view", ["GET", "/v1/namespaces/{ns}/audit"])) return {};

  const filters = Object.fromEntries(FILTERS.map((f) => [f, query.get(f) || ""]));
  const controls = {
    outcome: h("select", { id: uid("a-outcome") }, h("option", { value: "" }, "Any outcome"),
      OUTCOMES.map((o) => h("option", { value: o, selected: filters.outcome === o }, o))),
    action: h("input", { id: uid("a-action"), type: "text", value: filters.action, autocomplete: "off", spellcheck: "false", maxlength: "64", placeholder: "tasks.cancel" }),
    since: h("input", { id: uid("a-since"), type: "text", value: filters.since, autocomplete: "off", spellcheck: "false", class: "mono", placeholder: "2026-11-01T00:00:00Z" }),
    until: h("input", { id: uid("a-until"), type: "text", value: filters.until, autocomplete: "off", spellcheck: "false", class: "mono" }),
  };
  const form = h("form", { class: "filters", role: "search", "aria-label": "Audit filters", novalidate: true },
    field("Outcome", controls.outcome), field("Action", controls.action),
    field("Since (UTC)", controls.since, "inclusive, RFC 3339"), field("Until (UTC)", controls.until, "exclusive"),
    h("div", { class: "form-actions" },
      h("button", { type: "submit" }, "Search"),
      h("button", { type: "button", class: "secondary", onclick: () => ctx.navigate("#/audit") }, "Reset")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const params = new URLSearchParams();
    for (const f of FILTERS) {
      const v = controls[f].value.trim();
      if (v) params.set(f, v);
    }
    ctx.navigate(`#/audit${params.size ? `?${params}` : ""}`);
  });
  root.append(form);

  const cursors = [null];

  async function load() {
    const r = await get(nsPath("audit"), { query: { ...filters, limit: 50, cursor: cursors[cursors.length - 1] }, signal: ctx.signal });
    return { key: r.text + cursors.length, items: r.data.items, next: r.data.next_cursor, json: r.json };
  }

  async function go(delta, next) {
    if (delta > 0) cursors.push(next); else cursors.pop();
    live.invalidate();
    await live.refresh();
    ctx.announce(`Page ${cursors.length}`);
  }

  function who(actor) {
    if (!actor || !actor.credential_id) return h("span", { class: "muted" }, "orbit CLI");
    return h("span", { title: actor.credential_id }, actor.credential_name || shortId(actor.credential_id));
  }

  function render({ items, next, json }) {
    const page = cursors.length;
    return [
      h("div", { class: "table-wrap" }, table({
        caption: `Page ${page}: newest first`,
        columns: [{ label: "At (UTC)" }, { label: "Action" }, { label: "Outcome" }, { label: "Status", className: "num" },
          { label: "Resource" }, { label: "By" }, { label: "Request" }, { label: "Details" }],
        rows: items.map((e, i) => h("tr", {},
          h("td", {}, time(e.created_at)),
          h("th", { scope: "row" }, e.action),
          h("td", {}, state(String(e.outcome).toUpperCase())),
          h("td", { class: "num" }, String(e.status_code)),
          h("td", { class: "small" }, `${e.resource_kind}${e.resource_id ? ` ${e.resource_id}` : ""}`),
          h("td", {}, who(e.actor)),
          h("td", { class: "mono small", title: e.request_id || "" }, e.request_id ? shortId(e.request_id) : "—"),
          h("td", {}, jsonInline(json.raw("items", i, "details"), e.details, 80)))),
        empty: "No audit event matches these filters.",
      })),
      h("div", { class: "pager" },
        h("button", { type: "button", class: "secondary", disabled: page === 1, "data-focus-key": "prev", onclick: () => go(-1) }, "← Newer"),
        h("button", { type: "button", class: "secondary", disabled: !next, "data-focus-key": "next", onclick: () => go(1, next) }, "Older →")),
    ];
  }

  const live = liveRegion(root, { load, render, label: "Audit events" });
  return { refresh: live.refresh };
}
