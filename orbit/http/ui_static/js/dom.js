// DOM helpers. Every piece of data reaches the page through text nodes or attributes set
// with DOM APIs: nothing here (or anywhere in the console) assigns HTML strings, and the
// Content-Security-Policy enforces Trusted Types so an HTML sink would throw anyway.

/**
 * Create an element: h("a", {href: "#/x", class: "link", onclick: fn}, "text", child).
 * Attribute values are set with setAttribute (or as event listeners for on*); children
 * are nodes or strings (strings become text nodes); null/undefined/false are skipped and
 * arrays are flattened.
 */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:")
    ? document.createElementNS("http://www.w3.org/2000/svg", tag.slice(4))
    : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (value === true) {
      el.setAttribute(name, "");
    } else {
      el.setAttribute(name, String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings, arrays; null/false skipped). */
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Remove every child of `el`. */
export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/**
 * Replace the content of `region` with `children`, keeping keyboard focus: the focused
 * element's data-focus-key (if any) is looked up in the new content and focused again.
 */
export function replaceKeepingFocus(region, children) {
  const active = document.activeElement;
  const key = active && region.contains(active) ? active.dataset.focusKey : undefined;
  clear(region);
  append(region, [children]);
  if (key) {
    const again = region.querySelector(`[data-focus-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
}

/** A <table> with a caption, header cells (scope=col) and rows of cells. */
export function table({ caption, columns, rows, className = "grid", empty = "Nothing to show." }) {
  const thead = h("thead", {}, h("tr", {}, columns.map((c) =>
    h("th", { scope: "col", class: c.className, title: c.title }, c.label))));
  const body = h("tbody");
  if (rows.length === 0) {
    body.append(h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty)));
  }
  for (const row of rows) body.append(row);
  return h("table", { class: className }, caption ? h("caption", {}, caption) : null, thead, body);
}

/** A <dl> from [label, value] pairs (value: node or text; null rows skipped). */
export function deflist(pairs, className = "facts") {
  const dl = h("dl", { class: className });
  for (const pair of pairs) {
    if (!pair) continue;
    const [label, value] = pair;
    dl.append(h("div", {}, h("dt", {}, label), h("dd", {}, value ?? "—")));
  }
  return dl;
}

/** A labelled form control: <div class=field><label for=id>…</label>control</div>. */
export function field(label, control, hint) {
  const hintEl = hint ? h("span", { class: "hint", id: control.id + "-hint" }, hint) : null;
  if (hintEl) control.setAttribute("aria-describedby", hintEl.id);
  return h("div", { class: "field" }, h("label", { for: control.id }, label), control, hintEl);
}

let idCounter = 0;
/** A unique element id with a readable prefix. */
export function uid(prefix = "el") {
  idCounter += 1;
  return `${prefix}-${idCounter}`;
}
