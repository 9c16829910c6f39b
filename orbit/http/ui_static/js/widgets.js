// Shared pieces of views: error and "not available" panels, buttons with a busy state,
// lookup forms for resources that have no list endpoint, and the view-level loader.

import { ApiError, serves, session } from "./api.js";
import { field, h, replaceKeepingFocus, uid } from "./dom.js";

/** A panel for an error thrown while loading a view. */
export function errorPanel(e) {
  if (e instanceof ApiError && e.unavailable) return unavailablePanel();
  if (e instanceof ApiError && e.status === 403) {
    return h("p", { class: "notice", role: "alert" },
      `This key may not do this (403 forbidden): ${e.describe()}`);
  }
  return h("p", { class: "error", role: "alert" },
    e instanceof ApiError ? `The server answered ${e.status} ${e.code}: ${e.describe()}` : String(e.message || e));
}

/** "Not available on this server": the API of a view is missing (404/405 route). */
export function unavailablePanel(what = "This view") {
  return h("div", { class: "notice unavailable", role: "note" },
    h("h2", {}, "Not available on this server"),
    h("p", {}, `${what} needs API routes this server does not serve (it answers 404/405 `
      + "for them). The other views keep working; upgrade the server to use this one."));
}

/** True (and renders the notice into `root`) when the server lacks every template. */
export function missing(root, what, ...templates) {
  if (templates.every(([m, t]) => serves(m, t))) return false;
  root.append(unavailablePanel(what));
  return true;
}

/**
 * Run `fn` for a button click: disables the button meanwhile, announces `done(result)`, and
 * reports errors in `status` (an element with role=status/alert) and to screen readers.
 */
export async function act(button, status, announce, fn, done) {
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  try {
    const result = await fn();
    window.dispatchEvent(new Event("orbit:changed"));
    const msg = done ? done(result) : "Done";
    if (status) { status.className = "ok"; status.textContent = msg; }
    announce(msg);
    return result;
  } catch (e) {
    const msg = e instanceof ApiError ? `Failed (${e.status} ${e.code}): ${e.describe()}` : `Failed: ${e.message}`;
    if (status) { status.className = "error"; status.textContent = msg; }
    announce(msg);
    return undefined;
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
  }
}

/**
 * A form to open a resource by name or id when the server has no list endpoint for it; the
 * names typed are remembered for this tab (session storage), shown as quick links.
 */
export function lookupForm({ kind, label, hrefOf, pattern, hint }) {
  const input = h("input", { id: uid(kind), type: "text", required: true, autocomplete: "off",
    spellcheck: "false", pattern });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const form = h("form", { class: "lookup", novalidate: true },
    field(label, input, hint), h("button", { type: "submit" }, "Open"), error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const value = input.value.trim();
    if (!value || (pattern && !new RegExp(`^(?:${pattern})$`).test(value))) {
      error.hidden = false;
      error.textContent = `Enter a valid ${label.toLowerCase()}.`;
      input.focus();
      return;
    }
    session.remember(kind, value);
    window.location.hash = hrefOf(value);
  });
  const recent = session.recent(kind);
  const links = recent.length
    ? h("nav", { class: "recent", "aria-label": `Recently opened ${kind}` },
      h("span", { class: "muted" }, "Recent: "),
      recent.map((n) => h("a", { href: hrefOf(n) }, n)))
    : null;
  return h("div", { class: "lookup-wrap" }, form, links);
}

/**
 * The usual view body: a region refreshed from `load()` (data) and `render(data)` (nodes),
 * skipping the DOM work when the answer's text did not change. Returns {region, refresh}.
 */
export function liveRegion(root, { load, render, label, onUnavailable }) {
  const region = h("div", { class: "live-region", "aria-label": label, "aria-busy": "true" });
  root.append(region);
  let lastKey = null;
  async function refresh() {
    let result;
    try {
      result = await load();
    } catch (e) {
      if (e instanceof DOMException && e.name === "AbortError") return;
      if (lastKey === null || (e instanceof ApiError && (e.unavailable || e.status === 404 || e.status === 403))) {
        if (e instanceof ApiError && e.unavailable && onUnavailable) onUnavailable();
        replaceKeepingFocus(region, errorPanel(e));
        lastKey = `error:${e.status}`;
        region.setAttribute("aria-busy", "false");
        return;
      }
      throw e; // keep the last good data; the shell shows a refresh error
    }
    // A form opened while this answer was on its way (data-hold): keep it; the next refresh
    // after it closes renders the new data.
    if (region.querySelector("[data-hold]")) return;
    const key = result && result.key !== undefined ? result.key : JSON.stringify(result);
    const stale = document.querySelector("#view > .refresh-error");
    if (stale) stale.remove();
    if (key === lastKey) return;
    lastKey = key;
    replaceKeepingFocus(region, render(result));
    region.setAttribute("aria-busy", "false");
  }
  return { region, refresh, invalidate: () => { lastKey = null; } };
}
