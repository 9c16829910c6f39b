// Queues: live depth by state, limits and usage, finished-per-second, pause/resume.

import { get, nsPath, post, serves, session } from "../api.js";
import { h, table } from "../dom.js";
import { limit, num, state } from "../format.js";
import { act, liveRegion, missing } from "../widgets.js";

export const STATES = ["WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW", "SUCCEEDED", "FAILED", "CANCELLED"];
const LABELS = {
  WAITING: "Waiting", LEASED: "Leased", RUNNING: "Running", NEEDS_REVIEW: "Review",
  SUCCEEDED: "Succeeded", FAILED: "Failed", CANCELLED: "Cancelled",
};
const ACTIVE = ["WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW"];
const PAGE = 100;

export function mount(ctx) {
  ctx.setTitle("Queues");
  const { root } = ctx;
  root.append(h("h1", {}, "Queues"),
    h("p", { class: "lede" }, "Live depth by state, limits, usage and gates of every queue in this namespace."));
  if (missing(root, "The queues view", ["GET", "/v1/namespaces/{ns}/queues"])) return {};
  const status = h("p", { class: "action-status", role: "status" });
  root.append(status);
  const previous = new Map(); // queue -> {t, finished}

  async function load() {
    const list = await get(nsPath("queues"), { query: { limit: PAGE }, signal: ctx.signal });
    const answers = await Promise.all(list.data.items.map((q) =>
      get(nsPath("queues", q.name), { signal: ctx.signal }).catch(() => null)));
    const now = performance.now();
    const queues = list.data.items.map((q, i) => {
      const full = answers[i] ? answers[i].data : q;
      const counts = full.counts || null;
      let rate = null;
      if (counts) {
        const finished = counts.SUCCEEDED + counts.FAILED + counts.CANCELLED;
        const before = previous.get(q.name);
        if (before && now > before.t) rate = (finished - before.finished) / ((now - before.t) / 1000);
        previous.set(q.name, { t: now, finished });
      }
      return { ...full, rate };
    });
    return { queues, more: Boolean(list.data.next_cursor) };
  }

  async function gate(button, name, paused) {
    const path = name === null ? nsPath(paused ? "resume" : "pause") : nsPath("queues", name, paused ? "resume" : "pause");
    const what = name === null ? "Namespace" : `Queue ${name}`;
    await act(button, status, ctx.announce, () => post(path),
      () => `${what} ${paused ? "resumed" : "paused"}`);
    live.invalidate();
    await live.refresh();
  }

  function render({ queues, more }) {
    if (queues.length === 0) {
      return h("p", { class: "empty-state" }, "No queues yet. Create one with ",
        h("code", {}, "PUT /v1/namespaces/{ns}/queues/{queue}"), " or the SDK.");
    }
    const nsPaused = queues.some((q) => q.namespace_paused);
    const nsControl = serves("POST", "/v1/namespaces/{ns}/pause")
      ? h("button", { type: "button", class: nsPaused ? "" : "secondary", "data-focus-key": "ns-gate",
        onclick: (e) => gate(e.currentTarget, null, nsPaused) }, nsPaused ? "Resume namespace" : "Pause namespace")
      : null;
    const banner = h("div", { class: nsPaused ? "notice warn gate-line" : "gate-line" },
      h("span", {}, "Namespace gate: ", h("strong", {}, nsPaused ? "paused — no queue starts new work" : "open")),
      nsControl);
    const columns = [
      { label: "Queue" }, { label: "Gate" },
      ...STATES.map((s) => ({ label: LABELS[s], className: `num col-${s}`, title: `${s} tasks` })),
      { label: "Depth", title: "Unfinished tasks by state" },
      { label: "Usage / limit", title: "Unfinished tasks, active attempts and starts this second, against the queue's limits" },
      { label: "Finished/s", className: "num", title: "Tasks reaching a final state per second since the last refresh" },
      { label: "Actions" },
    ];
    const rows = queues.map((q) => {
      const counts = q.counts;
      const cells = STATES.map((s) => h("td", { class: "num" }, counts
        ? h("a", { class: counts[s] ? null : "zero", href: `#/tasks?queue=${encodeURIComponent(q.name)}&state=${s}`,
          "aria-label": `${num(counts[s])} ${LABELS[s].toLowerCase()} tasks in ${q.name}` }, num(counts[s]))
        : "—"));
      const usage = q.usage;
      return h("tr", { "data-queue": q.name },
        h("th", { scope: "row" }, h("a", { href: `#/tasks?queue=${encodeURIComponent(q.name)}` }, q.name)),
        h("td", {}, q.paused ? state("PAUSED") : state("OPEN")),
        cells,
        h("td", {}, counts ? depthBar(counts) : "—"),
        h("td", { class: "usage" }, usageLines(usage, q)),
        h("td", { class: "num" }, q.rate === null ? "…" : q.rate.toFixed(1)),
        h("td", {}, h("button", {
          type: "button", class: q.paused ? "" : "secondary", "data-focus-key": `gate-${q.name}`,
          "aria-label": `${q.paused ? "Resume" : "Pause"} queue ${q.name}`,
          onclick: (e) => gate(e.currentTarget, q.name, q.paused),
        }, q.paused ? "Resume" : "Pause")));
    });
    return [banner,
      h("div", { class: "table-wrap" }, table({ caption: `Queues in namespace ${session.namespace}`, columns, rows })),
      more ? h("p", { class: "muted" }, `Showing the first ${PAGE} queues.`) : null];
  }

  const live = liveRegion(root, { load, render, label: "Queues" });
  return { refresh: live.refresh };
}

/** A stacked bar of the unfinished states (decorative: the numbers are in the row). */
function depthBar(counts) {
  const total = ACTIVE.reduce((n, s) => n + counts[s], 0);
  const bar = h("div", { class: "depth", "aria-hidden": "true", title: `${total} unfinished` });
  for (const s of ACTIVE) {
    if (!counts[s]) continue;
    const part = h("span", { class: `depth-part state-${s}` });
    part.style.width = `${Math.max(4, (100 * counts[s]) / total)}%`;
    bar.append(part);
  }
  if (!total) bar.append(h("span", { class: "depth-empty" }));
  return bar;
}

/** "unfinished 3 / 1,000", "active 0 / 4", "starts 0 / ∞ per s" (usage against limits). */
function usageLines(usage, q) {
  const line = (label, used, max, unit = "") => h("span", { class: "usage-line" },
    h("span", { class: "muted" }, `${label} `), `${used === undefined ? "—" : num(used)} / ${limit(max)}${unit}`);
  return [
    line("unfinished", usage && usage.unfinished_tasks, q.max_unfinished_tasks),
    line("active", usage && usage.active_attempts, q.max_concurrency),
    line("starts", usage && usage.window_starts, q.max_starts_per_second, " per s"),
  ];
}
