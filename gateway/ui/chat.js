// The chat page (gateway/ui.py). It streams /v1/chat/completions with
// stream_options.include_spec, so each chunk's "nightjar" field (docs/api.md) says which of
// its tokens were accepted drafts and each engine step's drafter and γ; the planner tab polls
// /ui/api/top (what `nightjar top` shows). Plain browser JavaScript: no build, no library.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { messages: [], busy: false, timer: null };

function headers() {
  const h = { "content-type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.authorization = "Bearer " + key;
  return h;
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function errorText(resp) {
  try {
    const body = await resp.json();
    return `${resp.status}: ${body.error ? body.error.message : JSON.stringify(body)}`;
  } catch (e) {
    return `${resp.status} ${resp.statusText}`;
  }
}

async function loadModels() {
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) return showError(await errorText(resp));
    const select = $("model");
    select.replaceChildren();
    for (const m of (await resp.json()).data) {
      const opt = document.createElement("option");
      opt.value = opt.textContent = m.id;
      select.append(opt);
    }
    if (!select.options.length) showError("no worker serves a model yet: start one, then reload");
  } catch (e) {
    showError(String(e));
  }
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "you" : "assistant";
  div.append(who);
  if (text) div.append(document.createTextNode(text));
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// One answer's speculation: its steps, and which step each output token came from.
class Answer {
  constructor(div) {
    this.div = div;
    this.steps = [];
    this.stepOf = [];
    this.tokens = 0;
    this.drafted = 0;
    this.accepted = 0;
    this.proposed = 0;
    this.first = null;
    this.last = null;
    this.text = "";
    this.lastDrafter = null;
  }

  addSteps(steps) {
    const now = performance.now();
    for (const s of steps) {
      const step = { ...s, n: this.steps.length };
      this.steps.push(step);
      for (let j = 0; j < s.tokens; j++) this.stepOf.push(step);
      this.tokens += s.tokens;
      this.drafted += s.accepted;
      this.accepted += s.accepted;
      this.proposed += s.drafted;
      if (this.first === null) this.first = now;
      this.last = now;
      const box = document.createElement("span");
      box.className = "step " + (s.drafted ? (s.accepted ? "hit" : "miss") : "plain");
      // the drafter's name where it changes (each box's title names it too), then γ and accepted/drafted
      const named = s.drafter && s.drafter !== this.lastDrafter ? `${s.drafter} ` : "";
      if (s.drafter) this.lastDrafter = s.drafter;
      box.textContent = s.drafted ? `${named}γ${s.gamma} ${s.accepted}/${s.drafted}` : `${named}γ${s.gamma}`;
      box.dataset.drafter = s.drafter || "";
      box.dataset.gamma = s.gamma;
      box.title = `step ${step.n + 1}: ${s.tokens} token(s)` +
        (s.drafted ? `, ${s.accepted} of ${s.drafted} drafts by ${s.drafter} accepted (γ ${s.gamma})` : ", nothing drafted");
      $("steps").append(box);
    }
    this.showStats();
  }

  addSpans(spans) {
    for (const sp of spans) {
      const el = document.createElement("span");
      el.className = "tok " + (sp.drafted === true ? "drafted" : sp.drafted === false ? "target" : "unknown");
      el.dataset.token = sp.token;
      const step = this.stepOf[sp.token];
      const what = sp.drafted === true ? "an accepted draft" : sp.drafted === false ? "the target's own token" : "from an earlier attempt";
      el.title = `token ${sp.token}: ${what}` + (step && step.drafter ? ` (step ${step.n + 1}: ${step.drafter}, γ ${step.gamma})` : "");
      el.textContent = sp.text;
      this.div.append(el);
      this.text += sp.text;
    }
  }

  addPlain(text) {
    this.div.append(document.createTextNode(text));
    this.text += text;
  }

  showStats() {
    const drafting = this.steps.filter((s) => s.drafter);
    const lastDraft = drafting.length ? drafting[drafting.length - 1] : null;
    const lastStep = this.steps[this.steps.length - 1];
    $("stat-drafter").textContent = lastDraft ? lastDraft.drafter : "none";
    $("stat-gamma").textContent = lastStep ? String(lastStep.gamma) : "-";
    $("stat-accept").textContent = this.proposed ? `${(100 * this.accepted / this.proposed).toFixed(0)}% (${this.accepted}/${this.proposed})` : "-";
    const secs = this.first !== null && this.last > this.first ? (this.last - this.first) / 1000 : 0;
    // tokens after the first step's, over the time since it: the decode rate
    const after = this.tokens - (this.steps.length ? this.steps[0].tokens : 0);
    $("stat-tps").textContent = secs > 0 ? (after / secs).toFixed(1) : "-";
    $("stat-tokens").textContent = String(this.tokens);
    $("stat-drafted").textContent = String(this.drafted);
    $("stat-steps").textContent = String(this.steps.length);
  }
}

async function* sseData(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

async function send(text) {
  if (state.busy || !text.trim()) return;
  state.busy = true;
  $("send").disabled = true;
  showError("");
  state.messages.push({ role: "user", content: text });
  bubble("user", text);
  const div = bubble("assistant", "");
  div.dataset.done = "false";
  $("steps").replaceChildren();
  const answer = new Answer(div);
  answer.showStats();
  const body = {
    model: $("model").value || undefined,
    messages: state.messages,
    stream: true,
    stream_options: { include_spec: true, include_usage: true },
    max_tokens: Number($("max-tokens").value) || 128,
    temperature: Number($("temperature").value) || 0,
  };
  try {
    const resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!resp.ok) throw new Error(await errorText(resp));
    for await (const data of sseData(resp)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      const choice = chunk.choices && chunk.choices[0];
      if (chunk.nightjar) {
        answer.addSteps(chunk.nightjar.steps);
        answer.addSpans(chunk.nightjar.spans);
      } else if (choice && choice.delta && choice.delta.content) {
        answer.addPlain(choice.delta.content);
      }
      if (choice && choice.finish_reason) div.dataset.finish = choice.finish_reason;
      div.scrollIntoView({ block: "end" });
    }
    state.messages.push({ role: "assistant", content: answer.text });
  } catch (e) {
    showError(String(e.message || e));
    state.messages.pop();
  } finally {
    div.dataset.done = "true";
    state.busy = false;
    $("send").disabled = false;
  }
}

// ------------------------------------------------------------------ planner tab

function cell(row, text, tag = "td") {
  const el = document.createElement(tag);
  el.textContent = text;
  row.append(el);
  return el;
}

const fmt = (x, digits = 2) => (x === null || x === undefined ? "-" : Number(x).toFixed(digits));

function renderTop(top) {
  const d = top.decision;
  $("planner-summary").textContent = d
    ? `policy ${top.policy || d.policy} · decision v${d.version} (${d.policy}), ${d.age_s.toFixed(1)} s old${d.stale ? " — STALE" : ""} · drafter ${d.drafter || "default"} · offload ${d.offload ? "yes" : "no"} · waiting ${top.queue.waiting}, in workers ${top.queue.in_workers}`
    : `policy ${top.policy || "-"} · no decision published yet`;
  const head = document.createElement("tr");
  cell(head, "batch size", "th");
  cell(head, "γ decided", "th");
  for (const w of top.workers) cell(head, `γ run: ${w.worker_id}`, "th");
  $("gamma-table").tHead.replaceChildren(head);
  const rows = [];
  for (const [i, b] of (d ? d.buckets : []).entries()) {
    const tr = document.createElement("tr");
    tr.className = "bucket";
    cell(tr, b.batch);
    cell(tr, String(b.gamma));
    for (const w of top.workers) cell(tr, fmt(w.gamma_run[i] && w.gamma_run[i].run, 1));
    rows.push(tr);
  }
  $("gamma-table").tBodies[0].replaceChildren(...rows);
  const weights = Object.entries(top.weights).sort((a, b) => b[1] - a[1]);
  $("weights").replaceChildren(
    ...(weights.length
      ? weights.map(([name, w]) => {
          const row = document.createElement("div");
          row.className = "weight";
          const label = document.createElement("span");
          label.className = "name";
          label.textContent = `${name} ${w.toFixed(2)}`;
          const bar = document.createElement("span");
          bar.className = "bar";
          bar.style.width = `${Math.round(300 * w)}px`;
          row.append(label, bar);
          return row;
        })
      : [document.createTextNode("the running policy learns no drafter weights")])
  );
  const workers = top.workers.map((w) => {
    const tr = document.createElement("tr");
    for (const v of [
      w.worker_id, w.model, `${w.jobs}/${w.max_jobs}`, w.running, w.waiting,
      w.kv_used === null ? "-" : `${(100 * w.kv_used).toFixed(1)}%`, w.gamma, w.drafter || "-",
      w.draft_resident === null ? "-" : w.draft_resident ? "resident" : "offloaded",
      w.fallback ? "fallback" : `v${w.decision_version}`, fmt(w.tokens_per_s, 0), fmt(w.acceptance),
    ]) cell(tr, String(v));
    return tr;
  });
  $("workers-table").tBodies[0].replaceChildren(...workers);
  $("top-text").textContent = top.text;
}

async function pollTop() {
  try {
    const resp = await fetch("/ui/api/top", { headers: headers() });
    if (!resp.ok) throw new Error(await errorText(resp));
    renderTop(await resp.json());
  } catch (e) {
    $("planner-summary").textContent = "cannot read the planner's state: " + (e.message || e);
  }
}

function selectTab(name) {
  for (const t of ["chat", "planner"]) {
    $("tab-" + t).setAttribute("aria-selected", String(t === name));
    $("panel-" + t).hidden = t !== name;
  }
  clearInterval(state.timer);
  state.timer = null;
  if (name === "planner") {
    pollTop();
    state.timer = setInterval(pollTop, 1000);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = localStorage.getItem("nightjar-api-key") || "";
  $("api-key").addEventListener("change", () => {
    localStorage.setItem("nightjar-api-key", $("api-key").value.trim());
    loadModels();
  });
  $("tab-chat").addEventListener("click", () => selectTab("chat"));
  $("tab-planner").addEventListener("click", () => selectTab("planner"));
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("prompt").value;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("clear").addEventListener("click", () => {
    state.messages = [];
    $("messages").replaceChildren();
    $("steps").replaceChildren();
    showError("");
  });
  loadModels();
});
