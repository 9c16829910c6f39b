// A task's history: its raw state events in order (GET /tasks/{id}/events), every page
// followed up to a bound, shown as a timeline table (time, event, state after it, attempt,
// what else the event recorded); and the progress its latest attempt reported.

import { get, nsPath } from "./api.js";
import { h, table } from "./dom.js";
import { jsonInline, shortId, state, time } from "./format.js";

/** Pages of 500 the console reads at most for one task (a longer history says so). */
const MAX_PAGES = 10;
const OWN = new Set(["state", "state_version", "attempt_id", "queue", "attempts"]);

/** Every event of the task (up to MAX_PAGES pages): {events, text, more}. */
export async function loadHistory(id, signal) {
  const events = [];
  let text = "";
  let cursor = null;
  for (let page = 0; page < MAX_PAGES; page += 1) {
    const r = await get(nsPath("tasks", id, "events"), { query: { limit: 500, cursor }, signal });
    events.push(...(r.data.events || []));
    text += r.text;
    cursor = r.data.next_cursor;
    if (!cursor) break;
  }
  return { events, text, more: Boolean(cursor) };
}

/** The history section of the task page. */
export function historySection(history) {
  const heading = h("h2", { id: "history-h" }, "History");
  if (!history) {
    return h("section", { "aria-labelledby": "history-h" }, heading,
      h("p", { class: "muted" }, "The history is not available on this server."));
  }
  const rows = history.events.map((e) => {
    const data = e.data && typeof e.data === "object" ? e.data : {};
    const rest = Object.fromEntries(Object.entries(data).filter(([k]) => !OWN.has(k)));
    return h("tr", {},
      h("td", {}, time(e.created_at)),
      h("td", { class: "mono small" }, e.type),
      h("td", {}, state(data.state)),
      h("td", { class: "mono small", title: data.attempt_id || null }, data.attempt_id ? shortId(data.attempt_id) : "—"),
      h("td", {}, Object.keys(rest).length ? jsonInline(undefined, rest) : h("span", { class: "muted" }, "—")));
  });
  return h("section", { "aria-labelledby": "history-h" }, heading,
    h("div", { class: "table-wrap" }, table({
      caption: "Every state change of the task as it was recorded, oldest first",
      columns: [{ label: "At (UTC)" }, { label: "Event" }, { label: "State after" },
        { label: "Attempt" }, { label: "Details" }],
      rows, empty: "No events recorded (or removed by the namespace's retention).",
    })),
    history.more ? h("p", { class: "muted small" }, `Showing the first ${history.events.length.toLocaleString("en-US")} events; `
      + "`orbit tasks history ID --all` lists every one.") : null);
}

/** The progress its latest attempt reported: the document, when, and a bar when it holds
 * numbers `done` and `total` (or a `percent`). */
export function progressSection(t, raw) {
  const p = t.progress && typeof t.progress === "object" ? t.progress : {};
  let fraction = null;
  if (typeof p.done === "number" && typeof p.total === "number" && p.total > 0) fraction = p.done / p.total;
  else if (typeof p.percent === "number") fraction = p.percent / 100;
  const bar = fraction === null ? null : h("progress", {
    max: "100", value: String(Math.round(Math.min(1, Math.max(0, fraction)) * 100)),
    "aria-label": "Progress",
  });
  return h("section", { class: "progress-report", "aria-labelledby": "progress-h" },
    h("h2", { id: "progress-h" }, "Progress"),
    h("p", {}, bar, bar ? ` ${Math.round(Math.min(1, Math.max(0, fraction)) * 100)} % ` : null,
      jsonInline(raw, t.progress, 200), " ", h("span", { class: "muted small" }, "reported "), time(t.progress_at, { relative: true })));
}
