'use strict';

// The page of `minirun serve` and `dormouse serve`: a chat (or text continuation) over the
// server's OpenAI-style streaming routes, the memory dial and the live instruments.
// Everything the server or the model says is inserted with textContent.

const POLL_MS = 1000;
const POLL_TIMEOUT_MS = 5000;
const ABOUT_RETRY_MS = 3000;
const COMPLETION_MAX_TOKENS = 4096; // dormouse's cap on max_tokens
const STORAGE_PREFIX = 'http-serve-page/conversation/';
const SVG_NS = 'http://www.w3.org/2000/svg';

const ui = {};
const state = {
  about: null,
  conversation: [], // { role, content, state, finish, error }
  streaming: null, // { turn, controller } while a reply streams
  plans: [],
  memory: null,
  instrumentUpdates: 0,
  instrumentsFailing: false,
  leaving: false, // the page is being unloaded
};
const views = new WeakMap(); // turn -> its article's elements

// ---- Formatting -------------------------------------------------------------------------

function isNumber(value) {
  return typeof value === 'number' && Number.isFinite(value);
}

function formatBytes(bytes) {
  if (!isNumber(bytes)) return '—';
  if (Math.abs(bytes) < 1024) return `${Math.round(bytes)} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let value = bytes / 1024;
  let unit = 0;
  // 1023.999 KiB would print as "1024.00 KiB": move up a unit before rounding does.
  while (Math.abs(value) >= 1023.995 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(2)} ${units[unit]}`;
}

function formatNumber(value) {
  if (!isNumber(value)) return '—';
  const size = Math.abs(value);
  const digits = size >= 100 || size === 0 ? 0 : size >= 10 ? 1 : 2;
  return value.toFixed(digits);
}

function formatMs(ms) {
  return isNumber(ms) ? `${formatNumber(ms)} ms` : '—';
}

function formatPercent(ratio) {
  if (!isNumber(ratio)) return '—';
  const percent = ratio * 100;
  return `${percent.toFixed(percent >= 10 || percent === 0 ? 0 : 1)}%`;
}

function formatCount(value) {
  return isNumber(value) ? Math.round(value).toLocaleString('en-US') : '—';
}

function formatDuration(seconds) {
  if (!isNumber(seconds)) return '—';
  const s = Math.floor(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

// ---- DOM helpers -----------------------------------------------------------------------

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

function svgElement(tag, attributes) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
  return node;
}

function setStatus(text, kind) {
  ui.status.textContent = kind === 'error' ? `Error: ${text}` : text;
  ui.status.dataset.kind = kind || 'notice';
}

function clearStatus() {
  ui.status.textContent = '';
  delete ui.status.dataset.kind;
}

// ---- Server requests -------------------------------------------------------------------

// A readable message for a non-2xx answer: the OpenAI-shaped error's message when there is one.
async function errorMessage(response) {
  const fallback = `HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}`;
  try {
    const body = await response.json();
    const message = body && body.error && body.error.message;
    return typeof message === 'string' && message !== '' ? message : fallback;
  } catch (_) {
    return fallback;
  }
}

// A server started with --api-key answers its API only to requests that carry the key. The page
// asks its user once, keeps the key for this tab only (sessionStorage, never the address), and
// asks no more after its user declined.
const API_KEY_ITEM = 'api-key';
let apiKeyDeclined = false;

function withApiKey(headers) {
  const key = window.sessionStorage.getItem(API_KEY_ITEM);
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

async function apiFetch(path, init) {
  const response = await fetch(path, { ...init, headers: withApiKey(init.headers || {}) });
  if (response.status !== 401 || apiKeyDeclined) return response;
  const key = window.prompt('This server needs its API key (the key it was started with):');
  if (!key || !key.trim()) {
    apiKeyDeclined = true;
    return response;
  }
  window.sessionStorage.setItem(API_KEY_ITEM, key.trim());
  return fetch(path, { ...init, headers: withApiKey(init.headers || {}) });
}

async function fetchJson(path, signal) {
  let response;
  try {
    response = await apiFetch(path, { headers: { Accept: 'application/json' }, signal });
  } catch (error) {
    throw new Error(error && error.name === 'AbortError'
      ? `${path} did not answer in time`
      : `could not reach the server for ${path}`);
  }
  if (!response.ok) throw new Error(`${path}: ${await errorMessage(response)}`);
  try {
    return await response.json();
  } catch (_) {
    throw new Error(`${path} did not answer with JSON`);
  }
}

// Server-sent events: `data:` lines joined by newlines, an event ends at a blank line. Text may
// arrive cut anywhere, so an unfinished line waits in the buffer for the next chunk.
function createEventStreamParser(onData) {
  let buffer = '';
  let dataLines = [];

  function dispatch() {
    if (dataLines.length === 0) return;
    const data = dataLines.join('\n');
    dataLines = [];
    onData(data);
  }

  function takeLine(line) {
    if (line === '') return dispatch();
    if (line.startsWith(':')) return undefined; // a comment (keep-alive)
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') dataLines.push(value);
    return undefined;
  }

  function push(text) {
    buffer += text;
    for (;;) {
      const match = /\r\n|\r|\n/.exec(buffer);
      if (!match) break;
      // A lone \r at the very end may be the first half of \r\n: wait for the next chunk.
      if (match[0] === '\r' && match.index === buffer.length - 1) break;
      const line = buffer.slice(0, match.index);
      buffer = buffer.slice(match.index + match[0].length);
      takeLine(line);
    }
  }

  function end() {
    if (buffer !== '') takeLine(buffer.replace(/\r$/, ''));
    buffer = '';
    dispatch();
  }

  return { push, end };
}

// Reads an event stream as it arrives; onData returns false to stop reading.
async function readEventStream(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let stopped = false;
  const parser = createEventStreamParser((data) => {
    if (!stopped && onData(data) === false) stopped = true;
  });
  while (!stopped) {
    const { value, done } = await reader.read();
    if (done) {
      parser.push(decoder.decode());
      parser.end();
      return;
    }
    parser.push(decoder.decode(value, { stream: true }));
  }
  reader.cancel().catch(() => {});
}

// ---- Identity (/api/about) -------------------------------------------------------------

async function loadAbout() {
  try {
    applyAbout(await fetchJson('/api/about'));
  } catch (error) {
    setStatus(`could not load the server's description (${error.message}). Trying again in 3 seconds.`, 'error');
    setTimeout(loadAbout, ABOUT_RETRY_MS);
  }
}

function applyAbout(raw) {
  const about = {
    program: String(raw.program || 'server'),
    model: String(raw.model || 'model'),
    mode: raw.mode === 'completion' ? 'completion' : 'chat',
    verified: raw.verified === true,
    provenance: typeof raw.provenance === 'string' ? raw.provenance : '',
    details: Array.isArray(raw.details) ? raw.details.map(String) : [],
    dial: raw.dial === true,
    instruments: raw.instruments === true,
    // Tokens a request holds, prompt and reply (null: the server trims long prompts itself).
    context: isNumber(raw.context) ? raw.context : null,
    // The largest max_tokens a request may give.
    maxTokens: isNumber(raw.max_tokens) ? raw.max_tokens : null,
    maxConcurrent: isNumber(raw.max_concurrent) ? raw.max_concurrent : null,
  };
  state.about = about;
  clearStatus();
  document.title = `${about.model} · ${about.program}`;
  showIdentity(about);
  showMode(about);
  state.conversation = loadConversation();
  renderConversation();
  document.body.classList.toggle('no-side', !about.dial && !about.instruments);
  if (about.dial) {
    ui.dial.hidden = false;
    loadMemory();
  }
  if (about.instruments) {
    ui.instruments.hidden = false;
    pollInstruments();
  }
}

function showIdentity(about) {
  ui.programName.textContent = about.program;
  ui.modelName.textContent = about.model;
  ui.identity.dataset.verified = String(about.verified);
  ui.verifiedBadge.textContent = about.verified ? 'Verified' : 'UNVERIFIED';
  ui.provenance.textContent = about.provenance;
  const limits = [];
  if (about.context !== null) {
    limits.push(`Up to ${formatCount(about.context)} tokens per request (prompt and reply together).`);
  } else if (about.maxTokens !== null) {
    limits.push(`Up to ${formatCount(about.maxTokens)} tokens per reply.`);
  }
  if (about.maxConcurrent !== null) limits.push(`Up to ${formatCount(about.maxConcurrent)} requests decoded at once.`);
  ui.limits.textContent = limits.join(' ');
  ui.aboutDetailsList.replaceChildren(...about.details.map((line) => element('li', '', line)));
  ui.aboutDetails.hidden = about.details.length === 0;
}

function showMode(about) {
  if (about.mode === 'completion') {
    ui.modeNote.textContent = 'This model continues text: it has no chat template. Each message you send '
      + 'goes to it alone, as the prompt, and the reply shown is its continuation of that text.';
    ui.promptLabel.textContent = 'Text to continue';
    ui.maxTokens.max = String(completionCap());
    ui.maxTokensHint.textContent = `The longest continuation to generate (at most ${completionCap()}).`;
  } else {
    ui.modeNote.textContent = 'The whole conversation is sent with each message.';
    ui.promptLabel.textContent = 'Message';
    if (about.maxTokens !== null) ui.maxTokens.max = String(about.maxTokens);
  }
}

function completionCap() {
  return state.about.maxTokens !== null ? state.about.maxTokens : COMPLETION_MAX_TOKENS;
}

// ---- Conversation ----------------------------------------------------------------------

function storageKey() {
  return STORAGE_PREFIX + state.about.model;
}

function loadConversation() {
  let saved = null;
  try {
    saved = JSON.parse(window.sessionStorage.getItem(storageKey()) || '[]');
  } catch (_) {
    return [];
  }
  if (!Array.isArray(saved)) return [];
  return saved
    .filter((t) => t && (t.role === 'user' || t.role === 'assistant') && typeof t.content === 'string')
    .map((t) => ({
      role: t.role,
      content: t.content,
      // A reply cut off by the reload did not finish.
      state: t.state === 'streaming' ? 'stopped' : String(t.state || 'done'),
      finish: typeof t.finish === 'string' ? t.finish : null,
      error: typeof t.error === 'string' ? t.error : null,
    }));
}

function saveConversation() {
  if (!state.about || state.leaving) return;
  const turns = state.conversation.map(({ role, content, state: s, finish, error }) =>
    ({ role, content, state: s, finish, error }));
  try {
    window.sessionStorage.setItem(storageKey(), JSON.stringify(turns));
  } catch (_) {
    // Storage may be full or disabled; the conversation still lives in the page.
  }
}

function replyName() {
  return state.about && state.about.mode === 'completion' ? 'Continuation' : 'Model';
}

function renderConversation() {
  ui.messages.replaceChildren(...state.conversation.map(renderTurn));
  scrollMessagesToEnd();
  updateControls();
}

function renderTurn(turn) {
  const article = element('article', 'message');
  article.dataset.role = turn.role;
  const content = element('div', 'content', turn.content);
  const meta = element('p', 'meta');
  article.append(element('h3', 'who', turn.role === 'user' ? 'You' : replyName()), content, meta);
  views.set(turn, { article, content, meta, error: null });
  showTurnState(turn);
  return article;
}

function describeTurn(turn) {
  if (turn.role === 'user') return '';
  switch (turn.state) {
    case 'streaming': return 'Writing…';
    case 'stopped': return 'Stopped before the end.';
    case 'error': return 'Failed.';
    default:
      if (turn.finish === 'length') return 'Finished: reached the token limit.';
      return 'Finished.';
  }
}

function showTurnState(turn) {
  const view = views.get(turn);
  if (!view) return;
  view.article.dataset.state = turn.role === 'user' ? 'sent' : turn.state;
  if (turn.finish && turn.state === 'done') view.article.dataset.finish = turn.finish;
  else delete view.article.dataset.finish;
  view.meta.textContent = describeTurn(turn);
  view.meta.hidden = view.meta.textContent === '';
  if (turn.state === 'error') {
    if (!view.error) {
      view.error = element('p', 'error');
      view.article.append(view.error);
    }
    view.error.textContent = `Error: ${turn.error || 'the reply failed'}`;
  }
}

function addTurn(turn) {
  state.conversation.push(turn);
  ui.messages.append(renderTurn(turn));
  scrollMessagesToEnd();
  return turn;
}

function appendToTurn(turn, text) {
  turn.content += text;
  const view = views.get(turn);
  if (!view) return;
  const follow = isScrolledToEnd();
  // Appending a text node (not resetting textContent) lets screen readers announce only the new text.
  view.content.append(document.createTextNode(text));
  if (follow) scrollMessagesToEnd();
}

function isScrolledToEnd() {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 40;
}

function scrollMessagesToEnd() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function lastTurn() {
  return state.conversation[state.conversation.length - 1] || null;
}

function updateControls() {
  const streaming = state.streaming !== null;
  const last = lastTurn();
  ui.send.disabled = streaming || state.about === null;
  ui.stop.disabled = !streaming;
  ui.regenerate.disabled = streaming || !last || last.role !== 'assistant';
  ui.messages.setAttribute('aria-busy', String(streaming));
  // A button that just became disabled would drop keyboard focus to the page's start.
  const focused = document.activeElement;
  if (focused && focused.tagName === 'BUTTON' && focused.disabled) ui.prompt.focus();
}

function readSettings() {
  const temperature = Number(ui.temperature.value);
  if (ui.temperature.value.trim() === '' || !Number.isFinite(temperature) || temperature < 0) {
    return { error: 'the temperature must be a number of at least 0.' };
  }
  const maxTokens = Number(ui.maxTokens.value);
  if (!Number.isInteger(maxTokens) || maxTokens < 1) {
    return { error: 'max tokens must be a whole number of at least 1.' };
  }
  if (state.about.mode === 'completion' && maxTokens > completionCap()) {
    return { error: `max tokens can be at most ${completionCap()} for this model.` };
  }
  return { temperature, maxTokens };
}

function send() {
  if (state.streaming || !state.about) return;
  const text = ui.prompt.value;
  if (text.trim() === '') {
    setStatus('Nothing to send: type a message first.', 'notice');
    ui.prompt.focus();
    return;
  }
  const settings = readSettings();
  if (settings.error) {
    setStatus(settings.error, 'error');
    return;
  }
  clearStatus();
  addTurn({ role: 'user', content: text, state: 'sent', finish: null, error: null });
  ui.prompt.value = '';
  saveConversation();
  streamReply(settings);
}

function regenerate() {
  const last = lastTurn();
  if (state.streaming || !state.about || !last || last.role !== 'assistant') return;
  const settings = readSettings();
  if (settings.error) {
    setStatus(settings.error, 'error');
    return;
  }
  state.conversation.pop();
  const view = views.get(last);
  if (view) view.article.remove();
  saveConversation();
  if (!state.conversation.some((t) => t.role === 'user')) {
    updateControls();
    setStatus('There is no message to answer.', 'notice');
    return;
  }
  clearStatus();
  streamReply(settings);
}

function stop() {
  if (state.streaming) state.streaming.controller.abort();
}

function clearConversation() {
  stop();
  state.streaming = null; // the aborted reply finishes off the page; the controls free now
  state.conversation = [];
  renderConversation();
  saveConversation();
  setStatus('The conversation is cleared.', 'notice');
}

// A reply that failed or is empty is not part of what the model said.
function isSendable(turn) {
  return turn.role === 'user' || (turn.state !== 'error' && turn.content !== '');
}

function buildRequest(settings) {
  const common = { stream: true, temperature: settings.temperature, max_tokens: settings.maxTokens };
  if (state.about.mode === 'completion') {
    const lastUser = [...state.conversation].reverse().find((t) => t.role === 'user');
    return { url: '/v1/completions', body: { prompt: lastUser.content, ...common } };
  }
  const messages = state.conversation.filter(isSendable).map((t) => ({ role: t.role, content: t.content }));
  return { url: '/v1/chat/completions', body: { messages, ...common } };
}

async function streamReply(settings) {
  const request = buildRequest(settings);
  const turn = addTurn({ role: 'assistant', content: '', state: 'streaming', finish: null, error: null });
  const controller = new AbortController();
  state.streaming = { turn, controller };
  updateControls();
  const progress = { sawDone: false };
  try {
    const response = await apiFetch(request.url, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
      body: JSON.stringify(request.body),
      signal: controller.signal,
    });
    if (!response.ok) {
      failTurn(turn, await errorMessage(response));
    } else if (!response.body) {
      failTurn(turn, 'this browser cannot read the reply as a stream');
    } else {
      await readEventStream(response, (data) => takeStreamEvent(turn, data, progress));
      endTurn(turn, progress);
    }
  } catch (error) {
    if (error && error.name === 'AbortError') {
      turn.state = turn.finish ? 'done' : 'stopped';
      showTurnState(turn);
    } else {
      failTurn(turn, `the connection failed (${error && error.message ? error.message : error})`);
    }
  } finally {
    if (state.streaming && state.streaming.turn === turn) state.streaming = null;
    updateControls();
    saveConversation();
  }
}

// One `data:` payload of a reply's stream; false ends the reading.
function takeStreamEvent(turn, data, progress) {
  if (turn.state !== 'streaming') return false;
  if (data === '[DONE]') {
    progress.sawDone = true;
    return false;
  }
  let event;
  try {
    event = JSON.parse(data);
  } catch (_) {
    failTurn(turn, 'the server sent a stream event that is not JSON');
    return false;
  }
  if (event && event.error) {
    failTurn(turn, typeof event.error.message === 'string' ? event.error.message : 'the server reported an error');
    return false;
  }
  const choice = event && Array.isArray(event.choices) ? event.choices[0] : null;
  if (!choice) return true;
  const piece = state.about.mode === 'completion' ? choice.text : choice.delta && choice.delta.content;
  if (typeof piece === 'string' && piece !== '') appendToTurn(turn, piece);
  if (typeof choice.finish_reason === 'string') turn.finish = choice.finish_reason;
  return true;
}

function endTurn(turn, progress) {
  if (turn.state !== 'streaming') return;
  if (turn.finish || progress.sawDone) {
    turn.state = 'done';
    showTurnState(turn);
  } else {
    failTurn(turn, 'the stream ended before the reply was finished');
  }
}

function failTurn(turn, message) {
  turn.state = 'error';
  turn.error = message;
  showTurnState(turn);
  setStatus(`the reply failed: ${message}`, 'error');
}

function onPromptKeydown(event) {
  if (event.key !== 'Enter' || event.shiftKey || event.isComposing) return;
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  event.preventDefault();
  send();
}

// ---- Memory dial (/api/memory) ---------------------------------------------------------

const PLAN_PARTS = [
  { key: 'resident_bytes', name: 'Resident weights', className: 'part-resident' },
  { key: 'held_bytes', name: 'Held experts (MoE layers kept whole)', className: 'part-held' },
  { key: 'cache_bytes', name: 'Expert cache', className: 'part-cache' },
  { key: 'slot_pool_bytes', name: 'Expert read slots', className: 'part-slots' },
  { key: 'layer_pool_bytes', name: 'Streamed layer buffers', className: 'part-layers' },
  { key: 'table_pool_bytes', name: 'Embedding and head read buffers', className: 'part-tables' },
  { key: 'reserve_bytes', name: 'Reserve (context caches, working memory)', className: 'part-reserve' },
];

async function loadMemory() {
  ui.dialRetry.hidden = true;
  ui.dialNote.textContent = 'Loading the memory plans…';
  ui.dialNote.hidden = false;
  try {
    applyMemory(await fetchJson('/api/memory'));
  } catch (error) {
    ui.dialNote.textContent = `Could not load the memory plans: ${error.message}.`;
    ui.dialRetry.hidden = false;
    setStatus(`the memory dial did not load (${error.message}).`, 'error');
  }
}

function applyMemory(memory) {
  const plans = Array.isArray(memory.plans) ? memory.plans.filter((p) => p && isNumber(p.budget)) : [];
  state.memory = memory;
  state.plans = plans;
  if (plans.length === 0) {
    ui.dialNote.textContent = 'The server lists no memory plans.';
    return;
  }
  ui.dialNote.hidden = true;
  ui.dialBody.hidden = false;
  const running = Math.max(0, plans.findIndex((p) => p.running === true));
  const available = isNumber(memory.available_memory)
    ? `${formatBytes(memory.available_memory)} of memory is available now.`
    : 'The memory available now is not known.';
  ui.dialSummary.textContent = `Running with a budget of ${formatBytes(memory.running_budget)}. `
    + `The least it can run in is ${formatBytes(memory.floor)}; holding everything resident needs `
    + `${formatBytes(memory.everything)}. ${available}`;
  ui.dialBudget.max = String(plans.length - 1);
  ui.dialBudget.value = String(running);
  renderPlan();
}

function planName(plan) {
  const label = String(plan.label || '');
  const budget = formatBytes(plan.budget);
  const name = label && label !== budget ? `${label} (${budget})` : budget;
  return plan.running ? `${name}, running now` : name;
}

function addFact(list, term, value) {
  const row = element('div', 'fact');
  row.append(element('dt', '', term), element('dd', '', value));
  list.append(row);
}

function renderPlan() {
  const plan = state.plans[Number(ui.dialBudget.value)];
  if (!plan) return;
  const name = planName(plan);
  ui.dialOutput.textContent = name;
  ui.dialBudget.setAttribute('aria-valuetext', name);

  const facts = ui.dialFacts;
  facts.replaceChildren();
  addFact(facts, 'Budget', `${formatBytes(plan.budget)}${plan.running ? ' (running now)' : ''}`);
  addFact(facts, 'Mode', plan.mode === 'resident' ? 'resident (all in memory)' : 'streamed (reads from disk)');
  addFact(facts, 'Resident', formatBytes(sum(plan.resident_bytes, plan.held_bytes)));
  addFact(facts, 'Expert cache', formatBytes(plan.cache_bytes));
  addFact(facts, 'Streamed layers', `${formatCount(plan.streamed_layers)} of ${formatCount(plan.layer_count)}`);
  addFact(facts, 'Held MoE layers', `${formatCount(plan.held_layers)} of ${formatCount(plan.moe_layers)}`);
  addFact(facts, 'Read per token (predicted, no cache hits)',
    plan.read_per_token === 0 ? 'nothing: all resident' : formatBytes(plan.read_per_token));
  if (Array.isArray(plan.tables_streamed) && plan.tables_streamed.length > 0) {
    addFact(facts, 'Read by rows from disk', plan.tables_streamed.join(', '));
  }
  if (typeof plan.ranking === 'string' && plan.ranking !== '') {
    addFact(facts, 'Held first (most bytes saved per byte)', plan.ranking);
  }

  renderPlanBar(plan);
  renderPlanChange(plan);
}

function sum(...values) {
  return values.every(isNumber) ? values.reduce((a, b) => a + b, 0) : null;
}

function renderPlanBar(plan) {
  const sizes = PLAN_PARTS.map((part) => (isNumber(plan[part.key]) ? plan[part.key] : 0));
  const total = sizes.reduce((a, b) => a + b, 0);
  const whole = Math.max(total, plan.budget, 1);
  const segments = [];
  const legend = [];
  PLAN_PARTS.forEach((part, i) => {
    const share = sizes[i] / whole;
    const segment = element('div', `segment ${part.className}`);
    segment.style.setProperty('width', `${(share * 100).toFixed(3)}%`);
    segments.push(segment);
    const item = element('li', '');
    item.append(element('span', `swatch ${part.className}`), element('span', '', `${part.name}: ${formatBytes(plan[part.key])} (${formatPercent(share)})`));
    legend.push(item);
  });
  if (plan.budget > total) {
    legend.push(element('li', 'unused', `Not allotted: ${formatBytes(plan.budget - total)}`));
  }
  ui.dialBar.replaceChildren(...segments);
  ui.dialLegend.replaceChildren(...legend);
}

function renderPlanChange(plan) {
  const memory = state.memory;
  const parts = [];
  if (isNumber(memory.available_memory) && plan.budget > memory.available_memory) {
    parts.push(element('p', 'warning', `Warning: this budget (${formatBytes(plan.budget)}) is more than the `
      + `${formatBytes(memory.available_memory)} of memory available now.`));
  }
  if (plan.running) {
    parts.push(element('p', '', 'This is the plan the server is running now.'));
  } else {
    const lead = memory.can_change === true
      ? 'This is not the plan running now. To run it, start the server with:'
      : 'This is not the plan running now, and the budget cannot be changed while the server runs.';
    parts.push(element('p', 'notice', lead));
    if (memory.can_change !== true && memory.how_to_change) {
      parts.push(element('p', '', String(memory.how_to_change)));
    }
    if (plan.command) {
      const pre = element('pre', 'command');
      pre.append(element('code', '', String(plan.command)));
      parts.push(pre);
    }
  }
  ui.dialChange.replaceChildren(...parts);
}

// ---- Instruments (/api/instruments) ----------------------------------------------------

// Polls one at a time: the next poll is scheduled only after this one ends.
async function pollInstruments() {
  if (!document.hidden) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), POLL_TIMEOUT_MS);
    try {
      const reading = await fetchJson('/api/instruments', controller.signal);
      showInstruments(reading);
      state.instrumentUpdates += 1;
      ui.instruments.dataset.updates = String(state.instrumentUpdates);
      if (state.instrumentsFailing) setStatus('The instruments are updating again.', 'notice');
      state.instrumentsFailing = false;
    } catch (error) {
      if (!state.instrumentsFailing) setStatus(`the instruments stopped updating (${error.message}).`, 'error');
      state.instrumentsFailing = true;
      ui.instSummary.textContent = 'Not updating: the last reading failed. Still trying every second.';
    } finally {
      clearTimeout(timer);
    }
  }
  setTimeout(pollInstruments, POLL_MS);
}

function showInstruments(reading) {
  const recent = reading.recent || {};
  const totals = reading.totals || {};
  ui.instruments.dataset.totalTokens = isNumber(totals.tokens) ? String(totals.tokens) : '';
  const period = isNumber(recent.window_s) ? `the last ${formatNumber(recent.window_s)} s` : 'a recent window';
  ui.instSummary.textContent = `Up ${formatDuration(reading.uptime_s)}. Rates are over ${period}; `
    + '"—" means nothing was decoded then.';

  ui.instTokensPerS.textContent = isNumber(recent.tokens_per_s) ? `${formatNumber(recent.tokens_per_s)} tokens/s` : '—';
  ui.instBytesPerToken.textContent = `${formatBytes(recent.read_bytes_per_token)} `
    + `(predicted with no cache hits: ${formatBytes(reading.planned_read_per_token)})`;
  ui.instIo.textContent = describeTime(recent.io_wait_ms_per_token, recent.compute_ms_per_token);
  ui.instCache.textContent = formatPercent(recent.cache_hit_rate);
  ui.instResident.textContent = `${formatBytes(reading.resident_bytes)} of a ${formatBytes(reading.budget)} budget`;
  ui.instBatch.textContent = `${formatCount(reading.batch)} decoding, ${formatCount(reading.waiting)} waiting`;
  ui.instTotal.textContent = `${formatCount(totals.tokens)} tokens in ${formatCount(totals.requests)} requests, `
    + `${formatBytes(totals.read_bytes)} read`;
  drawChart(Array.isArray(reading.history) ? reading.history : []);
}

function describeTime(ioMs, computeMs) {
  if (!isNumber(ioMs) && !isNumber(computeMs)) return '—';
  const whole = sum(ioMs, computeMs);
  const share = (part) => (whole && isNumber(part) ? ` (${formatPercent(part / whole)})` : '');
  return `${formatMs(ioMs)} waiting for reads${share(ioMs)}, ${formatMs(computeMs)} computing${share(computeMs)}`;
}

const CHART = { width: 320, height: 150, left: 30, right: 8, top: 16, bottom: 28 };

function drawChart(history) {
  const svg = ui.instChart;
  const points = history.filter((h) => h && isNumber(h.t));
  const title = svgElement('title', { id: 'inst-chart-title' });
  if (points.length === 0) {
    title.textContent = 'No history yet.';
    svg.replaceChildren(title);
    return;
  }
  const plotW = CHART.width - CHART.left - CHART.right;
  const plotH = CHART.height - CHART.top - CHART.bottom;
  const t0 = points[0].t;
  const span = Math.max(points[points.length - 1].t - t0, 1);
  const maxTokens = Math.max(1, ...points.map((p) => (isNumber(p.tokens) ? p.tokens : 0)));
  const maxRead = Math.max(0, ...points.map((p) => (isNumber(p.read_bytes) ? p.read_bytes : 0)));
  const x = (p) => CHART.left + ((p.t - t0) / span) * plotW;
  const y = (share) => CHART.top + plotH - share * plotH;
  const line = (value) => points.map((p) => `${x(p).toFixed(1)},${y(value(p)).toFixed(1)}`).join(' ');

  const latest = points[points.length - 1];
  title.textContent = `Tokens per second over the last ${formatCount(span)} seconds: `
    + `latest ${formatCount(latest.tokens)}, peak ${formatCount(maxTokens)}. `
    + `Bytes read per second peaked at ${formatBytes(maxRead)}.`;

  const bottom = CHART.top + plotH;
  const right = CHART.left + plotW;
  const children = [
    title,
    svgElement('line', { x1: CHART.left, y1: bottom, x2: right, y2: bottom, class: 'axis' }),
    svgElement('line', { x1: CHART.left, y1: CHART.top, x2: CHART.left, y2: bottom, class: 'axis' }),
    svgElement('line', { x1: CHART.left, y1: CHART.top, x2: right, y2: CHART.top, class: 'grid' }),
    chartText(CHART.left - 4, CHART.top + 4, formatCount(maxTokens), 'end'),
    chartText(CHART.left - 4, bottom + 3, '0', 'end'),
    chartText(right, CHART.top - 5, `reads peak ${formatBytes(maxRead)}/s`, 'end', 'small'),
    chartText(CHART.left, bottom + 14, `${formatCount(span)} s ago`, 'start'),
    chartText(right, bottom + 14, 'now', 'end'),
    chartText(CHART.left + plotW / 2, bottom + 24, 'tokens/s (solid), read/s (dashed)', 'middle', 'small'),
  ];
  if (maxRead > 0) {
    children.push(svgElement('polyline', { points: line((p) => (isNumber(p.read_bytes) ? p.read_bytes : 0) / maxRead), class: 'series-reads' }));
  }
  children.push(svgElement('polyline', { points: line((p) => (isNumber(p.tokens) ? p.tokens : 0) / maxTokens), class: 'series-tokens' }));
  svg.replaceChildren(...children);
}

function chartText(xPos, yPos, text, anchor, size) {
  const node = svgElement('text', { x: xPos.toFixed(1), y: yPos.toFixed(1), 'text-anchor': anchor, class: `label ${size || ''}`.trim() });
  node.textContent = text;
  return node;
}

// ---- Start -----------------------------------------------------------------------------

const ELEMENT_IDS = [
  'identity', 'program-name', 'model-name', 'verified-badge', 'provenance', 'limits',
  'about-details', 'about-details-list', 'status', 'mode-note', 'messages', 'composer', 'prompt',
  'prompt-label', 'temperature', 'max-tokens', 'max-tokens-hint', 'send', 'stop', 'regenerate',
  'clear', 'dial', 'dial-note', 'dial-retry', 'dial-body', 'dial-summary', 'dial-budget',
  'dial-output', 'dial-facts', 'dial-bar', 'dial-legend', 'dial-change', 'instruments',
  'inst-summary', 'inst-tokens-per-s', 'inst-bytes-per-token', 'inst-io', 'inst-cache',
  'inst-resident', 'inst-batch', 'inst-total', 'inst-chart',
];

// ui.maxTokensHint is #max-tokens-hint, ui.instTokensPerS is #inst-tokens-per-s, ...
function findElements() {
  for (const id of ELEMENT_IDS) {
    const name = id.replace(/-(\w)/g, (_, c) => c.toUpperCase());
    ui[name] = document.getElementById(id);
  }
}

function start() {
  findElements();
  ui.composer.addEventListener('submit', (event) => {
    event.preventDefault();
    send();
  });
  ui.prompt.addEventListener('keydown', onPromptKeydown);
  ui.stop.addEventListener('click', stop);
  ui.regenerate.addEventListener('click', regenerate);
  ui.clear.addEventListener('click', clearConversation);
  ui.dialBudget.addEventListener('input', renderPlan);
  ui.dialRetry.addEventListener('click', loadMemory);
  // Every finished change is saved when it happens; a reply still streaming is saved as it
  // stands (and reloads as stopped), and what leaving the page does to its stream is not saved.
  window.addEventListener('pagehide', () => {
    if (state.streaming) saveConversation();
    state.leaving = true;
  });
  window.addEventListener('pageshow', () => {
    state.leaving = false;
  });
  updateControls();
  loadAbout();
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
else start();
