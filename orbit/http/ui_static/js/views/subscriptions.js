// Subscriptions: backlog by state, exhausted deliveries (add budget), delivery history.

import { get, nsPath, post, serves } from "../api.js";
import { deflist, h, table, uid } from "../dom.js";
import { num, shortId, state, time } from "../format.js";
import { act, liveRegion, lookupForm, missing } from "../widgets.js";

const NAME = "[A-Za-z0-9_.\\-]{1,63}";
const DELIVERY_STATES = ["PENDING", "LEASED", "EXHAUSTED", "ACKED"];

export function mount(ctx) {
  const [name] = ctx.params;
  return name ? detail(ctx, name) : list(ctx);
}

function list(ctx) {
  ctx.setTitle("Subscriptions");
  const { root } = ctx;
  root.append(h("h1", {}, "Subscriptions"),
    h("p", { class: "lede" }, "Result-event subscriptions: backlog, in-flight and exhausted deliveries."));
  if (missing(root, "The subscriptions view", ["GET", "/v1/namespaces/{ns}/subscriptions/{name}"])) return {};
  const lookup = lookupForm({ kind: "subscription", label: "Subscription name", pattern: NAME,
    hrefOf: (n) => `#/subscriptions/${encodeURIComponent(n)}` });
  root.append(lookup);
  if (!serves("GET", "/v1/namespaces/{ns}/subscriptions")) {
    root.append(h("p", { class: "muted" }, "This server cannot list subscriptions: open one by name."));
    return {};
  }
  const live = liveRegion(root, {
    label: "Subscriptions",
    onUnavailable: () => lookup.remove(),
    load: async () => {
      const r = await get(nsPath("subscriptions"), { query: { limit: 200 }, signal: ctx.signal });
      return { key: r.text, items: r.data.items };
    },
    render: ({ items }) => h("div", { class: "table-wrap" }, table({
      caption: "Subscriptions by name",
      columns: [{ label: "Subscription" }, { label: "Position", className: "num" }, { label: "Max deliveries", className: "num" }, { label: "Updated (UTC)" }],
      rows: items.map((s) => h("tr", {},
        h("th", { scope: "row" }, h("a", { href: `#/subscriptions/${encodeURIComponent(s.name)}` }, s.name)),
        h("td", { class: "num" }, num(s.position)), h("td", { class: "num" }, num(s.max_deliveries)), h("td", {}, time(s.updated_at)))),
      empty: "No subscriptions in this namespace.",
    })),
  });
  return { refresh: live.refresh };
}

function detail(ctx, name) {
  ctx.setTitle(`Subscription ${name}`);
  const { root, query } = ctx;
  root.append(h("p", { class: "crumbs" }, h("a", { href: "#/subscriptions" }, "Subscriptions"), " / ", name));
  if (missing(root, "The subscriptions view", ["GET", "/v1/namespaces/{ns}/subscriptions/{name}"])) return {};
  const withHistory = serves("GET", "/v1/namespaces/{ns}/subscriptions/{name}/deliveries");
  const canBudget = serves("POST", "/v1/namespaces/{ns}/deliveries/{id}/budget");
  const historyState = DELIVERY_STATES.includes(query.get("state")) ? query.get("state") : "";
  const status = h("p", { class: "action-status", role: "status" });

  async function load() {
    const [sub, exhausted, recent] = await Promise.all([
      get(nsPath("subscriptions", name), { signal: ctx.signal }),
      withHistory ? get(nsPath("subscriptions", name, "deliveries"), { query: { state: "EXHAUSTED", limit: 100 }, signal: ctx.signal }) : null,
      withHistory ? get(nsPath("subscriptions", name, "deliveries"), { query: { state: historyState, limit: 50 }, signal: ctx.signal }) : null,
    ]);
    return { key: sub.text + (exhausted ? exhausted.text + recent.text : ""), sub: sub.data, exhausted, recent };
  }

  function budgetControls(d) {
    if (!canBudget) return "—";
    const input = h("input", { id: uid("budget"), type: "number", min: "1", max: "1000", value: "1", class: "narrow",
      "data-focus-key": `budget-n-${d.delivery_id}` });
    const button = h("button", { type: "button", "data-focus-key": `budget-${d.delivery_id}`,
      "aria-label": `Add budget to delivery ${d.delivery_id}`,
      onclick: async () => {
        const n = Number(input.value);
        if (!Number.isInteger(n) || n < 1) { status.className = "error"; status.textContent = "Budget to add: a whole number ≥ 1."; input.focus(); return; }
        await act(button, status, ctx.announce, () => post(nsPath("deliveries", d.delivery_id, "budget"), { add: n }),
          (r) => `Delivery ${d.delivery_id.slice(0, 12)}… revived: now ${r.data.state} with budget ${r.data.budget}`);
        live.invalidate(); await live.refresh();
      } }, "Add budget");
    return h("div", { class: "inline-form" }, h("label", { for: input.id, class: "sr-only" }, "Deliveries to add"), input, button);
  }

  function deliveriesTable(items, caption, withBudget) {
    return h("div", { class: "table-wrap" }, table({
      caption,
      columns: [{ label: "Delivery" }, { label: "Seq", className: "num" }, { label: "State" }, { label: "Attempts", className: "num" },
        { label: "Budget", className: "num" }, { label: "Next try (UTC)" }, { label: "Updated (UTC)" }, withBudget ? { label: "Add budget" } : null].filter(Boolean),
      rows: items.map((d) => h("tr", {},
        h("th", { scope: "row", class: "mono small", title: d.delivery_id }, shortId(d.delivery_id)),
        h("td", { class: "num" }, num(d.seq)), h("td", {}, state(d.state)),
        h("td", { class: "num" }, num(d.attempts)), h("td", { class: "num" }, num(d.budget)),
        h("td", {}, time(d.next_at)), h("td", {}, time(d.updated_at)),
        withBudget ? h("td", {}, budgetControls(d)) : null)),
      empty: withBudget ? "No exhausted delivery. ✓" : "No delivery.",
    }));
  }

  function render({ sub, exhausted, recent }) {
    const b = sub.backlog || {};
    const filter = h("select", { id: uid("dstate"), onchange: (e) => {
      const v = e.target.value;
      ctx.navigate(`#/subscriptions/${encodeURIComponent(name)}${v ? `?state=${v}` : ""}`);
    } }, h("option", { value: "" }, "All states"), DELIVERY_STATES.map((s) => h("option", { value: s, selected: s === historyState }, s)));
    return [
      h("h1", {}, `Subscription ${sub.name}`),
      h("div", { class: "stats", role: "group", "aria-label": "Backlog" },
        stat("Pending", b.pending), stat("In flight", b.in_flight), stat("Exhausted", b.exhausted, b.exhausted > 0),
        stat("Acked", b.acked), stat("Events not yet scanned", b.unscanned_events), stat("Last event seq", b.last_seq)),
      deflist([
        ["Filter", JSON.stringify(sub.filter)],
        ["Position (last scanned seq)", num(sub.position)],
        ["Ack timeout", `${num(sub.ack_timeout_ms)} ms`],
        ["Max deliveries per event", num(sub.max_deliveries)],
        ["Max in flight", num(sub.max_in_flight)],
        ["Updated", time(sub.updated_at)],
      ]),
      status,
      h("h2", {}, "Exhausted deliveries"),
      exhausted ? deliveriesTable(exhausted.data.items, "Deliveries whose budget is spent: add budget to deliver them again", true)
        : h("p", { class: "muted" }, "Delivery history is not available on this server."),
      h("h2", {}, "Deliveries"),
      recent ? [h("div", { class: "field inline-field" }, h("label", { for: filter.id }, "Show"), filter), deliveriesTable(recent.data.items, "Oldest first", false)] : null,
    ];
  }

  const live = liveRegion(root, { load, render, label: `Subscription ${name}` });
  return { refresh: live.refresh };
}

function stat(label, value, alert = false) {
  return h("div", { class: `stat${alert ? " alert" : ""}` }, h("span", { class: "stat-value" }, value === undefined ? "—" : num(value)), h("span", { class: "stat-label" }, label));
}
