// The resolve form of a NEEDS_REVIEW task (retry / succeed / fail, with a required note).

import { ApiError, nsPath, post } from "./api.js";
import { field, h, uid } from "./dom.js";
import { spans } from "./json.js";

const ACTIONS = [
  ["retry", "Retry", "run it again (a new attempt)"],
  ["succeed", "Mark succeeded", "with an optional result"],
  ["fail", "Mark failed", "with an optional error object"],
];

/**
 * A disclosure with the resolve form. While it is open the view's live refresh holds
 * (data-hold), so typing is never interrupted. `onDone(task)` runs after a success.
 */
export function resolveForm(task, { announce, onDone, open = false }) {
  const name = uid("action");
  const radios = ACTIONS.map(([value, label, hint], i) => {
    const id = uid(`act-${value}`);
    return h("div", { class: "radio" },
      h("input", { type: "radio", name, id, value, checked: i === 0 }),
      h("label", { for: id }, label, h("span", { class: "muted" }, ` — ${hint}`)));
  });
  const note = h("textarea", { id: uid("note"), rows: "2", maxlength: "2000", required: true });
  const result = h("textarea", { id: uid("result"), rows: "3", class: "mono", spellcheck: "false", placeholder: "{\"ok\": true}" });
  const error = h("textarea", { id: uid("error"), rows: "3", class: "mono", spellcheck: "false", placeholder: "{\"type\": \"ManualFail\", \"message\": \"…\"}" });
  const resultField = field("Result (JSON, sent exactly as typed)", result);
  const errorField = field("Error (JSON object)", error);
  const status = h("p", { role: "status", class: "action-status" });
  const submit = h("button", { type: "submit" }, "Resolve task");
  const form = h("form", { class: "resolve-form", novalidate: true, "aria-label": `Resolve task ${task.id}` },
    h("fieldset", {}, h("legend", {}, "Decision"), radios),
    field("Note (required: why, for the audit trail)", note),
    resultField, errorField, status, submit);
  const chosen = () => form.querySelector(`input[name="${name}"]:checked`).value;
  const sync = () => {
    resultField.hidden = chosen() !== "succeed";
    errorField.hidden = chosen() !== "fail";
  };
  form.addEventListener("change", sync);
  sync();

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const action = chosen();
    const fail = (msg, el) => { status.className = "error"; status.textContent = msg; el.focus(); };
    if (!note.value.trim()) return fail("Write a note: it is recorded with the decision.", note);
    let body = `{"action":${JSON.stringify(action)},"note":${JSON.stringify(note.value.trim())}`;
    if (action === "succeed" && result.value.trim()) {
      try { spans(result.value.trim()); JSON.parse(result.value); } catch {
        return fail("The result is not valid JSON.", result);
      }
      body += `,"result":${result.value.trim()}`; // exact text: numbers are not re-encoded
    }
    if (action === "fail" && error.value.trim()) {
      let parsed;
      try { parsed = JSON.parse(error.value); } catch { parsed = null; }
      if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
        return fail("The error must be a JSON object.", error);
      }
      body += `,"error":${JSON.stringify(parsed)}`;
    }
    body += "}";
    submit.disabled = true;
    try {
      const r = await post(nsPath("tasks", task.id, "resolve"), body);
      window.dispatchEvent(new Event("orbit:changed"));
      status.className = "ok";
      status.textContent = `Resolved (${action}): the task is now ${r.data.state}.`;
      announce(`Task ${task.id.slice(0, 12)} resolved (${action}); now ${r.data.state}`);
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

  const details = h("details", { class: "resolve" },
    h("summary", {}, "Resolve…"), form);
  details.addEventListener("toggle", () => {
    if (details.open) details.setAttribute("data-hold", "");
    else details.removeAttribute("data-hold");
  });
  if (open) details.open = true;
  return details;
}
