// Schedule controls on the schedule page: trigger now, backfill a past range, delete. Each
// control is a disclosure; while one is open the live refresh holds (data-hold).

import { ApiError, nsPath, request, serves } from "./api.js";
import { field, h, uid } from "./dom.js";

const TEMPLATE = "/v1/namespaces/{ns}/schedules/{name}";

/** 32 random hex characters (crypto.getRandomValues also works outside secure contexts). */
function randomKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** An RFC 3339 UTC text (seconds precision) of a Date. */
function rfc(date) {
  return date.toISOString().replace(/\.\d{3}Z$/, "Z");
}

function holding(details) {
  details.addEventListener("toggle", () => details.toggleAttribute("data-hold", details.open));
  return details;
}

function failure(e) {
  return e instanceof ApiError ? `Failed (${e.status} ${e.code}): ${e.describe()}` : `Failed: ${e.message}`;
}

async function run(button, status, announce, fn, done) {
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  try {
    const result = await fn();
    window.dispatchEvent(new Event("orbit:changed"));
    const msg = done(result);
    status.className = "ok";
    status.textContent = msg;
    announce(msg);
    return result;
  } catch (e) {
    status.className = "error";
    status.textContent = failure(e);
    announce(status.textContent);
    return undefined;
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
  }
}

/**
 * The controls of schedule `name` (its view `schedule`). Results go to `status` (an element
 * that survives the page's refreshes); `onChanged()` refreshes the page, `onDeleted()` leaves
 * it. Returns the disclosures.
 */
export function scheduleControls(name, schedule, { status, announce, onChanged, onDeleted }) {
  const out = [];

  if (serves("POST", `${TEMPLATE}/trigger`)) {
    // One key per opening of the form: a repeated click (or a retried request) never fires
    // twice; closing and opening the form again makes a new run possible.
    let key = randomKey();
    const go = h("button", { type: "button", "data-focus-key": "sched-trigger" }, "Fire now");
    const details = holding(h("details", { class: "confirm" }, h("summary", {}, "Trigger now…"),
      h("p", {}, "Creates one occurrence now with the current version's task, even while the "
        + "schedule is paused and whatever its overlap policy."), go));
    details.addEventListener("toggle", () => { if (details.open) key = randomKey(); });
    go.addEventListener("click", async () => {
      const r = await run(go, status, announce,
        () => request("POST", nsPath("schedules", name, "trigger"), { body: { idempotency_key: key } }),
        (res) => res.data.replayed
          ? `Already triggered: task ${res.data.occurrence.task_id.slice(0, 12)}…`
          : `Triggered: task ${res.data.occurrence.task_id.slice(0, 12)}… created`);
      if (r) { details.open = false; details.removeAttribute("data-hold"); await onChanged(); }
    });
    out.push(details);
  }

  if (serves("POST", `${TEMPLATE}/backfill`)) {
    const now = new Date();
    const from = h("input", { id: uid("bf-from"), type: "text", required: true, spellcheck: "false",
      value: rfc(new Date(now.getTime() - 86400000)), class: "mono" });
    const to = h("input", { id: uid("bf-to"), type: "text", required: true, spellcheck: "false",
      value: rfc(now), class: "mono" });
    const go = h("button", { type: "submit" }, "Backfill");
    const form = h("form", { class: "backfill-form", novalidate: true, "aria-label": `Backfill schedule ${name}` },
      h("p", {}, "Creates the task of every fire time in [from, to) that has not run yet (at most "
        + "1,000). Fire times that already ran are left alone, so a repeat is harmless."),
      field("From (UTC, inclusive)", from, "RFC 3339, e.g. 2026-11-01T00:00:00Z"),
      field("To (UTC, exclusive)", to, "Ends at the schedule's covered-until at the latest"),
      go);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = { from: from.value.trim(), to: to.value.trim() };
      const r = await run(go, status, announce,
        () => request("POST", nsPath("schedules", name, "backfill"), { body }),
        (res) => `Backfilled: ${res.data.count} tasks created, ${res.data.already_occurred} fire times had run already (up to ${res.data.to})`);
      if (r) { details.open = false; details.removeAttribute("data-hold"); await onChanged(); }
    });
    const details = holding(h("details", { class: "resolve" }, h("summary", {}, "Backfill…"), form));
    out.push(details);
  }

  if (serves("DELETE", TEMPLATE)) {
    const go = h("button", { type: "button", class: "danger", "data-focus-key": "sched-delete" }, "Yes, delete this schedule");
    const details = holding(h("details", { class: "confirm" }, h("summary", {}, "Delete schedule…"),
      h("p", {}, "Nothing fires any more and the name becomes free. Its occurrences and the tasks "
        + "they created stay as history."), go));
    go.addEventListener("click", async () => {
      const r = await run(go, status, announce,
        () => request("DELETE", nsPath("schedules", name), { headers: { "If-Match": `"${schedule.revision}"` } }),
        () => `Schedule ${name} deleted`);
      if (r) onDeleted();
    });
    out.push(details);
  }
  return out;
}
