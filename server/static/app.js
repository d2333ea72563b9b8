// RouteRAG "see why": ask with a streamed trace, search every mode side by side, draw the evidence subgraph, and
// list, add and delete an index's documents (with their jobs' progress).
// Plain JavaScript, no dependencies. Every API call sends the key typed on the page (kept in sessionStorage only),
// and the page builds its DOM with textContent, never with HTML from the server.
"use strict";

const KEY_STORE = "routerag.apiKey";
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// -- small helpers ------------------------------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  return node;
}

function fmt(x, digits = 3) {
  return Number(x).toFixed(digits);
}

function status(message, kind = "info") {
  const box = $("status");
  box.textContent = message;
  box.className = message ? kind : "";
}

// -- the API: every call carries the key ------------------------------------------------------------------------------

class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function apiKey() {
  return sessionStorage.getItem(KEY_STORE) || "";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function withIndex(body) {
  const index = $("index").value;
  return index ? { ...body, index } : body;
}

async function failure(resp) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body && body.error) message = body.error.message;
  } catch (_) { /* not JSON: keep the status line */ }
  if (resp.status === 401) {
    return new APIError(401, `The server refused the API key (401: ${message}). Enter the server's key above.`);
  }
  return new APIError(resp.status, `${resp.status}: ${message}`);
}

async function call(method, path, body) {
  const resp = await fetch(path, { method, headers: headers(), body: body ? JSON.stringify(body) : undefined });
  if (!resp.ok) throw await failure(resp);
  return resp;
}

function indexQuery(params = {}) {
  const index = $("index").value;
  const query = new URLSearchParams(index ? { ...params, index } : params);
  return query.toString() ? `?${query}` : "";
}

async function callRaw(method, path, body) {  // multipart uploads: the browser sets the Content-Type
  const h = headers();
  delete h["Content-Type"];
  const resp = await fetch(path, { method, headers: h, body });
  if (!resp.ok) throw await failure(resp);
  return resp;
}

async function post(path, body) {
  return (await call("POST", path, withIndex(body))).json();
}

function report(err) {
  status(err instanceof APIError ? err.message : `Error: ${err.message || err}`, "error");
}

// -- Server-Sent Events over fetch (EventSource can neither POST nor send headers) -------------------------------------

async function* sseEvents(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let carry = "";  // a "\r" at the end of a chunk may be the first half of "\r\n"
  for (;;) {
    const { value, done } = await reader.read();
    let text = carry + (done ? decoder.decode() : decoder.decode(value, { stream: true }));
    carry = !done && text.endsWith("\r") ? "\r" : "";
    if (carry) text = text.slice(0, -1);
    buffer += text.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = parseBlock(block);
      if (event) yield event;
    }
    if (done) {
      const last = parseBlock(buffer);
      if (last) yield last;
      return;
    }
  }
}

function parseBlock(block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;  // comments (keep-alive pings)
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { name, data: JSON.parse(data.join("\n")) } : null;
}

// -- ask ----------------------------------------------------------------------------------------------------------------

function traceItem(kind, ...children) {
  const item = el("li", { class: `step step-${kind}` }, el("span", { class: "tag" }, kind), ...children);
  $("trace").append(item);
  return item;
}

function passageText(text) {  // collapsed to its first words; a click shows the whole passage
  const short = text.length > 90 ? `${text.slice(0, 90)}…` : text;
  return el("details", { class: "passage-text" }, el("summary", {}, short), el("p", {}, text));
}

function docItem(doc, query, mode, k) {
  const item = el("li", { class: "doc", "data-id": doc.id },
    el("span", { class: "doc-title" }, doc.title), " ", el("span", { class: "score" }, fmt(doc.score, 4)));
  if (mode === "graph" || mode === "hybrid") {
    const why = el("button", { type: "button", class: "small why", title: "the graph behind this result" }, "why?");
    why.addEventListener("click", () => openExplain(query, mode, k, doc.id));
    item.append(" ", why);
  }
  item.append(passageText(doc.text));
  return item;
}

function showCited(id) {  // a citation's passage in the trace: opened, marked and scrolled to
  const docs = [...document.querySelectorAll("#trace .doc")].filter((d) => d.dataset.id === id);
  for (const d of document.querySelectorAll("#trace .doc.cited")) d.classList.remove("cited");
  for (const d of docs) {
    d.classList.add("cited");
    d.querySelector("details").open = true;
  }
  if (docs.length) docs[0].scrollIntoView({ behavior: "smooth", block: "center" });
}

async function ask(question, mode) {
  $("trace").replaceChildren();
  $("answer").hidden = true;
  const button = $("ask-button");
  button.disabled = true;
  status("Asking…");
  let search = null;
  try {
    const resp = await call("POST", "/ask", withIndex({ question, mode, stream: true }));
    for await (const { name, data } of sseEvents(resp)) {
      if (name === "think") {
        traceItem("think", data.text);
      } else if (name === "search") {
        search = data;
        traceItem("search", `[${data.mode}] ${data.query}`);
      } else if (name === "information") {
        const query = search ? search.query : question;
        const docs = el("ol", { class: "docs" }, ...data.docs.map((d) => docItem(d, query, data.mode, data.docs.length)));
        traceItem("information", `${data.docs.length} documents (${data.mode}, ${fmt(data.retrieval_ms, 1)} ms)`, docs);
      } else if (name === "draft") {  // the policy's own answer: labelled, as the final one may differ
        traceItem("draft", data.text ?? "(not written: the reader answers)", el("span", { class: "meta" }, " the policy's draft"
          + (data.forced ? ", forced" : "") + (data.refused ? ", a refusal" : "")));
      } else if (name === "answer") {
        traceItem("final", data.text ?? "(none)", el("span", { class: "meta" }, ` the final answer, by the ${data.answered_by}`));
      } else if (name === "done") {
        showAnswer(data);
        status("");
      } else if (name === "error") {
        status(`The question failed: ${data.error.message}`, "error");
      }
    }
  } catch (err) {
    report(err);
  } finally {
    button.disabled = false;
  }
}

function showAnswer(done) {
  $("answer-text").textContent = done.answer ?? "(no answer)";
  $("answer-by").textContent = `by the ${done.answered_by}`;
  const differs = done.draft != null && done.draft !== done.answer;
  $("answer-draft").hidden = !differs;
  $("answer-draft-text").textContent = differs ? done.draft : "";
  $("answer-meta").textContent = `${done.finish} · ${done.searches} search(es) · retrieval ${fmt(done.retrieval_ms, 1)} ms`
    + ` · generation ${fmt(done.generation_ms, 1)} ms · total ${fmt(done.total_ms, 1)} ms`;
  const list = $("citations");
  list.replaceChildren(...done.citations.map((c) => {
    const link = el("a", { href: "#", class: "cite-link doc-title", title: "show the passage in the trace" }, c.title);
    link.addEventListener("click", (event) => { event.preventDefault(); showCited(c.id); });
    return el("li", { class: "citation", "data-id": c.id }, link, ": ", c.sentence);
  }));
  if (!done.citations.length) list.append(el("li", { class: "meta" }, "no retrieved passage states the answer"));
  $("answer").hidden = false;
}

// -- search every mode --------------------------------------------------------------------------------------------------

async function searchAll(query, k) {
  status("Searching…");
  const columns = [...document.querySelectorAll("#search-results .column")];
  for (const column of columns) column.querySelector("ol").replaceChildren();
  try {
    await Promise.all(columns.map(async (column) => {
      const mode = column.dataset.mode;
      const body = await post("/retrieve", { queries: [query], topk: k, mode, return_scores: true });
      column.querySelector("ol").replaceChildren(...body.result[0].map(({ document: d, score }) => {
        return docItem({ ...d, score }, query, mode, k);
      }));
    }));
    status("");
  } catch (err) {
    report(err);
  }
}

// -- the evidence subgraph ----------------------------------------------------------------------------------------------

async function openExplain(query, mode, k, focusId) {
  status("Explaining…");
  try {
    const found = await post("/explain", { query, mode, k });
    drawExplanation(found, focusId);
    status("");
    $("explain-panel").scrollIntoView({ behavior: "smooth", block: "start" });
  } catch (err) {
    report(err);
  }
}

function drawExplanation(found, focusId) {
  $("explain-panel").hidden = false;
  $("explain-panel").dataset.open = "yes";
  $("explain-title").textContent = `${found.mode} search for “${found.query}” (${found.index})`;
  const byId = new Map(found.nodes.map((n) => [n.id, n]));
  const focusNode = found.paths.find((p) => found.docs[p.rank - 1] && found.docs[p.rank - 1].id === focusId);
  drawGraph(found, byId, focusNode ? focusNode.node : null);

  $("seed-facts").replaceChildren(...found.facts.map((f) => el("li", { class: "seed-fact" },
    `${f.subject} — ${f.relation} → ${f.object} `, el("span", { class: "seed-weight" }, fmt(f.score)))));
  if (!found.facts.length) $("seed-facts").append(el("li", { class: "meta" }, "no fact matched"));

  const seeds = found.nodes.filter((n) => n.kind === "entity" && n.seed_weight > 0)
    .sort((a, b) => b.seed_weight - a.seed_weight);
  $("seed-entities").replaceChildren(...seeds.map((n) => el("li", { class: "seed-entity", "data-id": String(n.id) },
    `${n.label} `, el("span", { class: "seed-weight" }, fmt(n.seed_weight)), ` (${n.seed_from.join(", ")}; mass ${fmt(n.mass)})`)));
  if (!seeds.length) $("seed-entities").append(el("li", { class: "meta" }, "no entity seed: dense seeds only"));

  const paths = $("paths");
  paths.replaceChildren();
  for (const passage of found.paths) {
    const item = el("li", { class: passage.node === (focusNode && focusNode.node) ? "passage focus" : "passage" },
      el("span", { class: "doc-title" }, passage.title));
    const list = el("ul");
    for (const path of passage.paths) {
      const text = path.nodes.map((id) => (byId.get(id) || { label: String(id) }).label).join(" → ");
      const row = el("li", { class: "path", "data-nodes": path.nodes.join(",") }, text, " ",
        el("span", { class: "score" }, `score ${fmt(path.score, 4)}`));
      row.addEventListener("mouseenter", () => highlight(path.nodes, true));
      row.addEventListener("mouseleave", () => highlight(path.nodes, false));
      list.append(row);
    }
    if (!passage.paths.length) list.append(el("li", { class: "meta" }, "no path from an entity seed within the limits"));
    item.append(list);
    paths.append(item);
  }

  const notes = [`${found.nodes.length} of ${found.graph.nodes} graph nodes drawn (limit ${found.limits.max_nodes})`,
    `${found.edges.length} edges`, `${fmt(found.ms, 0)} ms`];
  if (found.truncated) {
    const left = Object.entries(found.omitted).filter(([, n]) => n > 0).map(([what, n]) => `${n} ${what}`);
    notes.push(`left out by the limits: ${left.join(", ")}`);
  }
  if (found.fallback) notes.push(`seeding: ${found.fallback}`);
  $("explain-note").textContent = notes.join(" · ");
}

function drawGraph(found, byId, focus) {
  const svg = $("graph");
  svg.replaceChildren();
  const [W, H, PAD] = [960, 600, 40];
  const at = (n) => [PAD + n.x * (W - 2 * PAD), PAD + n.y * (H - 2 * PAD)];
  const heaviest = Math.max(...found.nodes.map((n) => n.mass), 1e-12);
  const size = (n) => 6 + 22 * Math.sqrt(n.mass / heaviest);

  const edges = svgEl("g", { class: "edges" });
  const labels = svgEl("g", { class: "edge-labels" });
  for (const e of found.edges) {
    const a = byId.get(e.source);
    const b = byId.get(e.target);
    const [x1, y1] = at(a);
    const [x2, y2] = at(b);
    const line = svgEl("line", { x1, y1, x2, y2, class: `edge ${e.kind}${e.on_path ? " on-path" : ""}`,
      "data-source": e.source, "data-target": e.target, "data-kind": e.kind });
    const tip = svgEl("title");
    tip.textContent = `${a.label} — ${b.label}: ${e.kinds.join(", ")}${e.relations.length ? ` (${e.relations.join(", ")})` : ""}`
      + ` · weight ${fmt(e.weight, 2)}${e.seed_fact !== null ? ` · seed fact ${fmt(e.seed_fact)}` : ""}`;
    line.append(tip);
    edges.append(line);
    if (e.kind === "relation" && e.relations.length && (e.on_path || e.seed_fact !== null)) {
      const label = svgEl("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, "text-anchor": "middle", class: "edge-label" });
      label.textContent = e.relations.join(", ");
      labels.append(label);
    } else if (e.kind === "synonym") {
      const label = svgEl("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, "text-anchor": "middle", class: "edge-label" });
      label.textContent = "synonym";
      labels.append(label);
    }
  }
  svg.append(edges, labels);

  const nodes = svgEl("g", { class: "nodes" });
  svg.append(nodes);  // in the document first: a label is measured as it is placed
  for (const n of found.nodes) {
    const [x, y] = at(n);
    const r = size(n);
    const classes = ["node", `node-${n.kind}`];
    if (n.seed_weight > 0 && n.kind === "entity") classes.push("seed");
    if (n.rank !== null) classes.push("top");
    if (n.id === focus) classes.push("focus");
    const g = svgEl("g", { class: classes.join(" "), "data-id": n.id, "data-kind": n.kind, "data-mass": n.mass });
    g.append(n.kind === "passage"
      ? svgEl("rect", { x: x - r, y: y - r, width: 2 * r, height: 2 * r, rx: 3 })
      : svgEl("circle", { cx: x, cy: y, r }));
    const name = svgEl("text", { x: x + r + 4, y: y + 4, class: "node-label" });
    name.textContent = n.rank !== null ? `#${n.rank} ${n.label}` : n.label;
    g.append(name);
    if (n.seed_weight > 0 && n.kind === "entity") {
      const weight = svgEl("text", { x: x + r + 4, y: y + 17, class: "seed-weight" });
      weight.textContent = `seed ${fmt(n.seed_weight)}`;
      g.append(weight);
    }
    const tip = svgEl("title");
    tip.textContent = `${n.kind} ${n.label} · PageRank mass ${fmt(n.mass, 4)}`
      + (n.seed_weight > 0 ? ` · seed weight ${fmt(n.seed_weight)} (${n.seed_from.join(", ")})` : "");
    g.append(tip);
    nodes.append(g);
    for (const text of g.querySelectorAll("text")) {  // past the right edge: the label goes left of its vertex
      if (x + r + 4 + text.getComputedTextLength() > W - 2) {
        text.setAttribute("x", x - r - 4);
        text.setAttribute("text-anchor", "end");
      }
    }
  }
  keepInside(svg, W, H);
}

function keepInside(svg, W, H) {
  // every label whole inside the drawing (edge labels and long vertex labels can still cross an edge)
  for (const text of svg.querySelectorAll("text")) {
    const box = text.getBBox();
    const dx = box.x < 2 ? 2 - box.x : Math.min(0, W - 2 - (box.x + box.width));
    const dy = box.y < 2 ? 2 - box.y : Math.min(0, H - 2 - (box.y + box.height));
    if (dx) text.setAttribute("x", Number(text.getAttribute("x")) + dx);
    if (dy) text.setAttribute("y", Number(text.getAttribute("y")) + dy);
  }
}

function highlight(ids, on) {
  const set = new Set(ids.map(String));
  for (const g of document.querySelectorAll("#graph .node")) {
    if (set.has(g.dataset.id)) g.classList.toggle("hl", on);
  }
  for (let i = 0; i + 1 < ids.length; i++) {
    const [a, b] = [String(ids[i]), String(ids[i + 1])];
    for (const line of document.querySelectorAll("#graph .edge")) {
      const [s, t] = [line.dataset.source, line.dataset.target];
      if ((s === a && t === b) || (s === b && t === a)) line.classList.toggle("hl", on);
    }
  }
}

// -- the key and the index list -----------------------------------------------------------------------------------------

async function loadIndexes() {
  const select = $("index");
  try {
    const body = await (await call("GET", "/indexes")).json();
    const names = body.indexes.map((i) => i.name);
    const current = select.value;
    select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (names.includes(current)) select.value = current;
    status(names.length ? `Key accepted: ${names.length} index(es) available.` : "This key may use no index.",
      names.length ? "info" : "error");
  } catch (err) {
    select.replaceChildren(el("option", { value: "" }, "(none)"));
    report(err);
  }
}

// -- documents: list, search, upload, delete, and the jobs that do it ----------------------------------------------------

const DOC_PAGE = 20;
const docs = { offset: 0, q: "" };

async function loadDocuments() {
  try {
    const resp = await call("GET", `/documents${indexQuery({ offset: docs.offset, limit: DOC_PAGE, q: docs.q })}`);
    const page = await resp.json();
    $("doc-list").replaceChildren(...page.documents.map(documentRow));
    const last = Math.min(page.offset + page.documents.length, page.total);
    $("doc-count").textContent = page.total
      ? `${page.offset + 1}–${last} of ${page.total}${page.q ? ` matching “${page.q}”` : ""} in ${page.index}`
      : `none${page.q ? ` matching “${page.q}”` : ""} in ${page.index}`;
    $("doc-prev").disabled = page.offset === 0;
    $("doc-next").disabled = last >= page.total;
  } catch (err) {
    report(err);
  }
}

function documentRow(doc) {
  const remove = el("button", { type: "button", class: "small delete", title: "delete this document" }, "delete");
  remove.addEventListener("click", () => deleteDocument(doc));
  return el("tr", { class: "document", "data-id": doc.id }, el("td", { class: "doc-id" }, doc.id),
    el("td", {}, el("span", { class: "doc-title" }, doc.title), passageText(doc.text)), el("td", {}, remove));
}

async function deleteDocument(doc) {
  if (!window.confirm(`Delete “${doc.title}” (${doc.id}) from the index?`)) return;
  try {
    const accepted = await (await call("DELETE", `/documents/${encodeURIComponent(doc.id)}${indexQuery()}`)).json();
    followJob(accepted.job, `delete ${doc.id}`);
  } catch (err) {
    report(err);
  }
}

async function uploadDocuments() {
  const file = $("doc-file").files[0];
  if (!file) return;
  const form = new FormData();
  form.append("file", file, file.name);
  $("doc-upload").disabled = true;
  try {
    const accepted = await (await callRaw("POST", `/documents${indexQuery()}`, form)).json();
    $("doc-file").value = "";
    followJob(accepted.job, `add ${file.name}`);
  } catch (err) {
    report(err);
  } finally {
    $("doc-upload").disabled = false;
  }
}

function jobText(job) {
  const counts = Object.entries(job.counts || {}).map(([what, n]) => `${n} ${what}`).join(", ");
  return `${job.state}${counts ? ` · ${counts}` : ""}${job.error ? ` · ${job.error}` : ""}`;
}

async function followJob(id, what) {
  // one line per job, polled until it is done or failed; the list is reloaded when the new version serves
  const state = el("span", { class: "job-state" }, "queued");
  const item = el("li", { class: "job", "data-job": id }, `${what} `, el("span", { class: "meta" }, `(${id}) `), state);
  $("doc-jobs").prepend(item);
  status(`Job ${id} queued: ${what}.`);
  for (;;) {
    let job;
    try {
      job = await (await call("GET", `/jobs/${encodeURIComponent(id)}`)).json();
    } catch (err) {
      report(err);
      return;
    }
    state.textContent = jobText(job);
    state.className = `job-state state-${job.state}`;
    item.dataset.state = job.state;
    if (job.state === "done" || job.state === "failed") {
      status(job.state === "done" ? `Job ${id} done: ${what}.` : `Job ${id} failed: ${job.error}`,
        job.state === "done" ? "info" : "error");
      loadDocuments();
      return;
    }
    await new Promise((resolve) => setTimeout(resolve, 400));
  }
}

function showTab(name) {
  for (const tab of document.querySelectorAll("#tabs .tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  for (const panel of document.querySelectorAll("main > [data-view]")) {
    const explainClosed = panel.id === "explain-panel" && !panel.dataset.open;
    panel.hidden = panel.dataset.view !== name || explainClosed;
  }
  if (name === "documents") loadDocuments();
}

function init() {
  $("api-key").value = apiKey();
  for (const tab of document.querySelectorAll("#tabs .tab")) {
    tab.addEventListener("click", () => showTab(tab.dataset.tab));
  }
  $("explain-close").addEventListener("click", () => {
    $("explain-panel").hidden = true;
    delete $("explain-panel").dataset.open;
  });
  $("doc-search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    docs.q = $("doc-search").value.trim();
    docs.offset = 0;
    loadDocuments();
  });
  $("doc-prev").addEventListener("click", () => { docs.offset = Math.max(0, docs.offset - DOC_PAGE); loadDocuments(); });
  $("doc-next").addEventListener("click", () => { docs.offset += DOC_PAGE; loadDocuments(); });
  $("doc-upload-form").addEventListener("submit", (event) => {
    event.preventDefault();
    uploadDocuments();
  });
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORE, $("api-key").value.trim());
    loadIndexes();
  });
  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    ask($("question").value, $("ask-mode").value);
  });
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    searchAll($("search-query").value, Number($("search-k").value) || 3);
  });
  if (apiKey()) loadIndexes();
  else status("Enter the server's API key (leave it empty for a server without keys), then “Use key”.");
}

document.addEventListener("DOMContentLoaded", init);
