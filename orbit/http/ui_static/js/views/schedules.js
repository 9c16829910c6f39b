// Schedules: list (when the server has the list route, else open by name), detail with the
// current version, next fire time, covered_until, pause/resume, trigger / backfill / delete
// (schedule_controls.js), and occurrences.

import { get, nsPath, post, serves } from "../api.js";
import { deflist, h, table } from "../dom.js";
import { ago, jsonBlock, num, shortId, state, time } from "../format.js";
import { scheduleControls } from "../schedule_controls.js";
import { act, liveRegion, lookupForm, missing } from "../widgets.js";

const NAME = "[A-Za-z0-9_.\\-]{1,63}";

export function mount(ctx) {
  const [name] = ctx.params;
  return name ? detail(ctx, name) : list(ctx);
}

function cadence(s) {
  if (s.cron) return `cron “${s.cron}” (${s.timezone || "UTC"})`;
  if (s.every_ms) return `every ${num(s.every_ms)} ms`;
  return "—";
}

function list(ctx) {
  ctx.setTitle("Schedules");
  const { root } = ctx;
  root.append(h("h1", {}, "Schedules"),
    h("p", { class: "lede" }, "Cron and interval schedules: next fire times, pause state and what each occurrence created."));
  if (missing(root, "The schedules view", ["GET", "/v1/namespaces/{ns}/schedules/{name}"])) return {};
  const lookup = lookupForm({ kind: "schedule", label: "Schedule name", pattern: NAME,
    hrefOf: (n) => `#/schedules/${encodeURIComponent(n)}` });
  root.append(lookup);
  if (!serves("GET", "/v1/namespaces/{ns}/schedules")) {
    root.append(h("p", { class: "muted" }, "This server cannot list schedules: open one by name."));
    return {};
  }
  const live = liveRegion(root, {
    label: "Schedules",
    onUnavailable: () => lookup.remove(),
    load: async () => {
      const r = await get(nsPath("schedules"), { query: { limit: 200 }, signal: ctx.signal });
      return { key: r.text, items: r.data.items, more: Boolean(r.data.next_cursor) };
    },
    render: ({ items, more }) => [
      h("div", { class: "table-wrap" }, table({
        caption: "Schedules by name",
        columns: [{ label: "Schedule" }, { label: "State" }, { label: "Cadence" }, { label: "Queue" },
          { label: "Task kind" }, { label: "Version", className: "num" }, { label: "Next fire (UTC)" }, { label: "Covered until (UTC)" }],
        rows: items.map((s) => h("tr", {},
          h("th", { scope: "row" }, h("a", { href: `#/schedules/${encodeURIComponent(s.name)}` }, s.name)),
          h("td", {}, state(s.paused ? "PAUSED" : "ACTIVE")),
          h("td", { class: "small" }, cadence(s)),
          h("td", {}, s.queue ?? "—"),
          h("td", {}, s.task ? s.task.kind : "—"),
          h("td", { class: "num" }, num(s.version)),
          h("td", {}, time(s.next_fire_at, { relative: true })),
          h("td", {}, time(s.covered_until)))),
        empty: "No schedules in this namespace.",
      })),
      more ? h("p", { class: "muted" }, "Showing the first 200 schedules.") : null,
    ],
  });
  return { refresh: live.refresh };
}

function detail(ctx, name) {
  ctx.setTitle(`Schedule ${name}`);
  const { root } = ctx;
  root.append(h("p", { class: "crumbs" }, h("a", { href: "#/schedules" }, "Schedules"), " / ", name));
  if (missing(root, "The schedules view", ["GET", "/v1/namespaces/{ns}/schedules/{name}"])) return {};
  const withOccurrences = serves("GET", "/v1/namespaces/{ns}/schedules/{name}/occurrences");
  const status = h("p", { class: "action-status", role: "status" });

  async function load() {
    const [s, occ] = await Promise.all([
      get(nsPath("schedules", name), { signal: ctx.signal }),
      withOccurrences ? get(nsPath("schedules", name, "occurrences"), { query: { limit: 50 }, signal: ctx.signal }).catch(() => null) : null,
    ]);
    return { key: s.text + (occ ? occ.text : ""), s, occ };
  }

  function render({ s, occ }) {
    const d = s.data;
    const toggle = h("button", {
      type: "button", class: d.paused ? "" : "secondary", "data-focus-key": "sched-gate",
      onclick: async (e) => {
        await act(e.currentTarget, status, ctx.announce,
          () => post(nsPath("schedules", name, d.paused ? "resume" : "pause")),
          () => `Schedule ${name} ${d.paused ? "resumed" : "paused"}`);
        live.invalidate(); await live.refresh();
      },
    }, d.paused ? "Resume schedule" : "Pause schedule");
    const controls = scheduleControls(name, d, {
      status,
      announce: ctx.announce,
      onChanged: async () => { live.invalidate(); await live.refresh(); },
      onDeleted: () => ctx.navigate("#/schedules"),
    });
    return [
      h("h1", {}, `Schedule ${d.name} `, state(d.paused ? "PAUSED" : "ACTIVE")),
      h("div", { class: "actions" }, toggle, controls), status,
      deflist([
        ["Cadence", cadence(d)],
        ["Next fire", d.next_fire_at ? [time(d.next_fire_at), ` (${ago(d.next_fire_at)}; local ${d.next_fire_at_local ?? "—"})`] : "— (paused or ended)"],
        ["Covered until", time(d.covered_until)],
        ["Queue", d.queue ? h("a", { href: `#/tasks?queue=${encodeURIComponent(d.queue)}` }, d.queue) : "—"],
        ["Task kind", d.task ? d.task.kind : "—"],
        ["Version", [num(d.version), " — published ", time(d.published_at)]],
        ["Catch-up window", d.catchup_window_ms !== undefined ? `${num(d.catchup_window_ms)} ms` : "—"],
        ["Grace", d.grace_ms !== undefined ? `${num(d.grace_ms)} ms` : "—"],
        d.overlap ? ["Overlap policy", d.overlap] : null,
        d.last_task_id ? ["Previous run", h("a", { href: `#/tasks/${d.last_task_id}`, class: "mono" }, shortId(d.last_task_id))] : null,
        d.buffered_fire_at ? ["Held back (buffer_one)", time(d.buffered_fire_at)] : null,
        d.start_at ? ["Starts", time(d.start_at)] : null,
        d.end_at ? ["Ends", time(d.end_at)] : null,
        ["tzdata", `${d.tzdata_version ?? "—"}${d.tzdata_current && d.tzdata_current !== d.tzdata_version ? ` (server has ${d.tzdata_current})` : ""}`],
      ]),
      d.task ? jsonBlock("Task payload", s.json.raw("task", "payload"), d.task.payload) : null,
      h("h2", {}, "Occurrences"),
      occ ? h("div", { class: "table-wrap" }, table({
        caption: "Newest fire time first",
        columns: [{ label: "Fire at (UTC)" }, { label: "Local time" }, { label: "Version", className: "num" },
          { label: "Origin" }, { label: "Outcome" }, { label: "Task" }, { label: "Note" }],
        rows: occ.data.items.map((o) => h("tr", {},
          h("td", {}, time(o.fire_at)),
          h("td", { class: "small" }, o.fire_at_local ?? "—"),
          h("td", { class: "num" }, num(o.version)),
          h("td", {}, o.origin ?? "schedule"),
          h("td", {}, state(String(o.outcome).toUpperCase())),
          h("td", {}, o.task_id ? h("a", { href: `#/tasks/${o.task_id}`, class: "mono", "aria-label": `Task ${o.task_id}` }, shortId(o.task_id)) : "—"),
          h("td", { class: "small" }, [o.late ? "late" : null, o.reason, o.skipped_count ? `${o.skipped_count} skipped` : null].filter(Boolean).join(" · ") || "—"))),
        empty: "No occurrence yet.",
      })) : h("p", { class: "muted" }, "Occurrences are not available on this server."),
    ];
  }

  const live = liveRegion(root, { load, render, label: `Schedule ${name}` });
  return { refresh: live.refresh };
}
