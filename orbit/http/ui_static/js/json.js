// Exact JSON. The API returns business JSON (payloads, results, workflow input/output)
// byte for byte as submitted; JSON.parse would re-encode numbers (1.0 -> 1, big integers
// rounded). These helpers work on the response *text* instead: they find the exact source
// text of any value by path, and pretty-print by re-indenting tokens without touching them.

const WS = new Set([" ", "\t", "\n", "\r"]);

function skipWs(text, i) {
  while (i < text.length && WS.has(text[i])) i += 1;
  return i;
}

function scanString(text, i) {
  // text[i] === '"'; returns the index after the closing quote.
  i += 1;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\") i += 2;
    else if (c === '"') return i + 1;
    else i += 1;
  }
  throw new SyntaxError("unterminated string");
}

function scanLiteral(text, i) {
  const start = i;
  while (i < text.length && !WS.has(text[i]) && !",:]}[{\"".includes(text[i])) i += 1;
  if (i === start) throw new SyntaxError(`unexpected character at ${i}`);
  return i;
}

/**
 * Parse `text` into a span tree: {start, end, type, members?: Map, items?: Array}.
 * `type` is "object", "array", "string" or "literal"; start/end index the source text.
 */
export function spans(text) {
  const [node, end] = scanValue(text, skipWs(text, 0));
  if (skipWs(text, end) !== text.length) throw new SyntaxError("trailing characters");
  return node;
}

function scanValue(text, i) {
  const c = text[i];
  if (c === "{") {
    const members = new Map();
    let j = skipWs(text, i + 1);
    if (text[j] === "}") return [{ start: i, end: j + 1, type: "object", members }, j + 1];
    for (;;) {
      if (text[j] !== '"') throw new SyntaxError(`expected a key at ${j}`);
      const keyEnd = scanString(text, j);
      const key = JSON.parse(text.slice(j, keyEnd));
      j = skipWs(text, keyEnd);
      if (text[j] !== ":") throw new SyntaxError(`expected ':' at ${j}`);
      const [child, after] = scanValue(text, skipWs(text, j + 1));
      if (!members.has(key)) members.set(key, child); // first of duplicate keys, like the DB
      j = skipWs(text, after);
      if (text[j] === ",") { j = skipWs(text, j + 1); continue; }
      if (text[j] === "}") return [{ start: i, end: j + 1, type: "object", members }, j + 1];
      throw new SyntaxError(`expected ',' or '}' at ${j}`);
    }
  }
  if (c === "[") {
    const items = [];
    let j = skipWs(text, i + 1);
    if (text[j] === "]") return [{ start: i, end: j + 1, type: "array", items }, j + 1];
    for (;;) {
      const [child, after] = scanValue(text, j);
      items.push(child);
      j = skipWs(text, after);
      if (text[j] === ",") { j = skipWs(text, j + 1); continue; }
      if (text[j] === "]") return [{ start: i, end: j + 1, type: "array", items }, j + 1];
      throw new SyntaxError(`expected ',' or ']' at ${j}`);
    }
  }
  if (c === '"') {
    const end = scanString(text, i);
    return [{ start: i, end, type: "string" }, end];
  }
  const end = scanLiteral(text, i);
  return [{ start: i, end, type: "literal" }, end];
}

/** The exact source text at `path` (keys and indexes) of a span tree, or undefined. */
export function rawAt(text, tree, path) {
  let node = tree;
  for (const step of path) {
    if (!node) return undefined;
    if (typeof step === "number") node = node.items ? node.items[step] : undefined;
    else node = node.members ? node.members.get(step) : undefined;
  }
  return node ? text.slice(node.start, node.end) : undefined;
}

/**
 * A view of an API response that keeps its text: `.data` is JSON.parse'd (for logic and
 * display of platform fields), `.raw(...path)` is the exact text of a business value.
 */
export class ExactJson {
  constructor(text) {
    this.text = text;
    this.data = text ? JSON.parse(text) : null;
    this._tree = undefined;
  }

  raw(...path) {
    if (this._tree === undefined) {
      try { this._tree = spans(this.text); } catch { this._tree = null; }
    }
    return this._tree ? rawAt(this.text, this._tree, path) : undefined;
  }
}

/**
 * Pretty-print JSON text by re-indenting its tokens: strings and numbers are copied exactly
 * (no re-encoding), so the pretty form shows the same values as the exact text.
 */
export function pretty(text, indent = "  ") {
  let out = "";
  let depth = 0;
  let i = skipWs(text, 0);
  const nl = () => "\n" + indent.repeat(depth);
  while (i < text.length) {
    const c = text[i];
    if (c === "{" || c === "[") {
      const close = c === "{" ? "}" : "]";
      const j = skipWs(text, i + 1);
      if (text[j] === close) { out += c + close; i = j + 1; }
      else { depth += 1; out += c + nl(); i = j; }
      continue;
    }
    if (c === "}" || c === "]") { depth -= 1; out += nl() + c; i = skipWs(text, i + 1); continue; }
    if (c === ",") { out += "," + nl(); i = skipWs(text, i + 1); continue; }
    if (c === ":") { out += ": "; i = skipWs(text, i + 1); continue; }
    const end = c === '"' ? scanString(text, i) : scanLiteral(text, i);
    out += text.slice(i, end);
    i = skipWs(text, end);
  }
  return out;
}

/** Exact text of a value that arrived already parsed (platform fields): JSON.stringify. */
export function stringify(value) {
  return value === undefined ? "" : JSON.stringify(value);
}
