// Task detail: facts, payload/result/error (pretty and exact), attempts with evidence, a
// timeline, cancel, re-run (FAILED or CANCELLED) and (for NEEDS_REVIEW) resolve.

import { get, nsPath, post, serves } from "../api.js";
import { deflist, h, table } from "../dom.js";
import { jsonBlock, jsonInline, num, shortId, state, time, yesno } from "../format.js";
import { historySection, loadHistory, progressSection } from "../history.js";
import { rerunForm } from "../rerun.js";
import { resolveForm } from "../resolve.js";
import { act, liveRegion, missing } from "../widgets.js";

const CANCELLABLE = new Set(["WAITING", "LEASED", "RUNNING"]);

export function mount(ctx) {
  const [id] = ctx.params;
  ctx.setTitle(`Task ${id.slice(0, 12)}`);
  const { root } = ctx;
  root.append(h("p", { class: "crumbs" }, h("a", { href: "#/tasks" }, "Tasks"), " / ", h("span", { class: "mono" }, id)));
  if (missing(root, "Task detail", ["GET", "/v1/namespaces/{ns}/tasks/{id}"])) return {};
  const withAttempts = serves("GET", "/v1/namespaces/{ns}/tasks/{id}/attempts");
  const withEvents = serves("GET", "/v1/namespaces/{ns}/tasks/{id}/events");

  async function load() {
    const [task, attempts, events] = await Promise.all([
      get(nsPath("tasks", id), { signal: ctx.signal }),
      withAttempts ? get(nsPath("tasks", id, "attempts"), { signal: ctx.signal }).catch(() => null) : null,
      withEvents ? loadHistory(id, ctx.signal).catch(() => null) : null,
    ]);
    return { key: task.text + (attempts ? attempts.text : "") + (events ? events.text : ""), task, attempts, events };
  }

  function render({ task, attempts, events }) {
    const t = task.data;
    const out = [h("h1", {}, "Task ", h("span", { class: "mono" }, t.id), " ", state(t.state))];
    if (t.effect_uncertain) {
      out.push(h("p", { class: "notice warn" }, "Effect uncertain: an attempt was lost while running, so its "
        + "side effects may or may not have happened. Check the evidence before resolving."));
    }
    if (t.cancel_requested && CANCELLABLE.has(t.state)) {
      out.push(h("p", { class: "notice" }, "Cancel requested: waiting for the worker to stop."));
    }
    out.push(actions(t));
    if (t.progress !== null && t.progress !== undefined) out.push(progressSection(t, task.json.raw("progress")));
    out.push(h("section", { "aria-labelledby": "facts-h" }, h("h2", { id: "facts-h" }, "Facts"), facts(t)));
    out.push(h("section", { class: "json-grid", "aria-label": "Payload, result and error" },
      jsonBlock("Payload", task.json.raw("payload"), t.payload),
      jsonBlock("Result", task.json.raw("result"), t.result),
      jsonBlock("Error", task.json.raw("error"), t.error),
      t.resolution ? jsonBlock("Resolution", task.json.raw("resolution"), t.resolution) : null));
    out.push(attemptsSection(attempts));
    if (withEvents) out.push(historySection(events));
    out.push(timeline(t, attempts ? attempts.data : null));
    return out;
  }

  function actions(t) {
    const status = h("p", { class: "action-status", role: "status" });
    const bar = h("div", { class: "actions" });
    if (CANCELLABLE.has(t.state) && !t.cancel_requested) {
      const confirmBtn = h("button", { type: "button", class: "danger", "data-focus-key": "cancel-confirm" }, "Yes, cancel this task");
      const details = h("details", { class: "confirm" }, h("summary", {}, "Cancel task…"),
        h("p", {}, t.state === "RUNNING"
          ? "The worker is asked to stop; the task ends CANCELLED when it does."
          : "The task ends CANCELLED at once."), confirmBtn);
      details.addEventListener("toggle", () => details.toggleAttribute("data-hold", details.open));
      confirmBtn.addEventListener("click", async () => {
        const r = await act(confirmBtn, status, ctx.announce, () => post(nsPath("tasks", t.id, "cancel")),
          (res) => (res.status === 202 ? "Cancel requested" : "Task cancelled"));
        if (r) { details.open = false; details.removeAttribute("data-hold"); live.invalidate(); await live.refresh(); }
      });
      bar.append(details);
    }
    if ((t.state === "FAILED" || t.state === "CANCELLED") && serves("POST", "/v1/namespaces/{ns}/tasks/{id}/retry")
        && !(t.source && t.source.kind === "workflow")) {
      bar.append(rerunForm(t, { announce: ctx.announce, onDone: async () => { live.invalidate(); await live.refresh(); } }));
    }
    if (t.state === "NEEDS_REVIEW") {
      bar.append(resolveForm(t, {
        announce: ctx.announce,
        open: ctx.query.get("resolve") === "1",
        onDone: async () => { live.invalidate(); await live.refresh(); },
      }));
    }
    bar.append(h("a", { class: "button secondary", href: `#/tasks?queue=${encodeURIComponent(t.queue)}` }, `Other tasks in ${t.queue}`));
    return [bar, status];
  }

  const live = liveRegion(root, { load, render, label: "Task" });
  return { refresh: live.refresh };
}

function facts(t) {
  const src = t.source && t.source.kind ? `${t.source.kind}${t.source.id ? " " + t.source.id : ""}` : null;
  return deflist([
    ["Queue", h("a", { href: `#/tasks?queue=${encodeURIComponent(t.queue)}` }, t.queue)],
    ["Kind", t.kind],
    ["Pipeline version", t.pipeline_version || "—"],
    ["Dedup key", t.dedup_key ?? "—"],
    ["Owner", h("span", { class: "mono" }, t.owner_id)],
    ["Priority", num(t.priority)],
    ["Attempts", `${num(t.attempts)} of ${num(t.max_attempts)}`],
    ["Retry safe", yesno(t.retry_safe)],
    t.concurrency_key ? ["Concurrency key", t.concurrency_key] : null,
    t.fairness_key ? ["Fairness key", t.fairness_key] : null,
    src ? ["Source", src] : null,
    ["Created", time(t.created_at, { relative: true })],
    ["Available", time(t.available_at)],
    t.deadline_at ? ["Deadline", time(t.deadline_at, { relative: true })] : null,
    ["Started", time(t.started_at)],
    ["Finished", time(t.finished_at)],
    ["State changed", time(t.state_changed_at, { relative: true })],
    ["Revision", num(t.revision)],
  ]);
}

function attemptsSection(attempts) {
  const heading = h("h2", { id: "attempts-h" }, "Attempts");
  if (!attempts) return h("section", { "aria-labelledby": "attempts-h" }, heading, h("p", { class: "muted" }, "Attempts are not available on this server."));
  const { data, json } = attempts;
  const rows = [];
  data.items.forEach((a, i) => {
    rows.push(h("tr", {},
      h("th", { scope: "row", class: "num" }, num(a.generation)),
      h("td", {}, state(a.state)),
      h("td", { class: "mono small", title: a.session_id }, shortId(a.session_id)),
      h("td", {}, time(a.offered_at)), h("td", {}, time(a.started_at)), h("td", {}, time(a.finished_at)),
      h("td", {}, a.retryable === null ? "—" : yesno(a.retryable)),
      h("td", {}, jsonInline(json.raw("items", i, "result"), a.result)),
      h("td", {}, jsonInline(json.raw("items", i, "error"), a.error))));
    a.evidence.forEach((e, j) => {
      rows.push(h("tr", { class: "evidence" },
        h("td", {}, ""),
        h("td", { colspan: "2" }, h("span", { class: "tag" }, "evidence"), " ", e.kind),
        h("td", { colspan: "3" }, time(e.created_at)),
        h("td", { colspan: "3" }, jsonInline(json.raw("items", i, "evidence", j, "result"), e.result, 60), " ",
          jsonInline(json.raw("items", i, "evidence", j, "data"), e.data, 60))));
    });
  });
  const orphan = (data.evidence || []).map((e, j) => h("li", {}, time(e.created_at), ` ${e.kind} `,
    jsonInline(json.raw("evidence", j, "data"), e.data)));
  return h("section", { "aria-labelledby": "attempts-h" }, heading,
    h("div", { class: "table-wrap" }, table({
      caption: "Each attempt is one execution generation; evidence rows follow their attempt",
      columns: [{ label: "Gen.", className: "num" }, { label: "State" }, { label: "Session" },
        { label: "Offered" }, { label: "Started" }, { label: "Ended" }, { label: "Retryable" },
        { label: "Result" }, { label: "Error" }],
      rows, empty: "No attempt yet.",
    })),
    orphan.length ? [h("h3", {}, "Evidence not tied to an attempt"), h("ul", {}, orphan)] : null);
}

/** A timeline built from the task and its attempts (what happened, in order). */
function timeline(t, attempts) {
  const entries = [];
  const add = (at, what) => { if (at) entries.push([at, what]); };
  add(t.created_at, `Submitted${t.source && t.source.kind && t.source.kind !== "api" ? ` by ${t.source.kind}` : ""}`);
  if (t.available_at && t.available_at !== t.created_at) add(t.available_at, "Available to workers");
  for (const a of attempts ? attempts.items : []) {
    add(a.offered_at, `Attempt ${a.generation} offered to session ${a.session_id.slice(0, 8)}…`);
    add(a.started_at, `Attempt ${a.generation} started`);
    add(a.finished_at, `Attempt ${a.generation} ended ${a.state}`);
    for (const e of a.evidence) add(e.created_at, `Evidence on attempt ${a.generation}: ${e.kind}`);
  }
  for (const e of attempts ? attempts.evidence || [] : []) add(e.created_at, `Evidence: ${e.kind}`);
  const res = t.resolution;
  if (res && typeof res === "object") {
    add(res.at || res.resolved_at || t.state_changed_at, `Resolved by an operator: ${res.action || "?"}${res.note ? ` — “${res.note}”` : ""}`);
  }
  add(t.finished_at, `Finished ${t.state}`);
  entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return h("section", { "aria-labelledby": "timeline-h" }, h("h2", { id: "timeline-h" }, "Timeline"),
    h("ol", { class: "timeline" }, entries.map(([at, what]) => h("li", {}, time(at), " ", what))));
}
