// Workers: the namespace's worker sessions (ACTIVE by default): instance, queues, attempts in
// flight against capacity, heartbeat age, node; the attempts each holds; close a session.

import { nsPath, post, request, serves } from "../api.js";
import { field, h, table, uid } from "../dom.js";
import { num, shortId, state, time } from "../format.js";
import { act, liveRegion, missing } from "../widgets.js";

const STATES = ["ACTIVE", "CLOSED", "EXPIRED", "any"];

function age(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${Math.round(ms / 1000)} s`;
  return `${Math.round(ms / 60000)} min`;
}

export function mount(ctx) {
  ctx.setTitle("Workers");
  const { root, query } = ctx;
  root.append(h("h1", {}, "Workers"),
    h("p", { class: "lede" }, "Connected worker sessions: which process, which queues, how much they hold, when they last heartbeated."));
  if (missing(root, "The workers view", ["GET", "/v1/namespaces/{ns}/workers"])) return {};
  const canClose = serves("POST", "/v1/namespaces/{ns}/workers/{sid}/close");

  const chosen = STATES.includes(query.get("state")) ? query.get("state") : "ACTIVE";
  const queue = query.get("queue") || "";
  const controls = {
    state: h("select", { id: uid("w-state") }, STATES.map((s) => h("option", { value: s, selected: s === chosen }, s === "any" ? "Any state" : s))),
    queue: h("input", { id: uid("w-queue"), type: "text", value: queue, autocomplete: "off", spellcheck: "false", pattern: "[A-Za-z0-9_.\\-]{1,63}" }),
  };
  const form = h("form", { class: "filters", role: "search", "aria-label": "Worker filters", novalidate: true },
    field("State", controls.state), field("Queue", controls.queue, "only sessions of this queue"),
    h("div", { class: "form-actions" }, h("button", { type: "submit" }, "Show")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const params = new URLSearchParams();
    if (controls.state.value !== "ACTIVE") params.set("state", controls.state.value);
    if (controls.queue.value.trim()) params.set("queue", controls.queue.value.trim());
    ctx.navigate(`#/workers${params.size ? `?${params}` : ""}`);
  });
  root.append(form);
  const status = h("p", { class: "action-status", role: "status" });
  root.append(status);

  async function load() {
    const r = await request("GET", nsPath("workers"), {
      query: { state: chosen, queue: queue || undefined, limit: 200 }, signal: ctx.signal,
    });
    return { key: r.text, sessions: r.data.sessions, more: Boolean(r.data.next_cursor) };
  }

  function closer(s) {
    if (!canClose || !s.live) return null;
    const go = h("button", { type: "button", class: "danger", "data-focus-key": `close-${s.id}` }, "Yes, close this session");
    const details = h("details", { class: "confirm" }, h("summary", {}, "Close…"),
      h("p", {}, `Its ${s.offered} offered attempts go back to their queues; its ${s.running} running `
        + "attempts are recovered (retried when retry-safe, else NEEDS_REVIEW). The worker opens a new session."), go);
    details.addEventListener("toggle", () => details.toggleAttribute("data-hold", details.open));
    go.addEventListener("click", async () => {
      const r = await act(go, status, ctx.announce, () => post(nsPath("workers", s.id, "close")),
        (res) => `Session ${s.id.slice(0, 12)}… closed: ${res.data.released_offers} offers released, ${res.data.lost_attempts} running attempts recovered`);
      if (r) { details.open = false; details.removeAttribute("data-hold"); live.invalidate(); await live.refresh(); }
    });
    return details;
  }

  function held(s) {
    if (!s.attempts.length) return "—";
    return h("ul", { class: "plain small" }, s.attempts.map((a) => h("li", {},
      state(a.state), " ", h("a", { href: `#/tasks/${a.task_id}`, class: "mono", "aria-label": `Task ${a.task_id}` }, shortId(a.task_id)),
      ` gen. ${a.generation}`)),
    s.in_flight > s.attempts.length ? h("li", { class: "muted" }, `… ${s.in_flight - s.attempts.length} more`) : null);
  }

  function render({ sessions, more }) {
    return [
      h("div", { class: "table-wrap" }, table({
        caption: `${sessions.length} ${chosen === "any" ? "" : chosen.toLowerCase() + " "}sessions${queue ? ` of queue ${queue}` : ""}`,
        columns: [{ label: "Session" }, { label: "Worker" }, { label: "SDK" }, { label: "Queues" },
          { label: "In flight", className: "num" }, { label: "Attempts" }, { label: "Last heartbeat" },
          { label: "Node" }, { label: "State" }, { label: "" }],
        rows: sessions.map((s) => h("tr", {},
          h("th", { scope: "row", class: "mono", title: s.id }, shortId(s.id)),
          h("td", {}, `${s.instance.host ?? "?"} (pid ${s.instance.pid ?? "?"})`),
          h("td", { class: "small" }, s.sdk ?? "—"),
          h("td", {}, s.queues.map((q, i) => [i ? ", " : "", h("a", { href: `#/tasks?queue=${encodeURIComponent(q)}` }, q)])),
          h("td", { class: "num" }, `${num(s.in_flight)} / ${num(s.capacity)}`),
          h("td", {}, held(s)),
          h("td", { title: s.last_heartbeat_at }, s.live ? `${age(s.heartbeat_age_ms)} ago` : time(s.closed_at || s.expires_at)),
          h("td", { class: "small" }, s.node ?? h("span", { class: "muted" }, "not attached")),
          h("td", {}, state(s.live || s.state !== "ACTIVE" ? s.state : "EXPIRING")),
          h("td", {}, closer(s)))),
        empty: "No worker session.",
      })),
      more ? h("p", { class: "muted" }, "Showing the first 200 sessions.") : null,
    ];
  }

  const live = liveRegion(root, { load, render, label: "Worker sessions" });
  return { refresh: live.refresh };
}
