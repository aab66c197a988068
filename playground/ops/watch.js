// The ops watch page (GET /ops), served as /ops/assets/watch.js so that the page runs no inline
// script (its policy: script-src 'self'). The documents it sends are the page's
// <script type="application/graphql" id="ops-doc">: data, which the browser never runs.
import { live } from './live.js';
const DOC = document.getElementById('ops-doc').textContent;
const TOKEN_KEY = 'fitorder.ops.token';
const FEED_MAX = 100;
const $ = (id) => document.getElementById(id);

const state = {
  token: null,
  dead: new Map(),      // event id -> {ev, replaying, error}: the rows of the DEAD list
  latest: new Map(),    // event id -> {ev, seen}: the newest the stream told us (merged into refreshes)
  tickets: new Map(),   // ticket id -> {t, seen}
};

// ---- DOM helpers: text only ever goes in through textContent ----
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v == null) continue;
    if (k === 'class') e.className = v;
    else if (k === 'testid') e.dataset.testid = v;
    else if (k === 'data') Object.assign(e.dataset, v);
    else if (k === 'title') e.title = v;
    else if (k === 'onclick') e.addEventListener('click', v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
const badge = (s) => el('span', { class: 'badge s-' + s }, s);
const ts = (iso) => { const t = Date.parse(iso); return Number.isNaN(t) ? 0 : t; };
function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso), now = new Date();
  const time = d.toLocaleTimeString([], { hour12: false });
  return d.toDateString() === now.toDateString() ? time : d.toLocaleDateString([], { month: '2-digit', day: '2-digit' }) + ' ' + time;
}
function setStatus(text, cls = '') { const s = $('status'); s.textContent = text; s.className = cls; }
function notice(text) { const n = $('notice'); n.textContent = text || ''; n.hidden = !text; }

// ---- token ----
function tokenFromHash() {
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (!m) return null;
  const t = decodeURIComponent(m[1]);
  sessionStorage.setItem(TOKEN_KEY, t);
  history.replaceState(null, '', location.pathname + location.search); // keep it out of history
  return t;
}
function showLogin(message) {
  stop();
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  $('board').hidden = true; $('logout').hidden = true; $('login').hidden = false;
  $('login-msg').textContent = message || '';
  $('token-input').value = '';
  $('token-input').focus();
}
function refuse() { showLogin('Token refused: paste a valid ops token.'); setStatus('token refused', 'refused'); }

// ---- GraphQL over HTTP ----
async function gql(operationName, variables = {}) {
  const res = await fetch('/graphql', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer ' + state.token },
    body: JSON.stringify({ query: DOC, operationName, variables }),
  });
  let body;
  try { body = await res.json(); } catch { throw new Error(operationName + ': HTTP ' + res.status); }
  if (body.errors && body.errors.length) {
    if (body.errors.some((e) => e.extensions && e.extensions.code === 'UNAUTHENTICATED')) { refuse(); throw new Error('token refused'); }
    throw new Error(operationName + ': ' + body.errors.map((e) => e.message).join('; '));
  }
  return body.data;
}

// ---- DEAD list ----
async function loadDead() {
  const started = Date.now();
  const data = await gql('DeadCompensations');
  const next = new Map();
  for (const { node } of data.compensationEvents.edges) {
    const old = state.dead.get(node.id);
    next.set(node.id, { ev: { ...node, status: 'DEAD' }, replaying: Boolean(old && old.replaying) });
  }
  state.dead = next;
  // What the stream reported after the query started is newer than the query's answer.
  for (const [id, { ev, seen }] of state.latest) {
    if (seen >= started) applyComp(ev, false);
    else if (seen < started - 120000) state.latest.delete(id);
  }
  renderDead();
}
function applyComp(ev, fromStream = true) {
  if (fromStream) state.latest.set(ev.id, { ev, seen: Date.now() });
  const row = state.dead.get(ev.id);
  if (row && ts(ev.updatedAt) < ts(row.ev.updatedAt)) return; // stale
  if (ev.status === 'DEAD') state.dead.set(ev.id, { ev: { ...(row && row.ev), ...ev }, replaying: false });
  else if (ev.status === 'SUCCEEDED' || (row && !row.replaying)) state.dead.delete(ev.id);
  else if (row) row.ev = { ...row.ev, ...ev }; // our replay in progress: show PENDING / RETRYING
}
async function replay(id) {
  const row = state.dead.get(id);
  if (!row) return;
  row.replaying = true; row.error = null; renderDead();
  try {
    const r = (await gql('Replay', { id })).replayCompensation;
    const cur = state.dead.get(id);
    if (cur && cur.replaying && cur.ev.status === 'DEAD') cur.ev = { ...cur.ev, status: r.status, attempts: r.attempts };
  } catch (e) {
    const cur = state.dead.get(id);
    if (cur) { cur.replaying = false; cur.error = e.message; }
  }
  renderDead();
}
function renderDead() {
  const rows = [...state.dead.values()].sort((a, b) => ts(b.ev.updatedAt) - ts(a.ev.updatedAt));
  $('dead-list').replaceChildren(...rows.map(({ ev, replaying, error }) => el('tr',
    { testid: 'dead-row', class: replaying ? 'replaying' : null, data: { eventId: ev.id, status: ev.status, kind: ev.kind, orderNo: ev.orderNo } },
    el('td', { class: 'mono' }, ev.id),
    el('td', { class: 'mono' }, ev.orderNo),
    el('td', {}, ev.kind),
    el('td', {}, badge(ev.status)),
    el('td', {}, ev.maxAttempts ? `${ev.attempts}/${ev.maxAttempts}` : ev.attempts),
    el('td', { class: 'err', title: error || ev.lastError }, error || ev.lastError || ''),
    el('td', { class: 'muted wide-only' }, fmtTime(ev.updatedAt)),
    el('td', {}, el('button', { class: 'replay', type: 'button', testid: 'replay-button', disabled: replaying ? '' : null,
      onclick: () => replay(ev.id) }, replaying ? 'Replaying…' : 'Replay')),
  )));
  $('dead-empty').hidden = rows.length > 0;
  $('dead-count').textContent = rows.length ? String(rows.length) : '';
}

// ---- tickets ----
async function loadTickets() {
  const started = Date.now();
  const data = await gql('OpenTickets');
  const next = new Map(data.exceptionTickets.edges.map(({ node }) => [node.id, { t: node, seen: 0 }]));
  for (const [id, row] of state.tickets) if (row.seen >= started && !next.has(id)) next.set(id, row);
  state.tickets = next;
  renderTickets();
}
function renderTickets() {
  const rows = [...state.tickets.values()].sort((a, b) => ts(b.t.openedAt) - ts(a.t.openedAt) || Number(b.t.id) - Number(a.t.id));
  $('ticket-list').replaceChildren(...rows.map(({ t }) => el('tr', { testid: 'ticket-row', data: { ticketId: t.id, kind: t.kind, orderNo: t.orderNo || '' } },
    el('td', { class: 'mono' }, el('a', { href: '/ops/tickets#ticket=' + encodeURIComponent(t.id), testid: 'ticket-link' }, t.id)),
    el('td', {}, t.kind), el('td', { class: 'mono' }, t.orderNo || '—'),
    el('td', { class: 'muted' }, fmtTime(t.openedAt)))));
  $('ticket-empty').hidden = rows.length > 0;
  $('ticket-count').textContent = rows.length ? String(rows.length) : '';
}

// ---- anomalies ----
async function loadAnomalies() {
  const from = new Date(); from.setHours(0, 0, 0, 0);
  const to = new Date(Date.now() + 86400000);
  const data = await gql('Anomalies', { from: from.toISOString(), to: to.toISOString() });
  renderChart(data.anomalyStats);
  loadHealing(from.toISOString(), to.toISOString()).catch(report);
  $('anomaly-when').textContent = 'at ' + new Date().toLocaleTimeString([], { hour12: false });
}
// Not one of the contract's operations: this server's extra field, asked on its own.
const HEALING_DOC = 'query Healing($from: DateTime!, $to: DateTime!) { reconciliationHealing(from: $from, to: $to) { category healed ticketed } }';
async function loadHealing(from, to) {
  const res = await fetch('/graphql', {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer ' + state.token },
    body: JSON.stringify({ query: HEALING_DOC, variables: { from, to } }),
  });
  const body = await res.json().catch(() => ({}));
  const rows = (body.data && body.data.reconciliationHealing) || [];
  $('healing-list').replaceChildren(...rows.map((r) => {
    const all = r.healed + r.ticketed;
    return el('tr', { data: { category: r.category, healed: String(r.healed), ticketed: String(r.ticketed) } },
      el('td', {}, r.category.toLowerCase().replace(/_/g, ' ')), el('td', {}, String(r.healed)),
      el('td', {}, String(r.ticketed)), el('td', {}, all ? Math.round((100 * r.healed) / all) + ' %' : '–'));
  }));
}
function renderChart(stats) {
  const NS = 'http://www.w3.org/2000/svg', W = 420, ROW = 20, LABEL = 190, BAR = 180;
  const svg = document.createElementNS(NS, 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${stats.length * ROW + 4}`);
  svg.setAttribute('role', 'img');
  const max = Math.max(1, ...stats.map((s) => s.count));
  const node = (tag, attrs, text) => {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text != null) n.textContent = text;
    return n;
  };
  stats.forEach((s, i) => {
    const y = i * ROW + 2, w = s.count ? Math.max(2, (s.count / max) * BAR) : 0;
    const g = node('g', { 'data-category': s.category, 'data-count': s.count });
    g.append(node('text', { x: 0, y: y + 13 }, s.category.toLowerCase().replace(/_/g, ' ')),
      node('rect', { class: 'track', x: LABEL, y: y + 3, width: BAR, height: 12, rx: 2 }),
      node('rect', { class: s.category === 'COMPENSATION_DEAD' || s.category === 'BAD_SIGNATURE' ? 'bar hot' : 'bar',
        x: LABEL, y: y + 3, width: w, height: 12, rx: 2 }),
      node('text', { x: LABEL + BAR + 8, y: y + 13 }, String(s.count)));
    svg.append(g);
  });
  $('anomaly-chart').replaceChildren(svg);
}
let anomalyTimer = null;
function anomaliesSoon() { clearTimeout(anomalyTimer); anomalyTimer = setTimeout(() => loadAnomalies().catch(report), 300); }

// ---- feeds ----
function prepend(list, empty, item) {
  list.prepend(item);
  while (list.children.length > FEED_MAX) list.lastChild.remove();
  $(empty).hidden = true;
}
function onComp({ compensationUpdates: ev }) {
  prepend($('comp-feed'), 'comp-empty', el('li', { testid: 'comp-entry', data: { eventId: ev.id, status: ev.status } },
    el('span', { class: 'muted mono' }, fmtTime(ev.updatedAt)), badge(ev.status), el('span', { class: 'muted mono' }, '#' + ev.id),
    el('span', {}, ev.kind),
    el('span', { class: 'mono' }, ev.orderNo), el('span', { class: 'muted' }, `${ev.attempts}/${ev.maxAttempts}`),
    el('span', { class: 'grow err', title: ev.lastError || '' }, ev.lastError || '')));
  applyComp(ev);
  renderDead();
}
function onOrder({ orderStatusChanged: c }) {
  prepend($('order-feed'), 'order-empty', el('li', { testid: 'order-entry', data: { orderNo: c.orderNo, toStatus: c.toStatus } },
    el('span', { class: 'muted mono' }, fmtTime(c.at)), el('span', { class: 'mono' }, c.orderNo),
    el('span', {}, (c.fromStatus || 'new') + ' → ' + c.toStatus), el('span', { class: 'grow muted' }, c.actor)));
}
function onTicket({ ticketOpened: t }) {
  state.tickets.set(t.id, { t, seen: Date.now() });
  renderTickets();
  anomaliesSoon();
}

// ---- live: the streams (/ops/assets/live.js speaks graphql-transport-ws) ----
const SUBSCRIPTIONS = [
  { op: 'CompensationUpdates', onNext: onComp },
  { op: 'OrderStatusChanges', onNext: onOrder },
  { op: 'TicketsOpened', onNext: onTicket },
];
const STATES = { connecting: 'connecting', reconnecting: 'reconnecting', notSubscribed: 'not subscribed' };
let conn = null;
function connect() {
  conn = live({
    token: state.token, doc: DOC, subscriptions: SUBSCRIPTIONS, report, refused: refuse, reconnected: refreshAll,
    status: (st, secs) => st === 'live' ? setStatus('live', 'live') : setStatus(st === 'offline' ? `offline · retry in ${secs}s` : STATES[st]),
  });
}
function stop() {
  clearInterval(refreshTimer); clearTimeout(anomalyTimer);
  if (conn) conn.stop();
  conn = null;
}

// ---- start ----
function report(e) { if (state.token) notice(e.message); }
function refreshAll() {
  return Promise.all([loadDead(), loadTickets(), loadAnomalies()]).then(() => notice(''), report);
}
let refreshTimer = null;
async function start(token) {
  state.token = token;
  $('login').hidden = true; $('board').hidden = false; $('logout').hidden = false;
  setStatus('loading');
  await refreshAll();
  if (state.token !== token) return; // refused while loading
  connect();
  refreshTimer = setInterval(refreshAll, 30000); // counts, and tickets resolved elsewhere
}
$('login').addEventListener('submit', (e) => {
  e.preventDefault();
  const t = $('token-input').value.trim().replace(/^Bearer\s+/i, '');
  if (!t) return;
  sessionStorage.setItem(TOKEN_KEY, t);
  start(t);
});
$('logout').addEventListener('click', () => { setStatus('signed out'); showLogin(''); });
window.addEventListener('hashchange', () => { const t = tokenFromHash(); if (t) { stop(); start(t); } });
const initial = tokenFromHash() || sessionStorage.getItem(TOKEN_KEY);
if (initial) start(initial); else { setStatus('no token'); showLogin(''); }
