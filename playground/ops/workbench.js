// The ops workbench: exception tickets (list, one ticket with its order's chain, the actions
// the server allows), anomaly charts; 简体中文 by default, English by choice. Talks to its own
// server only: GraphQL over HTTP, subscriptions over /graphql/ws (graphql-transport-ws).

import { t, initLang, setLang, lang, has } from './i18n.js';
import { stackedBars, hbars, healingBars, PALETTE } from './charts.js';
import { live } from './live.js';

const TOKEN_KEY = 'fitorder.ops.token'; // the same as the watch page's: one sign-in for both
const TZ = document.querySelector('meta[name="fitorder-timezone"]')?.content || 'Asia/Shanghai';
const $ = (id) => document.getElementById(id);

const TICKET_KINDS = ['PROVIDER_PAID_LOCAL_UNPAID', 'LOCAL_PAID_PROVIDER_MISSING', 'AMOUNT_MISMATCH', 'REFUND_MISMATCH',
  'PAID_AFTER_CANCEL', 'COMPENSATION_DEAD', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION', 'REFUND_OVERDUE'];
const TICKET_STATUSES = ['OPEN', 'IN_PROGRESS', 'RESOLVED', 'DISMISSED'];
const UNRESOLVED = ['OPEN', 'IN_PROGRESS'];
const CATEGORIES = ['DUPLICATE_CALLBACK', 'BAD_SIGNATURE', 'ILLEGAL_TRANSITION', 'PAID_AFTER_CANCEL', 'AMOUNT_MISMATCH',
  'ORDER_EXPIRED', 'DUPLICATE_CHECK_IN', 'COMPENSATION_RETRY', 'COMPENSATION_DEAD', 'RECONCILIATION_FINDING'];
const AGES = { any: 0, '1h': 3600e3, '24h': 86400e3, '3d': 3 * 86400e3, '7d': 7 * 86400e3 };
const PAGE = 100, MAX_PAGES = 10;

// ---- the documents ----
const TICKET_FIELDS = `id kind status provider orderNo providerTxnId localAmountCents providerAmountCents openedAt resolvedAt
  order { orderNo status store { id name } }`;
const DOC = `
query WbTickets($filter: TicketFilter, $first: Int, $after: String) {
  exceptionTickets(filter: $filter, first: $first, after: $after) {
    totalCount pageInfo { hasNextPage endCursor }
    edges { node { ${TICKET_FIELDS} } }
  }
}
query WbStores { stores { id name } }
query WbTicket($id: ID!) {
  exceptionTicket(id: $id) {
    ${TICKET_FIELDS} detail resolution note resolvedBy traceId
    actions { allowed refundCents refundAmountAdjustable }
    order {
      orderNo kind status itemName amountCents walletAmountCents paymentMethod onlineProvider sessionsTotal sessionsUsed
      createdAt paidAt canceledAt cancelReason refundedAt refundAmountCents providerTxnId traceId allowedTransitions
      store { id name }
      member { id name phone sessionCredits wallet { balanceCents frozenCents } }
      timeline { at kind actor fromStatus toStatus summary traceId }
      callbacks { id provider receivedAt verified outcome body eventType traceId }
      compensation { id kind status attempts maxAttempts nextAttemptAt lastError updatedAt traceId attemptLog { at ok error durationMs } }
      tickets { id kind status openedAt }
      membership {
        id status validFrom validTo frozenDays
        freezes { id from until endedAt reason actor }
        history { at kind actor reason summary traceId fromMember { id name } toMember { id name } }
      }
    }
  }
}
mutation WbResolve($id: ID!, $action: TicketAction!, $note: String, $amountCents: Int) {
  resolveTicket(id: $id, action: $action, note: $note, amountCents: $amountCents) {
    id status resolution note resolvedAt order { orderNo status refundAmountCents member { sessionCredits } }
  }
}
subscription WbOpened { ticketOpened { ${TICKET_FIELDS} } }
subscription WbChanged { ticketChanged { ${TICKET_FIELDS} } }
subscription WbCompensation { compensationUpdates { id orderNo kind status attempts maxAttempts updatedAt } }
`;

const state = {
  token: null,
  view: 'tickets',
  tickets: new Map(), // id -> ticket row
  total: 0,
  capped: false,
  fresh: new Set(),
  stores: [],
  ticket: null, // the open ticket (WbTicket answer)
  ticketId: null,
  result: null, // the last action's answer, shown on the ticket
  busy: false,
  dialog: null,
  anDays: 7,
  anStore: '',
};

// ---- DOM: text only through textContent; words from the dictionary, values marked data-raw ----
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v == null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'testid') e.dataset.testid = v;
    else if (k === 'data') Object.assign(e.dataset, v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'raw') e.dataset.raw = '';
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c != null && c !== false) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}
/** A value from the server or the user (an id, a name, an error text): not a word of the page. */
const raw = (v, cls) => el('span', { class: cls, raw: true }, v == null ? '' : String(v));
/** A word of the page, translated by key. */
const tr = (key) => ({ tr: key });
/**
 * The text of `key` as nodes: dictionary words as text, `{name}` values as data-raw spans
 * (or translated words when given as tr(key), or nodes as they are).
 */
function tx(key, vars = {}) {
  const frag = document.createDocumentFragment();
  const text = t(key, Object.fromEntries(Object.keys(vars).map((k) => [k, `\u0000${k}\u0000`])));
  for (const [i, part] of text.split('\u0000').entries()) {
    if (i % 2 === 0) { if (part) frag.append(document.createTextNode(part)); continue; }
    const v = vars[part];
    if (v instanceof Node) frag.append(v);
    else if (v && typeof v === 'object' && v.tr) frag.append(document.createTextNode(t(v.tr)));
    else frag.append(raw(v));
  }
  return frag;
}
/** An enum value from the server in words: `prefix.VALUE` when the dictionary has it. */
function word(prefix, value) {
  if (value == null) return raw('—');
  return has(`${prefix}.${value}`) ? document.createTextNode(t(`${prefix}.${value}`)) : raw(value);
}
const TONE = {
  OPEN: 'b-red', IN_PROGRESS: 'b-amber', RESOLVED: 'b-green', DISMISSED: '',
  WAIT_PAY: 'b-amber', PAID: 'b-blue', CONSUMING: 'b-blue', CONSUMED: '', CANCELED: '', REFUNDED: 'b-green',
  DEAD: 'b-red', RETRYING: 'b-amber', PENDING: 'b-blue', SUCCEEDED: 'b-green',
  ACTIVE: 'b-green', FROZEN: 'b-blue', EXPIRED: '', REVOKED: 'b-red',
};
const badge = (prefix, value, testid) => el('span', { class: 'badge ' + (TONE[value] || ''), testid, data: { value: value || '' } }, word(prefix, value));

// ---- formats: the business time zone, ¥ with two decimals ----
function fmtTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return new Intl.DateTimeFormat(lang() === 'zh' ? 'zh-CN' : 'en-GB', {
    timeZone: TZ, year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false,
  }).format(d);
}
function money(cents) {
  if (cents == null) return '—';
  const sign = cents < 0 ? '-' : '';
  const v = Math.abs(cents);
  const yuan = Math.floor(v / 100).toLocaleString('en-US');
  return `${sign}¥${yuan}.${String(v % 100).padStart(2, '0')}`;
}
function age(iso, now = Date.now()) {
  const ms = Math.max(0, now - Date.parse(iso));
  if (ms < 60e3) return t('age.justNow');
  if (ms < 3600e3) return t('age.minutes', { n: Math.floor(ms / 60e3) });
  if (ms < 2 * 86400e3) return t('age.hours', { n: Math.floor(ms / 3600e3) });
  return t('age.days', { n: Math.floor(ms / 86400e3) });
}
/** Parts of an instant in the business time zone. */
function zoned(ms) {
  const p = Object.fromEntries(new Intl.DateTimeFormat('en-US', { timeZone: TZ, hourCycle: 'h23', year: 'numeric', month: '2-digit',
    day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit' }).formatToParts(new Date(ms)).map((x) => [x.type, x.value]));
  return { y: +p.year, m: +p.month, d: +p.day, h: +p.hour, mi: +p.minute, s: +p.second };
}
/** The instant a business day begins (midnight in the business time zone). */
function dayStart(y, m, d) {
  const guess = Date.UTC(y, m - 1, d);
  let t0 = guess;
  for (let i = 0; i < 2; i++) {
    const z = zoned(t0);
    const offset = Date.UTC(z.y, z.m - 1, z.d, z.h, z.mi, z.s) - t0;
    t0 = guess - offset;
  }
  return t0;
}

// ---- static words ----
function applyStatic() {
  document.documentElement.lang = lang() === 'zh' ? 'zh-CN' : 'en';
  document.title = 'fitorder · ' + t('app.title');
  for (const n of document.querySelectorAll('[data-i18n]')) n.textContent = t(n.dataset.i18n);
  for (const n of document.querySelectorAll('[data-i18n-placeholder]')) n.placeholder = t(n.dataset.i18nPlaceholder);
  const other = lang() === 'zh' ? 'en' : 'zh';
  const b = $('lang');
  b.textContent = other === 'en' ? 'English' : '中文';
  b.lang = other === 'en' ? 'en' : 'zh-CN';
  b.dataset.to = other;
  $('tz').replaceChildren(tx('app.tz', { tz: TZ }));
  $('login-help').replaceChildren(tx('login.help', { ops: el('code', { raw: true }, 'ops'), admin: el('code', { raw: true }, 'admin'),
    cmd: el('code', { raw: true }, 'fitorder token --role ops --sub ops-1') }));
  fillSelect($('f-kind'), [['', t('filter.any')], ...TICKET_KINDS.map((k) => [k, t('kind.' + k)])]);
  fillSelect($('f-status'), [['UNRESOLVED', t('filter.unresolved')], ...TICKET_STATUSES.map((s) => [s, t('tstatus.' + s)]), ['', t('filter.any')]]);
  fillSelect($('f-age'), Object.keys(AGES).map((k) => [k, t('age.' + k)]));
  fillStores();
  fillSelect($('an-days'), [['7', t('an.days7')], ['30', t('an.days30')]]);
  setStatus(state.statusKey || 'conn.starting', state.statusVars, state.statusCls);
}
function fillSelect(sel, options) {
  const keep = sel.options.length ? sel.value : options[0][0]; // the first option is the default
  sel.replaceChildren(...options.map(([v, label]) => el('option', { value: v }, label)));
  if (options.some(([v]) => v === keep)) sel.value = keep;
}
function fillStores() {
  const opts = state.stores.map((s) => [s.id, s.name]);
  for (const [sel, all] of [[$('f-store'), t('filter.any')], [$('an-store'), t('an.allStores')]]) {
    const keep = sel.value;
    sel.replaceChildren(el('option', { value: '' }, all), ...opts.map(([v, label]) => el('option', { value: v, raw: true }, label)));
    if (opts.some(([v]) => v === keep)) sel.value = keep;
  }
}
function setStatus(key, vars, cls = '') {
  state.statusKey = key; state.statusVars = vars; state.statusCls = cls;
  const s = $('status');
  s.textContent = t(key, vars);
  s.className = cls;
  s.dataset.state = key;
}
function notice(node) {
  const n = $('notice');
  n.replaceChildren(...(node ? [node] : []));
  n.hidden = !node;
}

// ---- token ----
function tokenFromHash() {
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (!m) return null;
  const tok = decodeURIComponent(m[1]);
  sessionStorage.setItem(TOKEN_KEY, tok);
  const rest = location.hash.replace(/(^#|&)token=[^&]+/, '').replace(/^&/, '');
  history.replaceState(null, '', location.pathname + location.search + (rest && rest !== '#' ? '#' + rest.replace(/^#/, '') : ''));
  return tok;
}
function showLogin(messageKey) {
  stop();
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  $('board').hidden = true; $('logout').hidden = true; $('login').hidden = false;
  $('login-msg').textContent = messageKey ? t(messageKey) : '';
  $('token-input').value = '';
  $('token-input').focus();
}
function refuse() { showLogin('login.refused'); setStatus('conn.refused', {}, 'refused'); }

// ---- GraphQL over HTTP ----
class ServerError extends Error {
  constructor(message, code, traceId) { super(message); this.code = code; this.traceId = traceId; }
}
async function gql(operationName, variables = {}) {
  let res;
  try {
    res = await fetch('/graphql', {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json', authorization: 'Bearer ' + state.token },
      body: JSON.stringify({ query: DOC, operationName, variables }),
    });
  } catch (e) {
    throw new ServerError(e.message, 'NETWORK', null);
  }
  const traceId = res.headers.get('x-trace-id');
  let body;
  try { body = await res.json(); } catch { throw new ServerError('HTTP ' + res.status, 'HTTP', traceId); }
  if (body.errors && body.errors.length) {
    const e = body.errors[0];
    const code = (e.extensions && e.extensions.code) || 'ERROR';
    if (code === 'UNAUTHENTICATED') { refuse(); }
    throw new ServerError(body.errors.map((x) => x.message).join('; '), code, (e.extensions && e.extensions.traceId) || traceId);
  }
  return body.data;
}
function errorNode(e) {
  return el('span', {}, tx('err.load', { message: e.message }));
}

// ---- routing: #tickets (with filters), #ticket=ID, #anomalies ----
function route() {
  const h = location.hash.replace(/^#/, '');
  const m = h.match(/(?:^|&)ticket=(\d+)/);
  if (m) return { view: 'ticket', id: m[1] };
  if (/^anomalies/.test(h)) return { view: 'anomalies' };
  return { view: 'tickets' };
}
function render() {
  const r = route();
  state.view = r.view;
  $('view-list').hidden = r.view !== 'tickets';
  $('view-ticket').hidden = r.view !== 'ticket';
  $('view-anomalies').hidden = r.view !== 'anomalies';
  for (const a of document.querySelectorAll('header nav a')) {
    const cur = (a.getAttribute('href') === '#tickets' && r.view !== 'anomalies') || (a.getAttribute('href') === '#anomalies' && r.view === 'anomalies');
    a.classList.toggle('current', cur);
    if (cur) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  if (r.view === 'tickets') renderList();
  if (r.view === 'ticket') {
    if (state.ticketId !== r.id) { state.ticketId = r.id; state.ticket = null; state.result = null; loadTicket().catch(showLoadError); }
    renderTicket();
  }
  if (r.view === 'anomalies') loadAnomalies().catch(showLoadError);
}
function showLoadError(e) { if (state.token) notice(errorNode(e)); }

// ---- the list ----
function filters() {
  return { kind: $('f-kind').value, status: $('f-status').value, store: $('f-store').value, age: $('f-age').value, order: $('f-order').value.trim() };
}
function serverFilter() {
  const f = filters();
  const out = {};
  if (f.status === 'UNRESOLVED') out.status = UNRESOLVED; else if (f.status) out.status = [f.status];
  if (f.store) out.storeId = f.store;
  if (f.order) out.orderNo = f.order;
  return out; // kind and age are applied here, so that the counts per kind stay whole
}
let listSeq = 0;
async function loadTickets() {
  const seq = ++listSeq;
  const started = Date.now();
  const filter = serverFilter();
  const rows = new Map();
  let after = null, total = 0, pages = 0, more = true;
  while (more && pages < MAX_PAGES) {
    const d = (await gql('WbTickets', { filter, first: PAGE, after })).exceptionTickets;
    total = d.totalCount; pages++;
    for (const { node } of d.edges) rows.set(node.id, node);
    more = d.pageInfo.hasNextPage; after = d.pageInfo.endCursor;
  }
  if (seq !== listSeq) return;
  // What the streams brought after the query started is newer than its answer.
  for (const [id, tk] of state.tickets) if (tk._seen && tk._seen >= started) rows.set(id, tk);
  state.tickets = rows;
  state.total = total;
  state.capped = more;
  renderList();
}
function matches(tk, f = filters()) {
  if (f.status === 'UNRESOLVED' ? !UNRESOLVED.includes(tk.status) : f.status && tk.status !== f.status) return false;
  if (f.store && (!tk.order || tk.order.store.id !== f.store)) return false;
  if (f.order && tk.orderNo !== f.order) return false;
  if (AGES[f.age] && Date.now() - Date.parse(tk.openedAt) < AGES[f.age]) return false;
  return true;
}
function renderList() {
  const f = filters();
  const all = [...state.tickets.values()].filter((tk) => matches(tk, f));
  const counts = Object.fromEntries(TICKET_KINDS.map((k) => [k, 0]));
  for (const tk of all) counts[tk.kind] = (counts[tk.kind] || 0) + 1;
  $('kind-counts').replaceChildren(...TICKET_KINDS.map((k) => el('button', {
    type: 'button', class: 'chip', 'aria-pressed': String(f.kind === k), testid: 'kind-count', data: { kind: k, count: String(counts[k]) },
    onclick: () => { $('f-kind').value = f.kind === k ? '' : k; filtersChanged(false); },
  }, t('kind.' + k), el('b', { raw: true }, String(counts[k])))));
  const rows = all.filter((tk) => !f.kind || tk.kind === f.kind)
    .sort((a, b) => Date.parse(a.openedAt) - Date.parse(b.openedAt) || Number(a.id) - Number(b.id));
  $('ticket-rows').replaceChildren(...rows.map((tk) => el('tr', {
    testid: 'ticket-row', class: state.fresh.has(tk.id) ? 'fresh' : null,
    data: { ticketId: tk.id, kind: tk.kind, status: tk.status, orderNo: tk.orderNo || '', storeId: tk.order ? tk.order.store.id : '' },
  },
  el('td', {}, el('a', { href: '#ticket=' + tk.id, testid: 'ticket-link', raw: true }, '#' + tk.id),
    state.fresh.has(tk.id) ? el('span', { class: 'badge b-amber' }, ' ', t('list.new')) : null),
  el('td', {}, badge('kind', tk.kind)),
  el('td', {}, badge('tstatus', tk.status)),
  el('td', { class: 'wide-only' }, raw(tk.order ? tk.order.store.name : '—')),
  el('td', { class: 'mono' }, raw(tk.orderNo || '—')),
  el('td', { class: 'wide-only nowrap' }, raw(`${money(tk.localAmountCents)} / ${money(tk.providerAmountCents)}`)),
  el('td', { class: 'wide-only nowrap muted' }, raw(fmtTime(tk.openedAt))),
  el('td', { class: 'nowrap' }, age(tk.openedAt)))));
  $('list-empty').hidden = rows.length > 0;
  $('list-count').replaceChildren(tx('list.shown', { n: rows.length }));
  $('list-capped').hidden = !state.capped;
  if (state.capped) $('list-capped').replaceChildren(tx('list.capped', { n: state.tickets.size, total: state.total }));
}
function filtersChanged(reload) {
  const f = filters();
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(f)) if (v && !(k === 'status' && v === 'UNRESOLVED') && !(k === 'age' && v === 'any')) q.set(k, v);
  sessionStorage.setItem('fitorder.ops.filters', JSON.stringify(f));
  if (reload) loadTickets().catch(showLoadError); else renderList();
}
function restoreFilters() {
  try {
    const f = JSON.parse(sessionStorage.getItem('fitorder.ops.filters') || 'null');
    if (!f) return;
    $('f-kind').value = f.kind || ''; $('f-status').value = f.status || 'UNRESOLVED'; $('f-age').value = f.age || 'any';
    $('f-order').value = f.order || ''; state.pendingStore = f.store || '';
  } catch { /* ignore */ }
}

// ---- one ticket ----
let ticketSeq = 0;
async function loadTicket() {
  const seq = ++ticketSeq;
  const id = state.ticketId;
  const d = await gql('WbTicket', { id });
  if (seq !== ticketSeq || id !== state.ticketId) return;
  state.ticket = d.exceptionTicket;
  state.ticketMissing = !d.exceptionTicket;
  renderTicket();
}
function facts(pairs) {
  return el('dl', { class: 'facts' }, pairs.filter(Boolean).flatMap(([key, value, testid]) => [
    el('dt', {}, t(key)), el('dd', { testid }, value instanceof Node ? value : raw(value)),
  ]));
}
function copyButton(text) {
  const b = el('button', { type: 'button', class: 'copy', testid: 'copy-trace', data: { trace: text } }, t('chain.copy'));
  b.addEventListener('click', async () => {
    try { await navigator.clipboard.writeText(text); } catch {
      // No clipboard permission: select the id so that Ctrl+C copies it.
      const r = document.createRange();
      r.selectNodeContents(b.parentElement.querySelector('[data-raw]') || b);
      const sel = getSelection(); sel.removeAllRanges(); sel.addRange(r);
    }
    b.textContent = t('chain.copied');
    setTimeout(() => { b.textContent = t('chain.copy'); }, 1500);
  });
  return b;
}
function traceLine(traceId, labelled = true) {
  if (!traceId) return null;
  return el('span', { class: 'trace' }, labelled ? t('f.traceId') + ' ' : null, raw(traceId, 'mono'), ' ', copyButton(traceId));
}
const DETAIL_KEYS = ['why', 'status', 'canceledAt', 'cancelReason', 'action', 'eventId', 'kind', 'attempts', 'lastError', 'idempotencyKey',
  'refundNo', 'refundStatus', 'refundDueBy', 'refundedAt', 'tradeStatus', 'refundedTotalCents', 'askedTotalCents', 'source', 'billDate',
  'firstTxnId', 'line'];
function detailValue(k, v, kind) {
  if (v == null || v === '') return raw('—');
  if (k === 'status') return word('ostatus', v);
  // An overdue refund's status is its PROVIDER_REFUND event's (a refund mismatch's is the provider's own word).
  if (k === 'refundStatus' && kind === 'REFUND_OVERDUE') return word('cstatus', v);
  if (k === 'kind') return word('ckind', v);
  if (k === 'source') return word('source', v);
  if (k.endsWith('Cents') && typeof v === 'number') return raw(money(v));
  if (k.endsWith('At') && typeof v === 'string') return raw(fmtTime(v));
  if (typeof v === 'object') return raw(JSON.stringify(v));
  return raw(v);
}
function renderFound(tk) {
  let detail = {};
  try { detail = JSON.parse(tk.detail || '{}') || {}; } catch { detail = {}; }
  const diff = tk.localAmountCents != null && tk.providerAmountCents != null ? Math.abs(tk.localAmountCents - tk.providerAmountCents) : null;
  const sentence = el('p', { class: 'found-text', testid: 'found-text' },
    tx('found.' + tk.kind, { local: money(tk.localAmountCents), provider: money(tk.providerAmountCents), diff: money(diff), due: detail.refundDueBy }));
  const known = DETAIL_KEYS.filter((k) => k in detail && k !== 'why');
  const other = Object.keys(detail).filter((k) => !DETAIL_KEYS.includes(k));
  return el('div', { class: 'panel', testid: 'found' },
    el('h2', {}, t('detail.found')),
    sentence,
    facts([
      ['f.kind', badge('kind', tk.kind)],
      ['f.status', badge('tstatus', tk.status, 'ticket-status')],
      tk.provider && ['f.provider', word('method', tk.provider)],
      tk.providerTxnId && ['f.providerTxnId', el('span', {}, raw(tk.providerTxnId, 'mono')), 'provider-txn'],
      ['f.localAmount', money(tk.localAmountCents), 'local-amount'],
      ['f.providerAmount', money(tk.providerAmountCents), 'provider-amount'],
      diff != null && diff > 0 && ['f.difference', money(diff)],
      ['f.openedAt', fmtTime(tk.openedAt), 'opened-at'],
      ...known.map((k) => ['d.' + k, detailValue(k, detail[k], tk.kind)]),
      detail.why && ['d.why', raw(detail.why)],
      ...other.map((k) => ['d.other', el('span', {}, raw(k, 'mono'), ': ', detailValue(k, detail[k]))]),
      tk.resolvedAt && ['f.resolvedAt', fmtTime(tk.resolvedAt)],
      tk.resolution && ['f.resolution', word('action', tk.resolution)],
      tk.note && ['f.note', tk.note, 'ticket-note'],
      tk.resolvedBy && ['f.resolvedBy', tk.resolvedBy],
      ['f.traceId', traceLine(tk.traceId, false)],
    ]));
}
function renderOrder(o) {
  if (!o) return el('div', { class: 'panel', testid: 'order' }, el('h2', {}, t('detail.order')), el('p', { class: 'empty' }, t('detail.noOrder')));
  const m = o.member;
  return el('div', { class: 'panel', testid: 'order', data: { orderNo: o.orderNo, status: o.status } },
    el('h2', {}, t('detail.order')),
    facts([
      ['f.orderNo', el('span', {}, raw(o.orderNo, 'mono'))],
      ['f.status', badge('ostatus', o.status, 'order-status')],
      ['f.store', o.store.name],
      ['f.member', el('span', {}, raw(m.name), ' · ', raw(m.phone, 'mono'))],
      ['f.item', el('span', {}, raw(o.itemName), ' · ', word('okind', o.kind))],
      ['f.amount', money(o.amountCents), 'order-amount'],
      o.walletAmountCents > 0 && o.paymentMethod !== 'WALLET' && ['f.walletPart', money(o.walletAmountCents)],
      ['f.paymentMethod', word('method', o.paymentMethod)],
      o.sessionsTotal > 0 && ['f.sessions', tx('f.sessionsValue', { used: o.sessionsUsed, total: o.sessionsTotal })],
      ['f.sessionCredits', String(m.sessionCredits), 'session-credits'],
      ['f.wallet', tx('f.walletValue', { balance: money(m.wallet.balanceCents), frozen: money(m.wallet.frozenCents) })],
      ['f.createdAt', fmtTime(o.createdAt)],
      o.paidAt && ['f.paidAt', fmtTime(o.paidAt)],
      o.canceledAt && ['f.canceledAt', fmtTime(o.canceledAt)],
      o.cancelReason && ['f.cancelReason', o.cancelReason],
      o.refundedAt && ['f.refundedAt', fmtTime(o.refundedAt)],
      o.refundAmountCents != null && ['f.refundAmount', money(o.refundAmountCents), 'order-refund-amount'],
      ['f.allowedTransitions', o.allowedTransitions.length
        ? el('span', {}, ...o.allowedTransitions.flatMap((s, i) => [i ? ' ' : null, badge('ostatus', s)]))
        : document.createTextNode(t('f.none'))],
      ['f.traceId', traceLine(o.traceId, false)],
    ]));
}

// ---- the chain: one time line of everything that happened to the order ----
// Signatures, the payer's and the merchant's identifiers, encrypted parts: not for the screen.
const SECRET_KEY = /(^|_)(sign|openid|unionid|ciphertext|nonce|associated_data|mchid|mch_id|appid|app_id|notify_id|serial|secret|token|key|phone|mobile|email|cert_sn)$|^buyer_(id|logon_id|open_id|user_id)$|^seller_(id|email)$/i;
function maskValue(v) {
  if (v == null) return v;
  if (typeof v === 'object') return Array.isArray(v) ? v.map(maskValue) : Object.fromEntries(Object.entries(v).map(([k, x]) => [k, maskValue(x)]));
  const s = String(v);
  return s.length > 6 ? s.slice(0, 2) + '***' + s.slice(-2) : '***';
}
function mask(v) {
  if (Array.isArray(v)) return v.map(mask);
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, SECRET_KEY.test(k) ? maskValue(x) : mask(x)]));
  return v;
}
/** The payload as received, pretty, with its secrets masked (JSON, or Alipay's form fields). */
export function prettyPayload(body) {
  if (!body) return '';
  try { return JSON.stringify(mask(JSON.parse(body)), null, 2); } catch { /* not JSON */ }
  if (/^[\w.%-]+=/.test(body) && body.includes('&')) {
    const o = {};
    for (const [k, v] of new URLSearchParams(body)) o[k] = v;
    return JSON.stringify(mask(o), null, 2);
  }
  return body.replace(/("?(?:sign|openid|buyer_id|buyer_logon_id)"?\s*[:=]\s*"?)([^"&,\s]+)/gi, (_, k, v) => k + maskValue(v));
}
function chainEntries(o) {
  const out = [];
  for (const e of o.timeline) {
    if (e.kind === 'STATUS_CHANGE') {
      const reason = e.summary.includes(': ') ? e.summary.slice(e.summary.indexOf(': ') + 2) : '';
      out.push({ at: e.at, type: 'STATUS_CHANGE', trace: e.traceId, tone: e.toStatus === 'CANCELED' ? 'bad' : 'good',
        head: e.fromStatus ? tx('chain.statusChange', { from: badge('ostatus', e.fromStatus), to: badge('ostatus', e.toStatus) })
          : tx('chain.created', { to: badge('ostatus', e.toStatus) }),
        meta: [[t('chain.by'), raw(e.actor, 'mono')], reason && [t('chain.reason'), raw(reason)]] });
    } else if (e.kind === 'COMPENSATION_REPLAY') {
      const kind = e.summary.split(' ')[0];
      out.push({ at: e.at, type: 'REPLAY', trace: e.traceId, head: tx('chain.replay', { kind: word('ckind', kind) }),
        meta: [[t('chain.by'), raw(e.actor, 'mono')]] });
    } else if (e.kind === 'CHECK_IN') {
      const m = e.summary.match(/^check-in (.+): (\d+) session\(s\), (\d+) left$/);
      out.push({ at: e.at, type: 'CHECK_IN', trace: e.traceId,
        head: m ? tx('chain.checkIn', { txn: m[1], n: m[2], left: m[3] }) : el('span', {}, t('chain.checkInRaw'), ' ', raw(e.summary)),
        meta: [[t('chain.by'), raw(e.actor, 'mono')]] });
    } else if (!['CALLBACK', 'COMPENSATION_ATTEMPT', 'TICKET'].includes(e.kind)) {
      out.push({ at: e.at, type: 'OTHER', trace: e.traceId, head: el('span', {}, t('chain.other'), ' ', raw(e.kind, 'mono'), ' ', raw(e.summary)),
        meta: [[t('chain.by'), raw(e.actor, 'mono')]] });
    }
  }
  for (const c of o.callbacks) {
    const outcome = has('outcome.' + c.outcome) ? tr('outcome.' + c.outcome) : c.outcome;
    out.push({ at: c.receivedAt, type: 'CALLBACK', trace: c.traceId, tone: c.outcome === 'APPLIED' ? 'good' : c.verified ? null : 'bad',
      head: tx('chain.callback', { provider: word('method', c.provider), outcome: outcome.tr ? document.createTextNode(t(outcome.tr)) : raw(outcome) }),
      meta: [[null, document.createTextNode(t(c.verified ? 'chain.verified' : 'chain.unverified'))], c.eventType && [null, raw(c.eventType, 'mono')]],
      body: el('details', { testid: 'payload' }, el('summary', {}, t('chain.showPayload')),
        el('div', { class: 'muted' }, t('chain.payload')), el('pre', { class: 'payload', raw: true }, prettyPayload(c.body))) });
  }
  for (const ev of o.compensation) {
    ev.attemptLog.forEach((a, i) => {
      out.push({ at: a.at, type: 'COMPENSATION', trace: ev.traceId, tone: a.ok ? 'good' : 'bad',
        head: tx(a.ok ? 'chain.attemptOk' : 'chain.attemptFailed', { kind: word('ckind', ev.kind), n: i + 1, ms: a.durationMs }),
        meta: [a.error && [t('chain.error'), raw(a.error)]] });
    });
    out.push({ at: ev.updatedAt, type: 'COMPENSATION', trace: ev.traceId, tone: ev.status === 'DEAD' ? 'bad' : ev.status === 'SUCCEEDED' ? 'good' : null,
      testid: 'compensation-state', data: { eventId: ev.id, status: ev.status, kind: ev.kind },
      head: tx('chain.eventNow', { id: ev.id, kind: word('ckind', ev.kind), status: badge('cstatus', ev.status), attempts: ev.attempts, max: ev.maxAttempts }),
      meta: [ev.lastError && ev.status !== 'SUCCEEDED' && [t('chain.error'), raw(ev.lastError)]] });
  }
  for (const tk of o.tickets) {
    out.push({ at: tk.openedAt, type: 'TICKET', trace: null, tone: 'bad',
      head: tx('chain.ticket', { id: el('a', { href: '#ticket=' + tk.id, raw: true }, '#' + tk.id), kind: word('kind', tk.kind), status: word('tstatus', tk.status) }) });
  }
  if (o.refundedAt) {
    out.push({ at: o.refundedAt, type: 'REFUND', trace: null, tone: 'good', head: tx('chain.refund', { amount: money(o.refundAmountCents) }) });
  }
  return out.map((x, i) => ({ ...x, i })).sort((a, b) => Date.parse(a.at) - Date.parse(b.at) || a.i - b.i);
}
function renderChain(o) {
  const entries = o ? chainEntries(o) : [];
  return el('div', { class: 'panel span2', testid: 'chain' },
    el('h2', {}, t('detail.chain')),
    entries.length ? el('ol', { class: 'chain' }, entries.map((x) => el('li', {
      class: x.tone, testid: x.testid || 'chain-entry', data: { type: x.type, ...(x.data || {}) },
    },
    el('div', { class: 'entry-head' }, el('span', { class: 'when' }, raw(fmtTime(x.at))), el('span', { class: 'badge' }, t('chain.t.' + x.type)), el('span', {}, x.head)),
    el('div', { class: 'entry-meta' }, (x.meta || []).filter(Boolean).map(([label, v]) => el('span', {}, label ? label + ' ' : null, v)), traceLine(x.trace)),
    x.body || null))) : el('p', { class: 'empty' }, t('chain.empty')));
}

// ---- the card: a membership order's card, its freezes and its history ----
/** The server's summary of a card event in words (its known forms), else as it is. */
const CARD_SUMMARIES = [
  [/^started: (\d+) days of (.+)$/, 'card.s.started', ['days', 'item']],
  [/^started \(recorded when history began\)$/, 'card.s.backfilled', []],
  [/^frozen from (\S+) until (\S+) \((\d+) days?\)$/, 'card.freezeSpan', ['from', 'until', 'days']],
  [/^freeze scheduled from (\S+) until (\S+) \((\d+) days?\)$/, 'card.s.scheduled', ['from', 'until', 'days']],
  [/^freeze ended: frozen (\S+) until (\S+)$/, 'card.s.ended', ['from', 'until']],
  [/^unfrozen early: frozen (\S+) until (\S+) \((\d+) days?\), (\d+) days? not served$/, 'card.s.unfrozenEarly', ['from', 'until', 'days', 'back']],
  [/^scheduled freeze (\S+) until (\S+) called off$/, 'card.s.calledOff', ['from', 'until']],
  [/^expired: valid until (.+)$/, 'card.s.expired', ['to']],
  [/^revoked: its order was refunded$/, 'card.s.revoked', []],
  [/^transferred from member (\d+) to member (\d+), (\d+) days? left, fee ¥(\S+)$/, 'card.s.transferred', ['from', 'to', 'days', 'fee']],
];
function cardSummary(summary) {
  for (const [re, key, names] of CARD_SUMMARIES) {
    const m = summary.match(re);
    if (m) return tx(key, Object.fromEntries(names.map((n, i) => [n, m[i + 1]])));
  }
  return raw(summary);
}
/** Today in the business time zone, as YYYY-MM-DD (the form of a freeze's dates). */
function businessToday() {
  const z = zoned(Date.now());
  return `${z.y}-${String(z.m).padStart(2, '0')}-${String(z.d).padStart(2, '0')}`;
}
const dateDays = (from, until) => Math.round((Date.parse(until) - Date.parse(from)) / 86400e3);
/** Where a freeze stands: called off, ended early, scheduled, running or over. */
function freezeState(f, today = businessToday()) {
  if (f.endedAt) return f.until === f.from ? 'CALLED_OFF' : 'ENDED_EARLY';
  if (f.from > today) return 'SCHEDULED';
  return f.until <= today ? 'OVER' : 'RUNNING';
}
function renderFreezes(freezes) {
  if (!freezes.length) return el('p', { class: 'empty' }, t('card.noFreezes'));
  return el('ul', { class: 'freezes' }, freezes.map((f) => {
    const st = freezeState(f);
    return el('li', { testid: 'card-freeze', data: { freezeId: f.id, state: st, from: f.from, until: f.until } },
      el('div', { class: 'entry-head' }, el('span', { class: 'badge', data: { value: st } }, t('fstate.' + st)),
        el('span', {}, st === 'CALLED_OFF' ? tx('card.calledOffSpan', { from: f.from })
          : tx('card.freezeSpan', { from: f.from, until: f.until, days: dateDays(f.from, f.until) }))),
      el('div', { class: 'entry-meta' },
        f.endedAt ? el('span', {}, tx('card.endedAt', { at: fmtTime(f.endedAt) })) : null,
        el('span', {}, t('chain.by') + ' ', raw(f.actor, 'mono')),
        el('span', {}, t('chain.reason') + ' ', raw(f.reason))));
  }));
}
const holder = (m) => (m ? raw(m.name || '#' + m.id) : raw('—'));
const EVENT_TONE = { STARTED: 'good', UNFROZEN: 'good', EXPIRED: 'bad', REVOKED: 'bad' };
function renderCardHistory(history) {
  if (!history.length) return el('p', { class: 'empty' }, t('card.noHistory'));
  const events = history.map((e, i) => ({ ...e, i })).sort((a, b) => Date.parse(a.at) - Date.parse(b.at) || a.i - b.i);
  return el('ol', { class: 'chain' }, events.map((e) => el('li', {
    class: EVENT_TONE[e.kind], testid: 'card-event', data: { kind: e.kind, summary: e.summary },
  },
  el('div', { class: 'entry-head' }, el('span', { class: 'when' }, raw(fmtTime(e.at))), badge('mevent', e.kind, 'card-event-kind'),
    el('span', { testid: 'card-event-summary' }, cardSummary(e.summary))),
  el('div', { class: 'entry-meta' },
    el('span', {}, t('chain.by') + ' ', raw(e.actor, 'mono')),
    e.reason ? el('span', {}, t('chain.reason') + ' ', raw(e.reason)) : null,
    e.kind === 'TRANSFERRED' ? el('span', {}, tx('card.holders', { from: holder(e.fromMember), to: holder(e.toMember) })) : null,
    traceLine(e.traceId)))));
}
function renderCard(o) {
  const c = o && o.membership;
  if (!c) return null;
  return el('div', { class: 'panel span2', testid: 'card', data: { cardId: c.id, status: c.status, frozenDays: String(c.frozenDays) } },
    el('h2', {}, t('detail.card')),
    facts([
      ['card.status', badge('mstatus', c.status, 'card-status')],
      ['card.validFrom', fmtTime(c.validFrom)],
      ['card.validTo', fmtTime(c.validTo), 'card-valid-to'],
      ['card.frozenDays', tx('card.days', { n: c.frozenDays }), 'card-frozen-days'],
    ]),
    el('h3', {}, t('card.freezes')),
    renderFreezes(c.freezes),
    el('h3', {}, t('card.history')),
    renderCardHistory(c.history));
}
function renderOtherTickets(tk) {
  const others = tk.order ? tk.order.tickets.filter((x) => x.id !== tk.id) : [];
  return el('div', { class: 'panel', testid: 'other-tickets' },
    el('h2', {}, t('detail.otherTickets')),
    others.length ? el('ul', {}, others.map((x) => el('li', { testid: 'other-ticket', data: { ticketId: x.id } },
      el('a', { href: '#ticket=' + x.id, raw: true }, '#' + x.id), ' ', badge('kind', x.kind), ' ', badge('tstatus', x.status), ' ', raw(fmtTime(x.openedAt), 'muted'))))
      : el('p', { class: 'empty' }, t(tk.order ? 'detail.noOtherTickets' : 'detail.noOrder')));
}
function renderActions(tk) {
  const allowed = tk.actions.allowed;
  const box = el('div', { class: 'panel span2', testid: 'actions' }, el('h2', {}, t('act.heading')));
  if (allowed.length) {
    box.append(el('div', { class: 'actions' }, allowed.map((a) => el('button', {
      type: 'button', testid: 'action', data: { action: a }, onclick: () => openDialog(a),
    }, t('action.' + a)))));
  } else {
    box.append(el('p', { class: 'empty', testid: 'no-actions' }, t(['RESOLVED', 'DISMISSED'].includes(tk.status) ? 'detail.closed' : 'detail.nothingAllowed')));
  }
  if (state.result) box.append(state.result);
  return box;
}
function renderTicket() {
  const v = $('view-ticket');
  const back = el('p', {}, el('a', { href: '#tickets', testid: 'back' }, t('detail.back')));
  const tk = state.ticket;
  if (!tk) {
    v.replaceChildren(back, el('p', { class: 'empty' }, state.ticketMissing ? tx('detail.notFound', { id: state.ticketId }) : t('detail.loading')));
    return;
  }
  v.replaceChildren(back,
    el('h2', { class: 'ticket-title' }, tx('detail.heading', { id: tk.id }), ' ', badge('kind', tk.kind), ' ', badge('tstatus', tk.status)),
    el('div', { class: 'detail-grid', testid: 'ticket', data: { ticketId: tk.id, kind: tk.kind, status: tk.status } },
      renderActions(tk), renderFound(tk), renderOrder(tk.order), renderOtherTickets(tk), renderChain(tk.order), renderCard(tk.order)));
}

// ---- actions: a confirmation that says what happens, the server's answer, no double submit ----
function what(action) {
  const tk = state.ticket, o = tk.order;
  const member = o ? o.member.name : '—';
  const common = { order: o ? o.orderNo : '—', member, txn: tk.providerTxnId || '—', status: o ? word('ostatus', o.status) : '—' };
  switch (action) {
    case 'REFUND': {
      const amount = money(tk.actions.refundCents);
      if (tk.actions.refundAmountAdjustable) {
        const way = { WALLET: tr('act.way.wallet'), MIXED: tr('act.way.mixed'), OFFLINE: tr('act.way.offline') }[o.paymentMethod]
          || tx('act.way.online', { provider: word('method', o.onlineProvider || o.paymentMethod) });
        return tx('act.what.REFUND.own', { ...common, amount, way: way.tr ? document.createTextNode(t(way.tr)) : way });
      }
      return tx('act.what.REFUND.stray', { ...common, amount, provider: word('method', tk.provider) });
    }
    case 'CREDIT_SESSIONS':
      return tx('act.what.CREDIT_SESSIONS', { ...common, n: o.sessionsTotal - o.sessionsUsed });
    case 'MARK_PAID':
      return tx('act.what.MARK_PAID', { ...common, amount: money(tk.providerAmountCents ?? o.amountCents) });
    case 'REPLAY_COMPENSATION': {
      let d = {};
      try { d = JSON.parse(tk.detail); } catch { /* none */ }
      return tx('act.what.REPLAY_COMPENSATION', { event: d.eventId, kind: word('ckind', d.kind) });
    }
    default:
      return tx('act.what.NO_ACTION');
  }
}
function openDialog(action) {
  if (state.busy) return;
  const tk = state.ticket;
  state.dialog = { action, ticketId: tk.id };
  $('confirm-title').replaceChildren(tx('act.confirmTitle', { action: tr('action.' + action) }));
  $('confirm-what').replaceChildren(what(action));
  const adjustable = action === 'REFUND' && tk.actions.refundAmountAdjustable;
  $('confirm-amount').hidden = !adjustable;
  if (adjustable) {
    $('confirm-share').replaceChildren(tx('act.wholeShare', { amount: money(tk.actions.refundCents) }));
    document.querySelector('input[name=refund][value=share]').checked = true;
    $('confirm-amount-input').value = '';
  }
  $('confirm-note').value = '';
  $('confirm-msg').textContent = '';
  setBusy(false);
  $('confirm').showModal();
  (adjustable ? document.querySelector('input[name=refund][value=share]') : $('confirm-note')).focus();
}
function setBusy(busy) {
  state.busy = busy;
  $('confirm-ok').disabled = busy;
  $('confirm-ok').textContent = t(busy ? 'act.submitting' : 'act.confirm');
  for (const b of document.querySelectorAll('[data-testid=action]')) b.disabled = busy;
}
function parseYuan(text) {
  const m = text.trim().replace(/^¥/, '').match(/^(\d+)(?:\.(\d{1,2}))?$/);
  if (!m) return null;
  return Number(m[1]) * 100 + Number((m[2] || '').padEnd(2, '0'));
}
async function submitDialog(e) {
  e.preventDefault();
  if (state.busy || !state.dialog) return; // a second click or Enter while the first is on its way
  const { action, ticketId } = state.dialog;
  const tk = state.ticket, o = tk.order;
  const note = $('confirm-note').value.trim();
  const vars = { id: ticketId, action, note: note || null, amountCents: null };
  if (action === 'NO_ACTION' && !note) { $('confirm-msg').textContent = t('act.noteRequired'); $('confirm-note').focus(); return; }
  if (action === 'REFUND' && tk.actions.refundAmountAdjustable && document.querySelector('input[name=refund][value=amount]').checked) {
    const cents = parseYuan($('confirm-amount-input').value);
    if (cents == null || cents <= 0 || cents > o.amountCents) {
      $('confirm-msg').textContent = t('act.amountInvalid', { max: money(o.amountCents) });
      $('confirm-amount-input').focus();
      return;
    }
    vars.amountCents = cents;
  }
  setBusy(true);
  try {
    const r = (await gql('WbResolve', vars)).resolveTicket;
    state.result = el('div', { class: 'result ok', testid: 'action-result', data: { outcome: 'ok', status: r.status } },
      el('div', {}, tx('act.done', { id: r.id, status: word('tstatus', r.status), action: word('action', r.resolution) })),
      r.order ? el('div', {}, tx('act.doneOrder', { order: r.order.orderNo, status: word('ostatus', r.order.status) })) : null);
  } catch (err) {
    state.result = el('div', { class: 'result bad', testid: 'action-result', data: { outcome: 'error', code: err.code || '' }, role: 'alert' },
      el('div', {}, err.code === 'NETWORK' ? tx('act.network', { message: err.message }) : tx('act.refused', { message: err.message })),
      el('div', { class: 'entry-meta' }, el('span', {}, tx('act.code', { code: err.code })), traceLine(err.traceId)));
  }
  $('confirm').close();
  state.dialog = null;
  setBusy(false);
  await loadTicket().catch(showLoadError);
  loadTickets().catch(showLoadError);
  document.querySelector('[data-testid=action-result]')?.setAttribute('tabindex', '-1');
  document.querySelector('[data-testid=action-result]')?.focus();
}

// ---- anomalies ----
let anSeq = 0;
async function loadAnomalies() {
  const seq = ++anSeq;
  const days = Number($('an-days').value || 7), store = $('an-store').value || null;
  const now = zoned(Date.now());
  const starts = [];
  for (let i = days - 1; i >= -1; i--) {
    const d = new Date(Date.UTC(now.y, now.m - 1, now.d - i));
    starts.push({ y: d.getUTCFullYear(), m: d.getUTCMonth() + 1, d: d.getUTCDate() });
  }
  const bounds = starts.map((s) => new Date(dayStart(s.y, s.m, s.d)).toISOString());
  // One request: an aliased anomalyStats per business day, and the window's healing.
  const parts = [];
  for (let i = 0; i < days; i++) parts.push(`d${i}: anomalyStats(from: "${bounds[i]}", to: "${bounds[i + 1]}", storeId: $store) { category count }`);
  parts.push(`healing: reconciliationHealing(from: "${bounds[0]}", to: "${bounds[days]}", storeId: $store) { category healed ticketed }`);
  const query = `query WbAnomalies($store: ID) { ${parts.join('\n')} }`;
  const res = await fetch('/graphql', {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json', authorization: 'Bearer ' + state.token },
    body: JSON.stringify({ query, variables: { store } }),
  });
  const body = await res.json();
  if (body.errors) throw new ServerError(body.errors.map((x) => x.message).join('; '), body.errors[0].extensions?.code, res.headers.get('x-trace-id'));
  if (seq !== anSeq) return;
  const series = CATEGORIES.map((c, i) => ({ key: c, label: t('cat.' + c), colour: PALETTE[i % PALETTE.length] }));
  const dayRows = [];
  const totals = Object.fromEntries(CATEGORIES.map((c) => [c, 0]));
  for (let i = 0; i < days; i++) {
    const values = {};
    for (const s of body.data['d' + i]) { values[s.category] = s.count; totals[s.category] += s.count; }
    const s = starts[i];
    dayRows.push({ key: `${s.y}-${String(s.m).padStart(2, '0')}-${String(s.d).padStart(2, '0')}`, label: `${String(s.m).padStart(2, '0')}-${String(s.d).padStart(2, '0')}`, values });
  }
  $('an-daily').replaceChildren(stackedBars({ days: dayRows, series, label: t('an.perDay'), title: (d, n) => t('an.dayTotal', { day: d.key, n }) }));
  const used = series.filter((s) => totals[s.key] > 0);
  $('an-legend').replaceChildren(...used.map((s) => el('span', {}, el('i', { class: 'sw', data: { colour: s.colour } }), s.label)));
  for (const i of $('an-legend').querySelectorAll('i')) i.style.background = i.dataset.colour;
  $('an-cats').replaceChildren(hbars({ items: series.map((s) => ({ ...s, count: totals[s.key] })), label: t('an.perCategory') }));
  const heal = body.data.healing;
  if (heal.every((h) => h.healed + h.ticketed === 0)) {
    $('an-healing').replaceChildren(el('p', { class: 'empty' }, t('an.noFindings')), healingChart(heal));
  } else $('an-healing').replaceChildren(healingChart(heal));
}
function healingChart(heal) {
  return healingBars({
    rows: heal.map((h) => ({ key: h.category, label: has('kind.' + h.category) ? t('kind.' + h.category) : h.category, healed: h.healed, ticketed: h.ticketed,
      share: h.healed + h.ticketed ? t('an.share', { p: Math.round((100 * h.healed) / (h.healed + h.ticketed)) }) : '–' })),
    label: t('an.healing'), healedLabel: t('an.healed'), ticketedLabel: t('an.ticketed'),
  });
}

// ---- live: the streams (live.js speaks graphql-transport-ws) ----
function onTicket(tk, opened) {
  tk._seen = Date.now();
  if (opened) state.fresh.add(tk.id);
  state.tickets.set(tk.id, tk);
  if (state.view === 'tickets') renderList();
  if (state.ticket && (state.ticket.id === tk.id || (state.ticket.order && state.ticket.order.orderNo === tk.orderNo))) {
    reloadTicketSoon();
  }
}
let ticketTimer = null;
function reloadTicketSoon() { clearTimeout(ticketTimer); ticketTimer = setTimeout(() => loadTicket().catch(showLoadError), 250); }
const SUBSCRIPTIONS = [
  { op: 'WbOpened', onNext: (d) => onTicket(d.ticketOpened, true) },
  { op: 'WbChanged', onNext: (d) => onTicket(d.ticketChanged, false) },
  { op: 'WbCompensation', onNext: (d) => { if (state.ticket && state.ticket.order && state.ticket.order.orderNo === d.compensationUpdates.orderNo) reloadTicketSoon(); } },
];
let conn = null;
const STATES = { connecting: 'conn.connecting', reconnecting: 'conn.reconnecting', live: 'conn.live', offline: 'conn.offline', notSubscribed: 'conn.notSubscribed' };
function connect() {
  conn = live({
    token: state.token, doc: DOC, subscriptions: SUBSCRIPTIONS,
    status: (st, s) => setStatus(STATES[st], { s }, st === 'live' ? 'live' : ''),
    refused: refuse,
    reconnected: refreshAll,
  });
}
function stop() {
  clearInterval(refreshTimer);
  if (conn) conn.stop();
  conn = null;
}

// ---- start ----
async function loadStores() {
  state.stores = (await gql('WbStores')).stores;
  fillStores();
  if (state.pendingStore) { $('f-store').value = state.pendingStore; state.pendingStore = null; }
}
function refreshAll() {
  const jobs = [loadTickets()];
  if (state.view === 'ticket' && state.ticketId) jobs.push(loadTicket());
  if (state.view === 'anomalies') jobs.push(loadAnomalies());
  return Promise.all(jobs).then(() => notice(null), showLoadError);
}
let refreshTimer = null;
async function start(token) {
  state.token = token;
  $('login').hidden = true; $('board').hidden = false; $('logout').hidden = false;
  setStatus('conn.loading');
  render();
  try { await loadStores(); } catch (e) { showLoadError(e); }
  if (state.token !== token) return;
  await refreshAll();
  if (state.token !== token) return;
  connect();
  refreshTimer = setInterval(() => { if (state.view === 'tickets') renderList(); }, 60000); // ages
}

initLang(localStorage);
applyStatic();
restoreFilters();
$('lang').addEventListener('click', () => {
  setLang($('lang').dataset.to, localStorage);
  applyStatic();
  render();
});
for (const id of ['f-kind', 'f-age']) $(id).addEventListener('change', () => filtersChanged(false));
for (const id of ['f-status', 'f-store']) $(id).addEventListener('change', () => filtersChanged(true));
$('f-order').addEventListener('change', () => filtersChanged(true));
$('f-order').addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); filtersChanged(true); } });
$('filters').addEventListener('submit', (e) => e.preventDefault());
$('f-clear').addEventListener('click', () => {
  $('f-kind').value = ''; $('f-status').value = 'UNRESOLVED'; $('f-store').value = ''; $('f-age').value = 'any'; $('f-order').value = '';
  filtersChanged(true);
});
for (const id of ['an-days', 'an-store']) $(id).addEventListener('change', () => loadAnomalies().catch(showLoadError));
$('confirm-form').addEventListener('submit', submitDialog);
$('confirm-cancel').addEventListener('click', () => { if (!state.busy) { $('confirm').close(); state.dialog = null; } });
$('confirm').addEventListener('cancel', (e) => { if (state.busy) e.preventDefault(); else state.dialog = null; }); // Escape
// Enter confirms from anywhere in the dialog (Shift+Enter: a new line in the note).
$('confirm-note').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); $('confirm-form').requestSubmit(); }
});
$('confirm-amount-input').addEventListener('input', () => { document.querySelector('input[name=refund][value=amount]').checked = true; });
$('login').addEventListener('submit', (e) => {
  e.preventDefault();
  const tok = $('token-input').value.trim().replace(/^Bearer\s+/i, '');
  if (!tok) return;
  sessionStorage.setItem(TOKEN_KEY, tok);
  start(tok);
});
$('logout').addEventListener('click', () => { setStatus('conn.signedOut'); showLogin(null); });
window.addEventListener('hashchange', () => {
  const tok = tokenFromHash();
  if (tok) { stop(); start(tok); return; }
  if (state.token) render();
});
const initial = tokenFromHash() || sessionStorage.getItem(TOKEN_KEY);
if (initial) start(initial); else { setStatus('conn.noToken'); showLogin(null); }
