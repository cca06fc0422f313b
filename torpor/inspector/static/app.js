// The Torpor inspector page. Plain DOM, no framework, no build step.
// Every value from the server (thread ids, model text, tool output) is written with
// textContent or as an attribute value, never parsed as markup.
"use strict";

const TOKEN = document.querySelector('meta[name="torpor-token"]').content;
const PAGE = 50;
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, String(v));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function when(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 23) : "";
}

function threadLink(id) {
  const a = el("a", { href: "#thread=" + encodeURIComponent(id), class: "thread-link" }, id);
  a.dataset.thread = id;
  return a;
}

// --- the threads list -------------------------------------------------------------------

const list = { offset: 0, total: 0, stream: null, timer: null };

async function loadThreads() {
  const params = new URLSearchParams({ q: $("q").value, status: $("status").value,
                                       offset: String(list.offset), limit: String(PAGE) });
  const response = await fetch("/api/threads?" + params);
  const page = await response.json();
  if (!response.ok) { $("range").textContent = page.error; return; }
  list.total = page.total;
  showFeed(page);
  const body = $("threads").tBodies[0];
  body.replaceChildren(...page.rows.map((row) => {
    const tr = el("tr", {},
      el("td", {}, threadLink(row.thread_id)),
      el("td", { class: "status status-" + row.status }, row.status, row.reason ? " (" + row.reason + ")" : ""),
      el("td", {}, row.model || ""), el("td", {}, row.tenant || ""),
      el("td", {}, row.parent ? threadLink(row.parent) : ""),
      el("td", {}, row.pending_calls.length || ""), el("td", {}, row.approvals.length || ""),
      el("td", { class: "when" }, when(row.last_activity)));
    tr.dataset.thread = row.thread_id;
    return tr;
  }));
  const last = Math.min(list.offset + PAGE, list.total);
  $("range").textContent = list.total ? `${list.offset + 1}–${last} of ${list.total}` : "no threads";
}

function showFeed(state) {
  $("feed").textContent = state.feed_error ? "feed stopped: " + state.feed_error
    : state.caught_up ? state.count + " threads, live" : "reading the topics…";
  $("feed").className = state.feed_error ? "error" : "";
}

function openList() {
  if (list.stream) return;
  list.stream = new EventSource("/api/threads/stream");
  list.stream.addEventListener("changed", (e) => {
    showFeed(JSON.parse(e.data));
    clearTimeout(list.timer);  // many changes at once: ask once
    list.timer = setTimeout(loadThreads, 250);
  });
}

// --- the processor's lag and instances ------------------------------------------------------
// Polled every few seconds while the list shows (the server samples the broker on its own
// schedule; this only reads its last sample). The chart is an inline SVG drawn here.

const LAG_POLL_MS = 3000;
const WINDOW_S = 600;
const SVG = "http://www.w3.org/2000/svg";
const lag = { timer: null };

// The x axis spans from the oldest sample kept (at least a minute, at most the window) to
// the last sample: a page opened a minute ago draws a minute, not a sliver of ten.
function sparkline(samples, now) {
  const peak = Math.max(0, ...samples.map((s) => s[1]));
  const width = 240, height = 32, top = Math.max(1, peak);  // all zeros: a flat line at the bottom
  const oldest = samples.length ? samples[0][0] : now;
  const span = Math.min(WINDOW_S * 1000, Math.max(60 * 1000, now - oldest));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("role", "img");
  const x = (t) => (width * (t - (now - span)) / span).toFixed(1);
  const y = (v) => (height - 2 - (height - 4) * v / top).toFixed(1);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", samples.map((s) => x(s[0]) + "," + y(s[1])).join(" "));
  svg.append(line);
  if (samples.length) {  // the last sample as a dot: one sample alone draws no line
    const [t, v] = samples[samples.length - 1];
    const dot = document.createElementNS(SVG, "circle");
    dot.setAttribute("cx", x(t));
    dot.setAttribute("cy", y(v));
    dot.setAttribute("r", "2");
    svg.append(dot);
  }
  const title = document.createElementNS(SVG, "title");
  title.textContent = samples.length + " samples over " + Math.round(span / 1000) + " s, highest lag " + peak;
  svg.append(title);
  return el("span", { class: "chart" }, svg, el("span", { class: "peak" }, "peak " + peak + ", " +
    Math.round(span / 1000) + " s"));
}

async function loadLag() {
  if ($("list-view").hidden) return;
  let body;
  try {
    const response = await fetch("/api/lag?window=" + WINDOW_S);
    body = await response.json();
    if (!response.ok) { showLagState(body.error, true); return; }
  } catch (error) {
    showLagState("the inspector does not answer", true);
    return;
  }
  $("lag-group").textContent = "(group " + body.group + ", " + body.group_state + ")";
  if (body.error) showLagState("cannot read the lag now: " + body.error + " (shown: the last sample; retrying)", true);
  else if (body.at === null) showLagState("sampling…", false);
  else showLagState("total lag " + body.total_lag + " · sampled " + when(body.at), false);
  const now = body.at || Date.now();
  $("lag").tBodies[0].replaceChildren(...body.partitions.map((p) => {
    const tr = el("tr", { class: p.lag ? "behind" : "caught-up" },
      el("td", {}, p.partition), el("td", {}, p.owner || "unassigned"),
      el("td", {}, p.committed === null ? "none" : p.committed), el("td", {}, p.end),
      el("td", { class: "lag" }, p.lag),
      el("td", {}, sparkline(body.series[String(p.partition)] || [], now)));
    tr.dataset.partition = String(p.partition);
    tr.dataset.lag = String(p.lag);
    return tr;
  }));
  $("members").tBodies[0].replaceChildren(...body.members.map((m) => {
    const tr = el("tr", {}, el("td", {}, m.name), el("td", {}, m.partitions.join(", ")),
      el("td", {}, m.client_id), el("td", {}, m.host), el("td", { class: "member-id" }, m.member_id));
    tr.dataset.instance = m.name;
    return tr;
  }));
}

function showLagState(text, failed) {
  $("lag-state").textContent = text;
  $("lag-state").className = failed ? "error" : "";
}

function watchLag() {
  if (lag.timer) return;
  loadLag();
  lag.timer = setInterval(loadLag, LAG_POLL_MS);
}

// --- one thread ---------------------------------------------------------------------------

const view = { id: null, stream: null, pending: new Map(), summaryTimer: null, actionable: null };

function blocksText(blocks) {
  return (blocks || []).map((b) => b.type === "TextBlock" || b.type === "ThinkingBlock" ? b.text
    : "[" + b.type + "]").join(" ");
}

function entryText(entry) {
  const b = entry.body;
  switch (b.type) {
    case "UserEntry": return "user: " + blocksText(b.content);
    case "AssistantEntry": return "assistant: " + blocksText(b.content) + b.tool_calls.map(
      (c) => "\n  call " + c.name + " " + c.arguments + " [" + c.call_id + "]").join("");
    case "ToolResultEntry": return "result " + b.name + " " + (b.ok ? "ok" : "error") + " [" + b.call_id + "]: "
      + blocksText(b.content);
    case "EventEntry": return "event " + b.kind + " from " + b.original_tool_name + ": " + blocksText(b.content);
    case "SummaryEntry": return "summary up to #" + b.up_to_seq + ": " + b.text;
    default: return JSON.stringify(b);
  }
}

function addEvent(event) {
  if (event.ephemeral) {
    $("partial").textContent = event.kind === "completion_retried" ? "" : $("partial").textContent + (event.text || "");
    return;
  }
  if (["completion_requested", "turn_committed", "interrupted"].includes(event.kind)) $("partial").textContent = "";
  const text = event.entry ? "#" + event.entry.seq + " " + entryText(event.entry)
    : [event.text, event.data].filter((x) => x).join(" ");
  const li = el("li", {}, el("span", { class: "when" }, when(event.created_at)),
                el("span", { class: "kind" }, event.kind), text);
  li.dataset.kind = event.kind;
  if (event.entry) {
    li.dataset.seq = event.entry.seq;
    li.append(" ", forkButton(event.entry.seq));
  }
  $("timeline").append(li);
  if (event.kind === "child_spawned" || event.kind.startsWith("approval") || event.kind === "tool_dispatched"
      || event.kind === "tool_result" || ["stopped", "parked", "resumed", "unparked", "closed"].includes(event.kind)) {
    refreshSummary();
  }
}

function addReceipt(r) {
  const tr = el("tr", {},
    el("td", { class: "when" }, when(r.created_at)), el("td", {}, r.input_id),
    el("td", { class: r.disposition.startsWith("rejected") ? "rejected" : r.disposition },
       r.disposition, r.reason ? " (" + r.reason + ")" : ""),
    el("td", {}, r.provenance),
    el("td", {}, r.input_partition === null ? "" : r.input_partition + ":" + r.input_offset),
    el("td", {}, "v" + r.thread_version),
    el("td", {}, r.history_before.slice(0, 12) + " → " + r.history_after.slice(0, 12)),
    el("td", {}, r.input_offset === null ? "" : travelButton(r.input_partition, r.input_offset)));
  tr.dataset.input = r.input_id;
  $("receipts").tBodies[0].append(tr);
  const action = view.pending.get(r.input_id);
  if (action) {
    action.querySelector(".receipt").textContent = "receipt: " + r.disposition + (r.reason ? " (" + r.reason + ")" : "")
      + " · " + r.provenance + " · v" + r.thread_version;
    action.dataset.disposition = r.disposition;
  }
}

// A new thread whose history is this one's up to entry `seq` (signed like the controls).
function forkButton(seq) {
  const button = el("button", { type: "button", class: "fork", "data-seq": seq }, "fork from here");
  button.addEventListener("click", () => act("fork", { at_seq: seq, new_thread_id: $("fork-as").value || undefined,
                                                       model: $("model").value || undefined }, "fork from #" + seq));
  return button;
}

function travelButton(partition, offset) {
  const button = el("button", { type: "button", class: "travel", "data-offset": offset }, "as of here");
  button.addEventListener("click", () => travel(partition, offset));
  return button;
}

// The thread as it stood after the input at `offset`: re-folded from the inputs by the server.
async function travel(partition, offset) {
  const id = view.id;
  $("past-box").hidden = false;
  $("past-head").textContent = "re-folding the inputs up to " + partition + ":" + offset + "…";
  $("past").replaceChildren();
  const response = await fetch("/api/thread/at?" + new URLSearchParams({ id, offset: String(offset) }),
    { headers: { "X-Torpor-Token": TOKEN } });
  const past = await response.json();
  if (id !== view.id) return;
  if (!response.ok) { $("past-head").textContent = past.error; return; }
  $("past-head").textContent = "after input " + partition + ":" + offset + ": " + past.status + ", "
    + past.history_len + " entries, head " + past.head.slice(0, 12);
  $("past-head").dataset.status = past.status;
  $("past").replaceChildren(...past.entries.map((e) => el("li", {}, entryText(e))));
  $("past-box").scrollIntoView();
}

// A child's history starts with what it inherited from its parent at the spawn, which
// its own events never narrate: say so, rather than that retention removed it.
function inherited(snap) {
  const created = snap.events.find((e) => e.kind === "thread_created");
  let parent = null;
  let fork = null;
  try {
    const data = created && created.data ? JSON.parse(created.data) : {};
    parent = data.parent;
    fork = data.forked_from;
  } catch (e) { parent = null; }
  if (fork) return "forked from " + fork.thread_id + " at entry #" + fork.at_seq + " by " + fork.requested_by;
  const first = snap.entries.length ? snap.entries[0].seq : 0;
  return parent && first > 0 ? "entries before #" + first + " were inherited from the parent " + parent : null;
}

function openThread(id) {
  closeThread();
  view.id = id;
  $("list-view").hidden = true;
  $("thread-view").hidden = false;
  $("thread-title").textContent = id;
  for (const box of ["timeline", "actions", "approvals", "partial", "missing", "past"]) $(box).replaceChildren();
  $("past-box").hidden = true;
  $("receipts").tBodies[0].replaceChildren();
  refreshSummary();
  view.stream = new EventSource("/api/thread/stream?id=" + encodeURIComponent(id));
  view.stream.addEventListener("snapshot", (e) => {
    const snap = JSON.parse(e.data);
    $("timeline").replaceChildren();
    $("receipts").tBodies[0].replaceChildren();
    $("missing").textContent = inherited(snap) || snap.missing || "";
    snap.events.forEach(addEvent);
    $("partial").textContent = snap.partial;
  });
  view.stream.addEventListener("record", (e) => {
    const item = JSON.parse(e.data);
    if (item.undecodable) { $("timeline").append(el("li", { class: "error" }, "undecodable record: " + item.undecodable)); return; }
    if (item.record.type === "Receipt") addReceipt(item.record); else addEvent(item.record);
  });
  view.stream.addEventListener("failed", (e) => {
    $("missing").textContent = JSON.parse(e.data).error;
    view.stream.close();
  });
}

function closeThread() {
  if (view.stream) view.stream.close();
  view.stream = null;
  view.id = null;
  view.actionable = null;
  view.pending.clear();
}

function refreshSummary() {
  clearTimeout(view.summaryTimer);
  view.summaryTimer = setTimeout(loadSummary, 150);
}

async function loadSummary() {
  const id = view.id;
  if (id === null) return;
  const response = await fetch("/api/thread?id=" + encodeURIComponent(id));
  if (id !== view.id) return;
  if (!response.ok) { $("thread-summary").replaceChildren(el("dd", {}, "not seen yet")); return; }
  const s = await response.json();
  const fields = [["status", s.status + (s.reason ? " (" + s.reason + ")" : "")], ["model", s.model],
                  ["tenant", s.tenant], ["created", when(s.created_at)], ["last activity", when(s.last_activity)],
                  ["pending calls", s.pending_calls.join(", ")]];
  $("thread-summary").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v || "")]),
    el("dt", {}, "parent"), el("dd", {}, s.parent ? threadLink(s.parent) : ""));
  $("children").replaceChildren(...(s.children.length ? [el("span", {}, "children: ")] : []),
    ...s.children.map((c) => el("span", { class: "child" }, threadLink(c), " ")));
  // The buttons are drawn again only when what they act on changed: a click never lands
  // on a button that was just replaced.
  const actionable = JSON.stringify([id, s.approvals, s.pending_calls]);
  if (actionable === view.actionable) return;
  view.actionable = actionable;
  $("approvals-box").hidden = s.approvals.length === 0;
  $("approvals").replaceChildren(...s.approvals.map((a) => el("li", { "data-approval": a.approval_id },
    a.prompt + " ", ...a.choices.map((choice) => {
      const button = el("button", { type: "button", "data-choice": choice }, choice);
      button.addEventListener("click", () => act("approve", { approval_id: a.approval_id, choice }, choice));
      return button;
    }))));
  const controls = ["stop", "resume", "park", "unpark", "compact"].map((command) => {
    const button = el("button", { type: "button", "data-command": command }, command);
    button.addEventListener("click", () => act("control", { command }, command));
    return button;
  });
  for (const call of s.pending_calls) {
    const button = el("button", { type: "button", "data-command": "cancel_call" }, "cancel " + call);
    button.addEventListener("click", () => act("control", { command: "cancel_call", call_id: call }, "cancel " + call));
    controls.push(button);
  }
  const setModel = el("button", { type: "button", "data-command": "set_model" }, "set model");
  setModel.addEventListener("click", () => act("control", { command: "set_model", model: $("model").value }, "set_model"));
  controls.push(setModel);
  $("controls").replaceChildren(...controls);
}

async function act(kind, fields, label) {
  const body = { thread_id: view.id, ...fields };
  if ((kind === "control" || kind === "fork") && $("reason").value) body.reason = $("reason").value;
  const li = el("li", {}, label + ": ", el("span", { class: "sent" }, "sending…"), " ", el("span", { class: "receipt" }));
  $("actions").append(li);
  const response = await fetch("/api/" + kind, {
    method: "POST", headers: { "Content-Type": "application/json", "X-Torpor-Token": TOKEN },
    body: JSON.stringify(body) });
  const answer = await response.json();
  if (!response.ok) { li.querySelector(".sent").textContent = "refused: " + answer.error; li.className = "error"; return; }
  li.querySelector(".sent").textContent = "sent as " + answer.source + (answer.signed ? " (signed)" : " (unsigned)")
    + ", message " + answer.message_id;
  li.dataset.message = answer.message_id;
  if (answer.new_thread_id) {  // a fork: its own timeline shows its creation's receipt
    li.dataset.fork = answer.new_thread_id;
    li.append(" new thread: ", threadLink(answer.new_thread_id));
    $("fork-as").value = "";  // that id is taken now: the next fork gets another
  }
  li.querySelector(".receipt").textContent = "awaiting receipt…";
  view.pending.set(answer.message_id, li);
  // A receipt that arrived before the answer (a fast processor) is already in the table.
  const seen = [...$("receipts").tBodies[0].rows].find((r) => r.dataset.input === answer.message_id);
  if (seen) li.querySelector(".receipt").textContent = "receipt: " + seen.cells[2].textContent;
  if (seen) li.dataset.disposition = seen.cells[2].textContent.split(" ")[0];
}

// --- routing --------------------------------------------------------------------------------

function route() {
  const match = /^#thread=(.*)$/.exec(location.hash);
  if (match) { openThread(decodeURIComponent(match[1])); return; }
  closeThread();
  $("thread-view").hidden = true;
  $("list-view").hidden = false;
  openList();
  loadThreads();
  watchLag();
}

function start() {
  fetch("/api/whoami").then((r) => r.json()).then((w) => {
    $("whoami").textContent = w.operator + (w.signed ? " (signed)" : " (unsigned: development mode)") + " · " + w.prefix;
  });
  $("search").addEventListener("submit", (e) => { e.preventDefault(); list.offset = 0; loadThreads(); });
  $("q").addEventListener("input", () => { list.offset = 0; clearTimeout(list.timer); list.timer = setTimeout(loadThreads, 200); });
  $("status").addEventListener("change", () => { list.offset = 0; loadThreads(); });
  $("prev").addEventListener("click", () => { list.offset = Math.max(0, list.offset - PAGE); loadThreads(); });
  $("next").addEventListener("click", () => { if (list.offset + PAGE < list.total) { list.offset += PAGE; loadThreads(); } });
  window.addEventListener("hashchange", route);
  route();
}

start();
