// NEEDS_REVIEW inbox: tasks an operator must decide (retry / succeed / fail with a note).

import { get, nsPath } from "../api.js";
import { field, h, uid } from "../dom.js";
import { jsonInline, num, shortId, state, time } from "../format.js";
import { resolveForm } from "../resolve.js";
import { liveRegion, missing } from "../widgets.js";

export function mount(ctx) {
  ctx.setTitle("Review inbox");
  const { root, query } = ctx;
  root.append(h("h1", {}, "Review inbox"),
    h("p", { class: "lede" }, "Tasks in NEEDS_REVIEW: an attempt was lost while running (its effect is "
      + "uncertain) or the task needs a decision. Check the evidence, then retry it, mark it "
      + "succeeded or failed — with a note for the audit trail."));
  if (missing(root, "The review inbox", ["GET", "/v1/namespaces/{ns}/tasks"],
    ["POST", "/v1/namespaces/{ns}/tasks/{id}/resolve"])) return {};

  const queue = query.get("queue") || "";
  const queueInput = h("input", { id: uid("rq"), type: "text", value: queue, autocomplete: "off", spellcheck: "false" });
  const form = h("form", { class: "filters", role: "search", "aria-label": "Inbox filter", novalidate: true },
    field("Queue (optional)", queueInput), h("div", { class: "form-actions" }, h("button", { type: "submit" }, "Filter")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = queueInput.value.trim();
    ctx.navigate(q ? `#/review?queue=${encodeURIComponent(q)}` : "#/review");
  });
  root.append(form);

  async function load() {
    const r = await get(nsPath("tasks"), { query: { state: "NEEDS_REVIEW", queue, limit: 100 }, signal: ctx.signal });
    return { key: r.text, items: r.data.items, more: Boolean(r.data.next_cursor), json: r.json };
  }

  function render({ items, more, json }) {
    if (items.length === 0) return h("p", { class: "empty-state" }, "Nothing needs review. ✓");
    const list = h("ul", { class: "cards", "aria-label": "Tasks needing review" });
    items.forEach((t, i) => {
      list.append(h("li", { class: "card" },
        h("div", { class: "card-head" },
          h("h2", {}, h("a", { href: `#/tasks/${t.id}`, class: "mono", "aria-label": `Task ${t.id}` }, shortId(t.id))),
          state(t.state),
          t.effect_uncertain ? h("span", { class: "flag" }, "⚠ effect uncertain") : null),
        h("p", { class: "small" },
          `${t.queue} · ${t.kind} · attempts ${num(t.attempts)}/${num(t.max_attempts)} · since `, time(t.state_changed_at, { relative: true })),
        h("p", { class: "small" }, "Last error: ", jsonInline(json.raw("items", i, "error"), t.error, 120)),
        resolveForm(t, { announce: ctx.announce, onDone: async () => { live.invalidate(); await live.refresh(); } })));
    });
    return [h("p", { class: "muted" }, `${items.length}${more ? "+" : ""} tasks need review.`), list];
  }

  const live = liveRegion(root, { load, render, label: "Tasks needing review" });
  return { refresh: live.refresh };
}
