// The re-run form of a FAILED or CANCELLED task (a note is required; optionally more than
// one further attempt). While it is open the view's live refresh holds (data-hold).

import { ApiError, nsPath, post } from "./api.js";
import { field, h, uid } from "./dom.js";

/** A disclosure with the re-run form. `onDone(task)` runs after a success. */
export function rerunForm(task, { announce, onDone }) {
  const note = h("textarea", { id: uid("rerun-note"), rows: "2", maxlength: "2000", required: true });
  const attempts = h("input", { id: uid("rerun-attempts"), type: "number", min: "1", max: "1000", value: "1", inputmode: "numeric" });
  const status = h("p", { role: "status", class: "action-status" });
  const submit = h("button", { type: "submit" }, "Re-run task");
  const form = h("form", { class: "resolve-form", novalidate: true, "aria-label": `Re-run task ${task.id}` },
    h("p", {}, `The task goes back to WAITING with a new generation (attempt ${task.attempts + 1}); `
      + "its attempts stay in its history."),
    field("Note (required: why, kept on the task and in the audit trail)", note),
    field("Further attempts allowed", attempts, "at least this many more (1 to 1000)"),
    status, submit);
  const details = h("details", { class: "resolve" }, h("summary", {}, "Re-run…"), form);
  details.addEventListener("toggle", () => details.toggleAttribute("data-hold", details.open));

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const fail = (msg, el) => { status.className = "error"; status.textContent = msg; el.focus(); };
    if (!note.value.trim()) return fail("Write a note: it is recorded with the re-run.", note);
    const n = Number(attempts.value);
    if (!Number.isInteger(n) || n < 1 || n > 1000) return fail("Further attempts: a whole number from 1 to 1000.", attempts);
    submit.disabled = true;
    try {
      const r = await post(nsPath("tasks", task.id, "retry"), { note: note.value.trim(), attempts: n });
      window.dispatchEvent(new Event("orbit:changed"));
      status.className = "ok";
      status.textContent = `Re-run: the task is now ${r.data.state}.`;
      announce(`Task ${task.id.slice(0, 12)} re-run; now ${r.data.state}`);
      details.removeAttribute("data-hold");
      details.open = false;
      if (onDone) onDone(r.data);
    } catch (err) {
      status.className = "error";
      status.textContent = err instanceof ApiError
        ? `Failed (${err.status} ${err.code}): ${err.describe()}` : `Failed: ${err.message}`;
      announce(status.textContent);
    } finally {
      submit.disabled = false;
    }
    return undefined;
  });
  return details;
}
