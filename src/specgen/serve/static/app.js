// specgen's web view: a chat over the server's own OpenAI-compatible API.
//
// POST v1/chat/completions with stream: true; the answer arrives as server-sent events
// (`data: {json}` lines, then `data: [DONE]`). Each content chunk carries the extension
// object "specgen": {drafted_chars, tokens, tau, tokens_per_second, acceptance_per_position}
// where drafted_chars counts the leading characters of its delta.content that came from
// accepted draft tokens (highlighted here). The finish and usage chunks carry the whole
// answer's statistics. No framework, no build step.
"use strict";

const KEY_STORE = "specgen.apiKey";
const $ = (id) => document.getElementById(id);

const state = {
  messages: [], // the conversation, resent whole each turn (the server reuses its cache)
  model: null, // the id /v1/models gave, or null (the server's own)
  controller: null, // the AbortController of the answer streaming now
};

// --- the API ------------------------------------------------------------------------------

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = sessionStorage.getItem(KEY_STORE);
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

class APIError extends Error {
  constructor(status, error) {
    super(error.message || "HTTP " + status);
    this.status = status;
    this.code = error.code || null;
    this.type = error.type || null;
    this.param = error.param || null;
  }
}

// The server answers errors as {"error": {message, type, param, code}}; anything else
// (a proxy's HTML page, say) is shown by its status line.
async function failure(response) {
  let error = { message: `HTTP ${response.status} ${response.statusText}` };
  try {
    const body = await response.json();
    if (body && body.error) error = body.error;
  } catch (_) { /* not JSON */ }
  return new APIError(response.status, error);
}

async function loadModels() {
  const response = await fetch("v1/models", { headers: headers(false) });
  if (!response.ok) throw await failure(response);
  const card = (await response.json()).data[0];
  state.model = card.id;
  $("model-name").textContent = card.id;
  const select = $("method");
  const methods = (card.specgen && card.specgen.methods) || [];
  select.replaceChildren(...methods.map((m, i) => new Option(i === 0 ? `${m} (default)` : m, m)));
  select.disabled = methods.length < 2;
}

// Server-sent events from a fetch body: `onData` gets each event's data. Bytes may split
// anywhere (inside a character, a line, an event), so decoding and line-splitting carry
// their leftovers to the next read.
async function readEvents(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let data = [];
  const line = (text) => {
    if (text === "") { // a blank line ends an event
      if (data.length) onData(data.join("\n"));
      data = [];
    } else if (text.startsWith("data:")) {
      data.push(text.slice(text[5] === " " ? 6 : 5));
    } // comments (":...") and other fields (event:, id:, retry:) are ignored
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      // a "\r" at the end may be the first half of a "\r\n": keep it for the next read
      const held = !done && buffer.endsWith("\r") ? "\r" : "";
      const lines = buffer.slice(0, buffer.length - held.length).split(/\r\n|\r|\n/);
      buffer = lines.pop() + held;
      lines.forEach(line);
      if (done) {
        if (buffer) line(buffer);
        line(""); // an unterminated last event still counts
        return;
      }
    }
  } catch (error) {
    reader.cancel().catch(() => {}); // a bad chunk or an abort: drop the rest
    throw error;
  }
}

// --- the page -----------------------------------------------------------------------------

function showError(error) {
  const box = $("error");
  if (!error) {
    box.hidden = true;
    box.textContent = "";
    return;
  }
  const where = [error.status, error.code, error.param && `param: ${error.param}`]
    .filter(Boolean).join(" · ");
  box.textContent = error.message + (where ? ` (${where})` : "");
  box.hidden = false;
  if (error.status === 401) askForKey();
}

function askForKey() {
  $("key-form").hidden = false;
  $("api-key").focus();
}

function setBusy(busy) {
  document.body.dataset.state = busy ? "streaming" : "idle";
  $("log").setAttribute("aria-busy", String(busy));
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("new-chat").disabled = busy;
}

function bubble(role, text) {
  $("empty").hidden = true;
  const article = document.createElement("article");
  article.className = `msg ${role}`;
  const who = document.createElement("h2");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Assistant";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  article.append(who, content);
  $("log").append(article);
  article.scrollIntoView({ block: "end" });
  return content;
}

// Append `text` to an answer, its first `drafted` characters (code points, as the server
// counts them) highlighted. Neighbouring pieces of the same kind share one node.
function appendText(content, text, drafted) {
  const chars = Array.from(text);
  const pieces = [[chars.slice(0, drafted).join(""), true], [chars.slice(drafted).join(""), false]];
  for (const [piece, isDraft] of pieces) {
    if (!piece) continue;
    const last = content.lastChild;
    const lastIsDraft = last && last.nodeType === Node.ELEMENT_NODE;
    if (last && lastIsDraft === isDraft) {
      (isDraft ? last.firstChild : last).appendData(piece);
    } else if (isDraft) {
      const span = document.createElement("span");
      span.className = "drafted";
      span.textContent = piece;
      content.append(span);
    } else {
      content.append(document.createTextNode(piece));
    }
  }
}

const fmt = (x, digits) => (typeof x === "number" ? x.toFixed(digits) : "–");

function showLive(spec) {
  $("stat-tau").textContent = fmt(spec.tau ?? spec.mean_acceptance_length, 2);
  $("stat-tps").textContent = fmt(spec.tokens_per_second, 1);
  $("stat-tokens").textContent = spec.tokens ?? "–";
  drawChart(spec.acceptance_per_position || []);
}

function drawChart(rates) {
  $("chart").replaceChildren(...rates.map((rate, i) => {
    const item = document.createElement("li");
    const percent = Math.round(rate * 100);
    item.setAttribute("aria-label", `position ${i + 1}: ${percent}% accepted`);
    item.title = `draft position ${i + 1}: ${percent}% accepted`;
    const bar = document.createElement("span");
    bar.className = "fill";
    bar.style.height = `${Math.max(0, Math.min(100, rate * 100))}%`;
    const label = document.createElement("span");
    label.className = "pos";
    label.textContent = i + 1;
    item.append(bar, label);
    return item;
  }));
}

// The whole answer's statistics; each value's element has data-stat="<name>" (for tests
// and for anyone scraping the page).
function showFinal(spec, usage, finish) {
  const rows = [["status", "finish", finish || "–"]];
  if (spec) {
    const drafted = spec.num_draft_tokens;
    const accepted = spec.num_accepted_draft_tokens;
    const ttft = spec.ttft_seconds;
    rows.push(
      ["method", "method", spec.method],
      ["τ (mean acceptance length)", "tau", fmt(spec.mean_acceptance_length, 3)],
      ["tokens/s", "tokens_per_second", fmt(spec.tokens_per_second, 1)],
      // priced from the server's cost table on both sides (never against a clock)
      ["speedup vs AR (modeled)", "speedup",
        spec.speedup_vs_ar_modeled == null ? "–" : `${fmt(spec.speedup_vs_ar_modeled, 2)}x`],
      ["tokens", "tokens", spec.tokens],
      ["steps", "steps", spec.num_spec_steps],
      ["draft tokens drafted", "drafted", drafted],
      ["draft tokens accepted", "accepted", accepted],
      ["acceptance rate", "rate", drafted ? `${Math.round((100 * accepted) / drafted)}%` : "–"],
      ["steps by accepted drafts", "histogram", (spec.acceptance_histogram || []).join(" · ")],
      ["time to first token", "ttft", ttft == null ? "–" : `${fmt(ttft * 1000, 0)} ms`],
      ["seconds", "seconds", fmt(spec.seconds, 2)],
    );
    showLive(spec);
  }
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    rows.push(["prompt tokens (cached)", "prompt_tokens", `${usage.prompt_tokens} (${cached})`]);
  }
  $("final").replaceChildren(...rows.map(([label, name, value]) => {
    const row = document.createElement("div");
    const dt = document.createElement("dt");
    const dd = document.createElement("dd");
    dt.textContent = label;
    dd.textContent = value ?? "–";
    dd.dataset.stat = name;
    row.append(dt, dd);
    return row;
  }));
}

// --- a turn -------------------------------------------------------------------------------

async function send(text) {
  showError(null);
  const messages = state.messages; // this conversation (New chat starts another)
  messages.push({ role: "user", content: text });
  const userBubble = bubble("user", text).parentElement;
  const content = bubble("assistant", "");
  const answerBubble = content.parentElement;
  answerBubble.classList.add("streaming");
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);

  const request = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (state.model) request.model = state.model;
  const method = $("method").value;
  if (method) request.specgen = { method };
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (maxTokens > 0) request.max_tokens = maxTokens;

  let answer = "";
  let finish = null;
  let spec = null;
  let usage = null;
  try {
    const response = await fetch("v1/chat/completions", {
      method: "POST", headers: headers(true), body: JSON.stringify(request), signal: controller.signal,
    });
    if (!response.ok) throw await failure(response);
    await readEvents(response.body, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new APIError(null, chunk.error); // failed after the 200 was sent
      const choice = (chunk.choices || [])[0];
      const delta = choice && choice.delta && choice.delta.content;
      if (delta) {
        answer += delta;
        appendText(content, delta, (chunk.specgen && chunk.specgen.drafted_chars) || 0);
        content.scrollIntoView({ block: "end" });
      }
      if (choice && choice.finish_reason) finish = choice.finish_reason;
      if (chunk.usage) usage = chunk.usage;
      if (chunk.specgen && !delta && chunk.specgen.method) spec = chunk.specgen;
      else if (chunk.specgen && delta) showLive(chunk.specgen);
    });
  } catch (error) {
    if (error.name === "AbortError") {
      finish = "stopped";
    } else {
      showError(error);
      finish = "error";
    }
  } finally {
    state.controller = null;
    answerBubble.classList.remove("streaming");
    setBusy(false);
  }

  if (answer) {
    messages.push({ role: "assistant", content: answer });
    if (finish === "stopped" || finish === "error") answerBubble.classList.add(finish);
  } else if (finish === "error" || finish === "stopped") {
    // nothing came back: forget the turn and give the text back to edit and resend
    messages.pop();
    userBubble.remove();
    answerBubble.remove();
    $("prompt").value = text;
  }
  showFinal(spec, usage, finish);
  $("prompt").focus();
}

function newChat() {
  if (state.controller) state.controller.abort();
  state.messages = [];
  $("log").querySelectorAll(".msg").forEach((node) => node.remove());
  $("empty").hidden = false;
  $("stat-tau").textContent = $("stat-tps").textContent = $("stat-tokens").textContent = "–";
  drawChart([]);
  showFinal(null, null, null);
  showError(null);
  $("prompt").focus();
}

// --- wiring -------------------------------------------------------------------------------

async function start() {
  $("ask").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value;
    if (!text.trim() || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("ask").requestSubmit();
    }
  });
  const stop = () => state.controller && state.controller.abort();
  $("stop").addEventListener("click", stop);
  document.addEventListener("keydown", (event) => event.key === "Escape" && stop());
  $("new-chat").addEventListener("click", newChat);
  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) sessionStorage.setItem(KEY_STORE, key);
    else sessionStorage.removeItem(KEY_STORE);
    if (await refresh()) $("prompt").focus();
  });
  $("api-key").value = sessionStorage.getItem(KEY_STORE) || "";
  if ($("api-key").value) $("key-form").hidden = false;
  if (await refresh()) $("prompt").focus(); // else the error moved focus where needed
}

// The model and its methods; false (the error shown) if the server refused.
async function refresh() {
  try {
    await loadModels();
    showError(null);
    return true;
  } catch (error) {
    showError(error);
    return false;
  }
}

start();
