// Workflows: definitions and versions (with the step graph of a version), and instances
// with their step graph coloured by state, history, and pause/resume/cancel.

import { get, nsPath, post, serves, session } from "../api.js";
import { deflist, h, table } from "../dom.js";
import { jsonBlock, jsonInline, num, shortId, state, time } from "../format.js";
import { act, liveRegion, lookupForm, missing } from "../widgets.js";

const HEX32 = "[0-9a-f]{32}";
const definitionCache = new Map(); // "ns/name@version" -> {def, text} (versions never change)

export function mount(ctx) {
  if (ctx.instance) return instance(ctx, ctx.params[0]);
  const [name] = ctx.params;
  return name ? workflow(ctx, name) : list(ctx);
}

function instanceLookup() {
  return lookupForm({ kind: "instance", label: "Instance id", pattern: HEX32, hint: "32 hex characters",
    hrefOf: (id) => `#/instances/${id}` });
}

function list(ctx) {
  ctx.setTitle("Workflows");
  const { root } = ctx;
  root.append(h("h1", {}, "Workflows"),
    h("p", { class: "lede" }, "Workflow definitions with their immutable versions, and running or finished instances."));
  const canInstances = serves("GET", "/v1/namespaces/{ns}/instances/{id}");
  if (canInstances) root.append(h("h2", {}, "Open an instance"), instanceLookup());
  if (missing(root, "The workflow list", ["GET", "/v1/namespaces/{ns}/workflows"])) return {};
  const withInstances = serves("GET", "/v1/namespaces/{ns}/instances");
  const stateFilter = INSTANCE_STATES.includes(ctx.query.get("state")) ? ctx.query.get("state") : "";
  const live = liveRegion(root, {
    label: "Workflows",
    load: async () => {
      const [r, inst] = await Promise.all([
        get(nsPath("workflows"), { query: { limit: 200 }, signal: ctx.signal }),
        withInstances ? get(nsPath("instances"), { query: { state: stateFilter, limit: 50 }, signal: ctx.signal }).catch(() => null) : null,
      ]);
      return { key: r.text + (inst ? inst.text : ""), items: r.data.items, inst };
    },
    render: ({ items, inst }) => [h("h2", {}, "Definitions"), h("div", { class: "table-wrap" }, table({
      caption: "Workflows by name",
      columns: [{ label: "Workflow" }, { label: "Latest version", className: "num" }, { label: "Created (UTC)" }, { label: "Updated (UTC)" }],
      rows: items.map((w) => h("tr", {},
        h("th", { scope: "row" }, h("a", { href: `#/workflows/${encodeURIComponent(w.name)}` }, w.name)),
        h("td", { class: "num" }, num(w.latest_version)),
        h("td", {}, time(w.created_at)), h("td", {}, time(w.updated_at)))),
      empty: "No workflow published in this namespace.",
    })),
    inst ? [h("h2", {}, "Recent instances"), instanceStateFilter(ctx, stateFilter), instancesTable(inst.data.items, true)] : null],
  });
  return { refresh: live.refresh };
}

const INSTANCE_STATES = ["RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"];

function instanceStateFilter(ctx, current) {
  const select = h("select", { id: "instance-state", onchange: (e) => {
    ctx.navigate(e.target.value ? `#/workflows?state=${e.target.value}` : "#/workflows");
  } }, h("option", { value: "" }, "Any state"), INSTANCE_STATES.map((s) => h("option", { value: s, selected: s === current }, s)));
  return h("div", { class: "field inline-field" }, h("label", { for: "instance-state" }, "Instance state"), select);
}

async function definitionOf(name, version, signal) {
  const key = `${session.namespace}/${name}@${version}`;
  if (!definitionCache.has(key)) {
    const r = await get(nsPath("workflows", name, "versions", String(version)), { signal });
    const text = r.json.raw("definition");
    definitionCache.set(key, { def: JSON.parse(text), text });
  }
  return definitionCache.get(key);
}

function workflow(ctx, name) {
  ctx.setTitle(`Workflow ${name}`);
  const { root } = ctx;
  root.append(h("p", { class: "crumbs" }, h("a", { href: "#/workflows" }, "Workflows"), " / ", name));
  if (missing(root, "Workflow details", ["GET", "/v1/namespaces/{ns}/workflows/{name}"])) return {};
  const versionParam = Number(ctx.query.get("version")) || null;
  const withInstances = serves("GET", "/v1/namespaces/{ns}/instances");

  async function load() {
    const w = await get(nsPath("workflows", name), { signal: ctx.signal });
    const version = versionParam || w.data.latest_version;
    const [def, inst] = await Promise.all([
      serves("GET", "/v1/namespaces/{ns}/workflows/{name}/versions/{version}")
        ? definitionOf(name, version, ctx.signal).catch(() => null) : null,
      withInstances ? get(nsPath("instances"), { query: { workflow: name, limit: 50 }, signal: ctx.signal }).catch(() => null) : null,
    ]);
    return { key: w.text + version + (inst ? inst.text : ""), w: w.data, version, def, inst };
  }

  function render({ w, version, def, inst }) {
    return [
      h("h1", {}, `Workflow ${w.name}`),
      deflist([["Latest version", num(w.latest_version)], ["Owner", h("span", { class: "mono" }, w.owner_id)],
        ["Created", time(w.created_at)], ["Updated", time(w.updated_at)]]),
      h("h2", {}, "Versions"),
      h("div", { class: "table-wrap" }, table({
        caption: "Newest first; a version never changes",
        columns: [{ label: "Version", className: "num" }, { label: "Steps", className: "num" }, { label: "Digest" }, { label: "Published (UTC)" }],
        rows: w.versions.map((v) => h("tr", { class: v.version === version ? "selected" : null },
          h("th", { scope: "row", class: "num" }, h("a", {
            href: `#/workflows/${encodeURIComponent(name)}?version=${v.version}`,
            "aria-current": v.version === version ? "true" : null,
          }, `v${v.version}`)),
          h("td", { class: "num" }, num(v.step_count)),
          h("td", { class: "mono small" }, String(v.digest).slice(0, 16) + "…"),
          h("td", {}, time(v.created_at)))),
      })),
      h("h2", {}, `Step graph of version ${version}`),
      def ? stepGraph(def.def, null) : h("p", { class: "muted" }, "The definition of this version is not available."),
      def ? jsonBlock(`Definition v${version}`, def.text) : null,
      h("h2", {}, "Instances"),
      inst ? instancesTable(inst.data.items) : [
        h("p", { class: "muted" }, "This server cannot list instances of a workflow; open one by id."),
        serves("GET", "/v1/namespaces/{ns}/instances/{id}") ? instanceLookup() : h("p", { class: "muted" }, "Instances are not available on this server."),
      ],
    ];
  }

  const live = liveRegion(root, { load, render, label: `Workflow ${name}` });
  return { refresh: live.refresh };
}

function instancesTable(items, withWorkflow = false) {
  return h("div", { class: "table-wrap" }, table({
    caption: "Instances, newest first",
    columns: [{ label: "Instance" }, withWorkflow ? { label: "Workflow" } : null, { label: "State" }, { label: "Version", className: "num" }, { label: "Business key" }, { label: "Created (UTC)" }, { label: "Finished (UTC)" }].filter(Boolean),
    rows: items.map((i) => h("tr", {},
      h("th", { scope: "row" }, h("a", { href: `#/instances/${i.id}`, class: "mono", "aria-label": `Instance ${i.id}` }, shortId(i.id))),
      withWorkflow ? h("td", {}, h("a", { href: `#/workflows/${encodeURIComponent(i.workflow)}` }, i.workflow)) : null,
      h("td", {}, state(i.state), i.paused ? [" ", state("PAUSED")] : null),
      h("td", { class: "num" }, num(i.version)),
      h("td", {}, i.business_key ?? "—"),
      h("td", {}, time(i.created_at)), h("td", {}, time(i.finished_at)))),
    empty: "No instance yet.",
  }));
}

function instance(ctx, id) {
  ctx.setTitle(`Instance ${id.slice(0, 12)}`);
  const { root } = ctx;
  root.append(h("p", { class: "crumbs" }, h("a", { href: "#/workflows" }, "Workflows"), " / instance ", h("span", { class: "mono" }, id)));
  if (missing(root, "Workflow instances", ["GET", "/v1/namespaces/{ns}/instances/{id}"])) return {};
  const withHistory = serves("GET", "/v1/namespaces/{ns}/instances/{id}/history");
  const status = h("p", { class: "action-status", role: "status" });

  async function load() {
    const [inst, hist] = await Promise.all([
      get(nsPath("instances", id), { signal: ctx.signal }),
      withHistory ? get(nsPath("instances", id, "history"), { query: { limit: 200 }, signal: ctx.signal }).catch(() => null) : null,
    ]);
    const d = inst.data;
    const def = await definitionOf(d.workflow, d.version, ctx.signal).catch(() => null);
    return { key: inst.text + (hist ? hist.text : ""), inst, hist, def };
  }

  function control(label, verb, d, cls = "secondary") {
    if (!serves("POST", `/v1/namespaces/{ns}/instances/{id}/${verb}`)) return null;
    return h("button", { type: "button", class: cls, "data-focus-key": `inst-${verb}`,
      onclick: async (e) => {
        await act(e.currentTarget, status, ctx.announce, () => post(nsPath("instances", id, verb)),
          () => `Instance ${verb === "cancel" ? "cancelled" : verb === "pause" ? "paused" : "resumed"}`);
        live.invalidate(); await live.refresh();
      } }, label);
  }

  function render({ inst, hist, def }) {
    const d = inst.data;
    const running = d.state === "RUNNING";
    const steps = new Map((d.steps || []).map((s) => [s.step, s]));
    return [
      h("h1", {}, "Instance ", h("span", { class: "mono" }, shortId(d.id)), " ", state(d.state), d.paused ? [" ", state("PAUSED")] : null),
      running ? h("div", { class: "actions" },
        d.paused ? control("Resume instance", "resume", d, "") : control("Pause instance", "pause", d),
        control("Cancel instance", "cancel", d, "danger")) : null,
      status,
      deflist([
        ["Workflow", h("a", { href: `#/workflows/${encodeURIComponent(d.workflow)}?version=${d.version}` }, `${d.workflow} v${d.version}`)],
        ["Business key", d.business_key ?? "—"],
        ["Owner", h("span", { class: "mono" }, d.owner_id)],
        ["Created", time(d.created_at)], ["Finished", time(d.finished_at)],
      ]),
      h("h2", {}, "Step graph"),
      legend(),
      def ? stepGraph(def.def, steps) : stepList(d.steps || []),
      h("section", { class: "json-grid", "aria-label": "Input, output and error" },
        jsonBlock("Input", inst.json.raw("input"), d.input),
        jsonBlock("Output", inst.json.raw("output"), d.output),
        jsonBlock("Error", inst.json.raw("error"), d.error)),
      hist ? history(hist.data) : h("p", { class: "muted" }, "History is not available on this server."),
    ];
  }

  const live = liveRegion(root, { load, render, label: `Instance ${id}` });
  return { refresh: live.refresh };
}

function legend() {
  return h("p", { class: "legend small" }, "States: ",
    ["RUNNING", "SUCCEEDED", "FAILED", "TIMED_OUT", "CANCELLED", "NOT_REACHED"].map((s) => [state(s), " "]));
}

const EDGES = [["next", "next"], ["on_failure", "on failure"], ["on_timeout", "on timeout"], ["on_exhausted", "on exhausted"], ["default", "default"]];

/**
 * The step graph as nested ordered lists: each sequence in order, a parallel's branches
 * nested under it, jumps written as edges. With `steps` (an instance's step runs by id)
 * every step shows its state; unreached steps are NOT_REACHED.
 */
export function stepGraph(def, steps) {
  const seq = (list) => h("ol", { class: "graph" }, list.map((s) => stepItem(s, steps)));
  function stepItem(s, runs) {
    const run = runs ? runs.get(s.id) : null;
    const st = runs ? (run ? run.state : "NOT_REACHED") : null;
    const edges = [];
    for (const [key, label] of EDGES) if (s[key]) edges.push(`${label} → ${s[key]}`);
    for (const c of s.cases || []) if (c.next) edges.push(`case → ${c.next}`);
    if (s.end) edges.push("end");
    const detail = [s.queue ? `${s.queue}/${s.kind}` : null, s.signal ? `signal “${s.signal}”` : null,
      s.parallel ? `joins ${s.parallel}` : null].filter(Boolean).join(" · ");
    const li = h("li", { class: `step${st ? ` step-${st}` : ""}`, "aria-current": st === "RUNNING" ? "step" : null },
      h("div", { class: "step-box" },
        st ? state(st) : null,
        h("strong", { class: "mono" }, s.id), " ", h("span", { class: "tag" }, s.type),
        detail ? h("span", { class: "small muted" }, ` ${detail}`) : null,
        run && run.activations > 1 ? h("span", { class: "small" }, ` · ${run.activations} activations`) : null,
        edges.length ? h("span", { class: "edges small" }, ` ${edges.join(" · ")}`) : null));
    if (s.type === "parallel" && Array.isArray(s.branches)) {
      li.append(h("ul", { class: "branches" }, s.branches.map((b, i) =>
        h("li", {}, h("span", { class: "branch-name" }, `Branch ${b.name || i + 1}`), seq(b.steps || [])))));
    }
    return li;
  }
  return seq(def.steps || []);
}

function stepList(steps) {
  return h("ol", { class: "graph" }, steps.map((s) => h("li", { class: `step step-${s.state}` },
    h("div", { class: "step-box" }, state(s.state), " ", h("strong", { class: "mono" }, s.step), " ", h("span", { class: "tag" }, s.type),
      s.next_step ? h("span", { class: "edges small" }, ` → ${s.next_step}`) : null))));
}

function history(data) {
  return [
    h("h2", {}, "History"),
    h("div", { class: "table-wrap" }, table({
      caption: "Steps, activations and waits by sequence",
      columns: [{ label: "Seq", className: "num" }, { label: "At (UTC)" }, { label: "Entry" }, { label: "Step" }, { label: "State" }, { label: "Detail" }],
      rows: (data.items || []).map((e) => h("tr", {},
        h("td", { class: "num" }, num(e.seq)), h("td", {}, time(e.at)), h("td", {}, e.entry),
        h("td", { class: "mono" }, e.step), h("td", {}, state(e.state)),
        h("td", { class: "small" }, [e.type, e.kind, e.next_step ? `→ ${e.next_step}` : null].filter(Boolean).join(" · ") || "—",
          e.task_id ? [" · ", h("a", { href: `#/tasks/${e.task_id}`, class: "mono", "aria-label": `Task ${e.task_id}` }, shortId(e.task_id))] : null))),
      empty: "No history yet.",
    })),
    (data.transitions || []).length ? [h("h3", {}, "Transitions"), h("ol", { class: "timeline" },
      data.transitions.map((t) => h("li", {}, time(t.at), ` ${t.step} —${t.outcome}→ ${t.to ?? "end"}`)))] : null,
    (data.signals || []).length ? [h("h3", {}, "Signals"), table({
      columns: [{ label: "Received (UTC)" }, { label: "Name" }, { label: "Signal id" }, { label: "Correlation" }, { label: "Matched" }, { label: "Payload" }],
      rows: data.signals.map((s) => h("tr", {}, h("td", {}, time(s.received_at)), h("td", {}, s.name),
        h("td", { class: "small" }, s.signal_id), h("td", {}, s.correlation_key ?? "—"),
        h("td", {}, s.matched_at ? time(s.matched_at) : "waiting"), h("td", {}, jsonInline(undefined, s.payload)))),
    })] : null,
  ];
}
