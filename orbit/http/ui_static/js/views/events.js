// Activity: the namespace's result events (task succeeded / failed / cancelled / needs
// review), newest first, live. The API pages forward from a sequence number, so the view
// first finds the last sequence with a few one-item probes (doubling, then bisection), then
// shows the latest events and asks only for newer ones on each refresh.

import { get, nsPath } from "../api.js";
import { h, table } from "../dom.js";
import { jsonInline, num, shortId, state, time } from "../format.js";
import { liveRegion, missing } from "../widgets.js";

const SHOW = 50;
const KEEP = 200;

export function mount(ctx) {
  ctx.setTitle("Activity");
  const { root } = ctx;
  root.append(h("h1", {}, "Activity"),
    h("p", { class: "lede" }, "Result events of this namespace as they happen (newest first)."));
  if (missing(root, "The activity view", ["GET", "/v1/namespaces/{ns}/events"])) return {};

  let after = null; // last seq seen
  let events = []; // newest first: {item, raw}

  const exists = async (seq) => {
    const r = await get(nsPath("events"), { query: { after_seq: seq - 1, limit: 1 }, signal: ctx.signal });
    return r.data.items.length > 0;
  };

  async function lastSeq() {
    if (!(await exists(1))) return 0;
    let lo = 1;
    let hi = 2;
    while (await exists(hi)) { lo = hi; hi *= 2; }
    while (hi - lo > 1) {
      const mid = Math.floor((lo + hi) / 2);
      if (await exists(mid)) lo = mid; else hi = mid;
    }
    return lo; // sequences are gap-free: seq lo exists, lo + 1 does not
  }

  async function load() {
    if (after === null) after = Math.max(0, (await lastSeq()) - SHOW);
    for (let page = 0; page < 10; page += 1) {
      const r = await get(nsPath("events"), { query: { after_seq: after, limit: 100 }, signal: ctx.signal });
      const items = r.data.items;
      items.forEach((item, i) => events.unshift({ item, result: r.json.raw("items", i, "result") }));
      after = r.data.next_after_seq ?? (items.length ? items[items.length - 1].seq : after);
      if (!r.data.next_cursor) break;
    }
    events = events.slice(0, KEEP);
    return { key: String(after), list: events };
  }

  function render({ list }) {
    return h("div", { class: "table-wrap" }, table({
      caption: `Latest ${Math.min(list.length, KEEP)} result events`,
      columns: [{ label: "Seq", className: "num" }, { label: "At (UTC)" }, { label: "Event" }, { label: "Task" },
        { label: "Queue" }, { label: "Kind" }, { label: "Attempts", className: "num" }, { label: "Result / error" }],
      rows: list.map(({ item: e, result }) => h("tr", {},
        h("td", { class: "num" }, num(e.seq)), h("td", {}, time(e.created_at)),
        h("td", {}, state(e.state), " ", h("span", { class: "small muted" }, e.type)),
        h("td", {}, h("a", { href: `#/tasks/${e.task_id}`, class: "mono", "aria-label": `Task ${e.task_id}` }, shortId(e.task_id))),
        h("td", {}, e.queue), h("td", {}, e.kind), h("td", { class: "num" }, num(e.attempts)),
        h("td", {}, e.error ? jsonInline(undefined, e.error, 60) : jsonInline(result, e.result, 60)))),
      empty: "No result event yet.",
    }));
  }

  const live = liveRegion(root, { load, render, label: "Result events" });
  return { refresh: live.refresh };
}
