// Retention: the namespace's retention windows (how long finished tasks, events and audit
// events are kept, how long Idempotency-Key records are remembered) and the purge's
// progress; a form replaces the windows with If-Match of the revision shown. Needs `admin`.

import { ApiError, get, nsPath, request } from "../api.js";
import { deflist, field, h, uid } from "../dom.js";
import { time } from "../format.js";
import { errorPanel, missing } from "../widgets.js";

const WINDOWS = [
  ["finished_tasks_days", "Finished tasks (days)", "with their attempts, evidence and effect records; empty: kept forever"],
  ["events_days", "Events (days)", "raw events, result events and their deliveries; empty: kept forever"],
  ["audit_days", "Audit events (days)", "at least 7 and never shorter than events; empty: kept forever"],
  ["idempotency_hours", "Idempotency keys (hours)", "1–720; empty: the server default (24 h)"],
];

function shown(value, unit) {
  return value === null || value === undefined ? "kept forever" : `${value} ${unit}`;
}

export function mount(ctx) {
  ctx.setTitle("Retention");
  const { root } = ctx;
  root.append(h("h1", {}, "Retention"),
    h("p", { class: "lede" }, "How long this namespace keeps its history, and what the purge has removed."));
  if (missing(root, "The retention view", ["GET", "/v1/namespaces/{ns}/retention"])) return {};
  const body = h("div", { "aria-live": "polite" });
  root.append(body);

  async function refresh() {
    let r;
    try {
      r = await get(nsPath("retention"), { signal: ctx.signal });
    } catch (e) {
      if (ctx.signal.aborted) return;
      body.replaceChildren(errorPanel(e));
      return;
    }
    render(r.data);
  }

  function render(s) {
    const facts = deflist([
      ["Finished tasks", shown(s.finished_tasks_days, "days")],
      ["Events and deliveries", shown(s.events_days, "days")],
      ["Audit events", shown(s.audit_days, "days")],
      ["Idempotency keys", s.idempotency_hours == null ? "server default (24 hours)" : `${s.idempotency_hours} hours`],
      ["Rows purged", String(s.purged_total)],
      ["Last purge pass", s.last_run_at ? time(s.last_run_at) : "never"],
      ["Revision", String(s.revision)],
    ]);
    const inputs = Object.fromEntries(WINDOWS.map(([name]) => [name, h("input", {
      id: uid(`r-${name}`), type: "number", min: "1", step: "1", inputmode: "numeric",
      value: s[name] ?? "", autocomplete: "off",
    })]));
    const status = h("p", { role: "status" });
    const save = h("button", { type: "submit" }, "Save windows");
    const form = h("form", { class: "filters", "aria-label": "Retention windows", novalidate: true },
      WINDOWS.map(([name, label, hint]) => field(label, inputs[name], hint)),
      h("div", { class: "form-actions" }, save), status);
    // While the windows are being edited the live refresh leaves the view alone.
    form.addEventListener("input", () => form.setAttribute("data-hold", ""));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const next = {};
      for (const [name] of WINDOWS) {
        const v = inputs[name].value.trim();
        next[name] = v === "" ? null : Number(v);
      }
      save.disabled = true;
      try {
        const r = await request("PUT", nsPath("retention"), { body: next, headers: { "If-Match": `"${s.revision}"` } });
        render(r.data);
        const msg = `Saved (revision ${r.data.revision})`;
        body.querySelector("p[role=status]").textContent = msg;
        ctx.announce(msg);
      } catch (err) {
        const msg = err instanceof ApiError
          ? `Failed (${err.status} ${err.code}): ${err.describe()}` : `Failed: ${err.message}`;
        status.className = "error";
        status.textContent = msg;
        ctx.announce(msg);
      } finally {
        save.disabled = false;
      }
    });
    body.replaceChildren(facts, h("h2", {}, "Change the windows"), form);
  }

  refresh();
  return { refresh };
}
