// Task search: filters (queue, state, kind, owner, dedup key, stuck), cursor paging, live refresh.

import { get, nsPath, serves } from "../api.js";
import { field, h, table, uid } from "../dom.js";
import { num, shortId, state, time } from "../format.js";
import { liveRegion, missing } from "../widgets.js";
import { STATES } from "./queues.js";

const FILTERS = ["queue", "state", "kind", "owner_id", "dedup_key", "stuck"];

export function mount(ctx) {
  ctx.setTitle("Tasks");
  const { root, query } = ctx;
  root.append(h("h1", {}, "Tasks"));
  if (missing(root, "Task search", ["GET", "/v1/namespaces/{ns}/tasks"])) return {};

  const filters = Object.fromEntries(FILTERS.map((f) => [f, query.get(f) || ""]));
  const pageSize = ["25", "50", "100", "200"].includes(query.get("limit")) ? query.get("limit") : "50";
  const controls = {
    queue: h("input", { id: uid("f-queue"), type: "text", list: "queue-names", value: filters.queue, autocomplete: "off", spellcheck: "false" }),
    state: h("select", { id: uid("f-state") }, h("option", { value: "" }, "Any state"),
      STATES.map((s) => h("option", { value: s, selected: filters.state === s }, s))),
    kind: h("input", { id: uid("f-kind"), type: "text", value: filters.kind, autocomplete: "off", spellcheck: "false" }),
    owner_id: h("input", { id: uid("f-owner"), type: "text", value: filters.owner_id, autocomplete: "off", spellcheck: "false", pattern: "[0-9a-f]{32}", maxlength: "32" }),
    dedup_key: h("input", { id: uid("f-dedup"), type: "text", value: filters.dedup_key, autocomplete: "off", spellcheck: "false" }),
    // The stuck-work watchdog's marks (GET …/tasks?stuck=true|false).
    stuck: h("select", { id: uid("f-stuck") },
      [["", "Any"], ["true", "Stuck only"], ["false", "Not stuck"]].map(([v, label]) =>
        h("option", { value: v, selected: filters.stuck === v }, label))),
    limit: h("select", { id: uid("f-limit") }, ["25", "50", "100", "200"].map((n) => h("option", { value: n, selected: n === pageSize }, n))),
  };
  const queueNames = h("datalist", { id: "queue-names" });
  const formError = h("p", { class: "error", role: "alert", hidden: true });
  const form = h("form", { class: "filters", role: "search", "aria-label": "Task filters", novalidate: true },
    field("Queue", controls.queue), field("State", controls.state), field("Kind", controls.kind),
    field("Owner id", controls.owner_id, "32 hex"), field("Dedup key", controls.dedup_key),
    field("Stuck", controls.stuck),
    field("Per page", controls.limit),
    h("div", { class: "form-actions" },
      h("button", { type: "submit" }, "Search"),
      h("button", { type: "button", class: "secondary", onclick: () => ctx.navigate("#/tasks") }, "Reset")),
    queueNames, formError);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const owner = controls.owner_id.value.trim();
    if (owner && !/^[0-9a-f]{32}$/.test(owner)) {
      formError.hidden = false;
      formError.textContent = "Owner id is 32 lowercase hex characters.";
      controls.owner_id.focus();
      return;
    }
    const params = new URLSearchParams();
    for (const f of FILTERS) {
      const v = controls[f].value.trim();
      if (v) params.set(f, v);
    }
    if (controls.limit.value !== "50") params.set("limit", controls.limit.value);
    ctx.navigate(`#/tasks?${params}`);
  });
  root.append(form);
  if (serves("GET", "/v1/namespaces/{ns}/queues")) {
    get(nsPath("queues"), { query: { limit: 500 }, signal: ctx.signal })
      .then(({ data }) => { for (const q of data.items) queueNames.append(h("option", { value: q.name })); })
      .catch(() => {});
  }

  // Cursor paging: the stack holds the cursor of every page visited (null = first page).
  const cursors = [null];
  const active = Object.entries(filters).filter(([, v]) => v);
  const summary = active.length ? active.map(([k, v]) => `${k} = ${v}`).join(", ") : "no filters";

  async function load() {
    const q = { ...filters, limit: pageSize, cursor: cursors[cursors.length - 1] };
    const r = await get(nsPath("tasks"), { query: q, signal: ctx.signal });
    return { key: r.text + cursors.length, items: r.data.items, next: r.data.next_cursor };
  }

  async function go(delta, next) {
    if (delta > 0) cursors.push(next); else cursors.pop();
    live.invalidate();
    await live.refresh();
    ctx.announce(`Page ${cursors.length}`);
  }

  function render({ items, next }) {
    const columns = [
      { label: "Task" }, { label: "Queue" }, { label: "Kind" }, { label: "State" },
      { label: "Attempts", className: "num" }, { label: "Priority", className: "num" },
      { label: "Dedup key" }, { label: "Created (UTC)" }, { label: "State changed (UTC)" },
    ];
    const rows = items.map((t) => h("tr", {},
      h("th", { scope: "row" }, h("a", { href: `#/tasks/${t.id}`, class: "mono", title: t.id, "aria-label": `Task ${t.id}` }, shortId(t.id))),
      h("td", {}, t.queue),
      h("td", {}, t.kind),
      h("td", {}, state(t.state), t.effect_uncertain ? h("span", { class: "flag", title: "effect uncertain" }, " ⚠ uncertain") : null,
        t.stuck_at ? h("span", { class: "flag", title: t.stuck_reason || "stuck" }, " ⏱ stuck") : null),
      h("td", { class: "num" }, `${num(t.attempts)} / ${num(t.max_attempts)}`),
      h("td", { class: "num" }, num(t.priority)),
      h("td", { class: "small" }, t.dedup_key ?? "—"),
      h("td", {}, time(t.created_at)),
      h("td", {}, time(t.state_changed_at || t.finished_at))));
    const page = cursors.length;
    return [
      h("p", { class: "muted" }, `Page ${page} · ${items.length} tasks · ${summary}`),
      h("div", { class: "table-wrap" }, table({ caption: "Matching tasks, oldest first", columns, rows, empty: "No task matches these filters." })),
      h("div", { class: "pager" },
        h("button", { type: "button", class: "secondary", disabled: page === 1, "data-focus-key": "prev",
          onclick: () => go(-1) }, "← Previous page"),
        h("button", { type: "button", class: "secondary", disabled: !next, "data-focus-key": "next",
          onclick: () => go(1, next) }, "Next page →")),
    ];
  }

  const live = liveRegion(root, { load, render, label: "Task results" });
  return { refresh: live.refresh };
}
