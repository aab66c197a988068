// The ops watch page (GET /ops) in Chromium: it goes live over /graphql/ws, shows a WALLET
// order's grants dying while it is open, and a Replay from the page delivers once the
// downstream is healthy again. Its script and styles are files under /ops/assets/ and its policy
// allows nothing inline: no page here breaks it.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { launchChromium, startServer, placeWalletOrder, downstreamService, OPS_DOC } from './support.mjs';

const OPS_DIR = new URL('../ops/', import.meta.url);
const PAGE_FILE = new URL('index.html', OPS_DIR);
const ASSETS = ['watch.js', 'watch.css', 'live.js'];
const SCREENSHOT = fileURLToPath(new URL('./ops-page.png', import.meta.url));

// The door and AI endpoints: 503 while `failing`, 200 after.
const downstream = downstreamService({ failing: true });

let server;
let browser;

before(async () => {
  server = await startServer(await downstream.start());
  browser = await launchChromium();
});

after(async () => {
  await browser?.close().catch(() => {});
  await server?.stop();
  await downstream.stop();
});

const sel = (testid, attrs = {}) =>
  `[data-testid="${testid}"]` + Object.entries(attrs).map(([k, v]) => `[data-${k}="${v}"]`).join('');

/** Waits until `selector` matches exactly `n` elements. */
async function count(page, selector, n, timeout = 15000) {
  try {
    await page.waitForFunction(([s, n]) => document.querySelectorAll(s).length === n, [selector, n], { timeout, polling: 100 });
  } catch (e) {
    const seen = await page.locator(selector).count();
    throw new Error(`expected ${n} × ${selector}, have ${seen}:\n${server.log().slice(-3000)}`, { cause: e });
  }
}

/**
 * Records what the page's policy refused, both as Chromium reports it on the console and as the
 * document's `securitypolicyviolation` events; `violations()` returns them all.
 */
async function policyWatch(page) {
  const seen = [];
  page.on('console', (m) => /Content Security Policy|Refused to/.test(m.text()) && seen.push(`console: ${m.text()}`));
  await page.addInitScript(() => {
    window.__violations = [];
    document.addEventListener('securitypolicyviolation', (e) =>
      window.__violations.push(`${e.effectiveDirective} refused ${e.blockedURI || 'inline'} (${e.sourceFile || ''}:${e.lineNumber})`),
    );
  });
  return async () => [...seen, ...(await page.evaluate(() => window.__violations || []).catch(() => []))];
}

async function waitLive(page) {
  await page.waitForFunction(() => document.querySelector('[data-testid="connection-status"]')?.textContent === 'live', null, {
    timeout: 15000,
  });
}

test('GET /ops serves the page, and the page carries ops.graphql unchanged', async () => {
  const html = readFileSync(PAGE_FILE, 'utf8');
  const served = await (await fetch(server.url + '/ops')).text();
  assert.ok(served === html, 'GET /ops differs from playground/ops/index.html: rebuild the binary (cargo build)');
  const m = html.match(/<script type="application\/graphql" id="ops-doc">\n([\s\S]*?)<\/script>/);
  assert.ok(m, 'the page embeds its documents in <script id="ops-doc">');
  assert.equal(m[1], OPS_DOC, 'the page documents are playground/operations/ops.graphql byte for byte');
  assert.doesNotMatch(html, /\b(src|href)=["']?(https?:)?\/\//i, 'no external resources');

  // Nothing inline runs or styles: the script and styles are the server's files, as the workbench's.
  const csp = (await fetch(server.url + '/ops')).headers.get('content-security-policy');
  assert.match(csp, /(^|; )script-src 'self';/);
  assert.match(csp, /(^|; )style-src 'self';/);
  assert.doesNotMatch(csp, /unsafe-inline/);
  assert.doesNotMatch(html, /unsafe-inline/, 'the <meta> policy');
  for (const [, attrs, body] of html.matchAll(/<script\b([^>]*)>([\s\S]*?)<\/script>/g)) {
    if (body.trim()) assert.match(attrs, /type="application\/graphql"/, `an inline script runs: <script${attrs}>`);
    else assert.match(attrs, /src="\/ops\/assets\/[\w.]+"/);
  }
  assert.doesNotMatch(html, /<style\b|\sstyle=|\son[a-z]+=|javascript:/i, 'no inline style or handler');
  for (const name of ASSETS) {
    const r = await fetch(`${server.url}/ops/assets/${name}`);
    assert.equal(r.status, 200, name);
    assert.equal(r.headers.get('cache-control'), 'no-cache', name);
    assert.equal(r.headers.get('content-type'), name.endsWith('.js') ? 'text/javascript; charset=utf-8' : 'text/css; charset=utf-8');
    assert.ok((await r.text()) === readFileSync(new URL(name, OPS_DIR), 'utf8'), `${name} differs from playground/ops: rebuild (cargo build)`);
    assert.doesNotMatch(readFileSync(new URL(name, OPS_DIR), 'utf8'), /\bhttps?:\/\/(?!www\.w3\.org\/2000\/svg)/, `${name}: no external resources`);
  }
});

test("the page's policy refuses inline script and style, and the page needs neither", { timeout: 30000 }, async () => {
  const page = await browser.newPage();
  const violations = await policyWatch(page);
  try {
    await page.goto(`${server.url}/ops`);
    // watch.js ran (no token: it asks for one) and watch.css styles the page.
    await page.getByTestId('token-form').waitFor({ state: 'visible', timeout: 10000 });
    assert.equal(await page.getByTestId('connection-status').textContent(), 'no token');
    assert.equal(await page.evaluate(() => getComputedStyle(document.querySelector('header')).backgroundColor), 'rgb(29, 39, 51)');
    assert.deepEqual(await violations(), [], 'the page broke its own policy');

    // What an injected inline script or style would do is refused.
    const injected = await page.evaluate(() => {
      const s = document.createElement('script');
      s.textContent = 'window.__inlineRan = true;';
      document.head.append(s);
      const st = document.createElement('style');
      st.textContent = 'header { background: rgb(255, 0, 0) !important; }';
      document.head.append(st);
      document.querySelector('h1').setAttribute('style', 'color: rgb(255, 0, 0)');
      return {
        ran: window.__inlineRan === true,
        header: getComputedStyle(document.querySelector('header')).backgroundColor,
        h1: getComputedStyle(document.querySelector('h1')).color,
      };
    });
    assert.deepEqual(injected, { ran: false, header: 'rgb(29, 39, 51)', h1: 'rgb(255, 255, 255)' });
    await page.waitForFunction(() => window.__violations.length >= 3, null, { timeout: 5000 });
    const refused = (await violations()).filter((v) => !v.startsWith('console:'));
    assert.ok(refused.some((v) => v.startsWith('script-src-elem refused inline')), refused.join('\n'));
    assert.ok(refused.some((v) => v.startsWith('style-src-elem refused inline')), refused.join('\n'));
    assert.ok(refused.some((v) => v.startsWith('style-src-attr refused inline')), refused.join('\n'));
  } finally {
    await page.close().catch(() => {});
  }
});

test('the page watches compensation die live and replays it', { timeout: 60000 }, async (t) => {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const foreign = [];
  const problems = [];
  const origin = new URL(server.url).host;
  page.on('request', (r) => new URL(r.url()).host !== origin && foreign.push(r.url()));
  page.on('websocket', (ws) => new URL(ws.url()).host !== origin && foreign.push(ws.url()));
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => m.type() === 'error' && problems.push(`console: ${m.text()}`));
  const violations = await policyWatch(page);

  try {
    const ops = server.token('ops', 'ops-1');
    await page.goto(`${server.url}/ops#token=${ops}`);
    await waitLive(page);
    await server.subscribers(3); // the page's three streams run on the server
    assert.equal(new URL(page.url()).hash, '', 'the token is taken out of the address bar');
    await count(page, sel('dead-row'), 0);
    await page.locator(sel('anomaly-chart') + ' svg').waitFor();

    // Placed while the page is open: both grants fail (503) twice and die.
    const order = await placeWalletOrder(server, 1, `page-${Date.now()}`);
    await page.locator(sel('order-entry', { 'order-no': order.orderNo, 'to-status': 'PAID' })).waitFor({ timeout: 10000 });

    await count(page, sel('dead-row', { 'order-no': order.orderNo, status: 'DEAD' }), 2);
    const rows = page.locator(sel('dead-row'));
    const kinds = (await rows.evaluateAll((rs) => rs.map((r) => r.dataset.kind))).sort();
    assert.deepEqual(kinds, ['AI_ACCESS_GRANT', 'DOOR_ACCESS_GRANT']);
    assert.match(await rows.first().textContent(), /HTTP 503/);
    assert.equal(await page.locator(sel('comp-entry', { status: 'DEAD' })).count(), 2);

    // The tickets they opened arrive over TicketsOpened; the chart counts them.
    await count(page, sel('ticket-row', { kind: 'COMPENSATION_DEAD', 'order-no': order.orderNo }), 2);
    await page.locator(`${sel('anomaly-chart')} g[data-category="COMPENSATION_DEAD"][data-count="2"]`).waitFor({ timeout: 10000 });

    // The Replay buttons fit the panel (not pushed out of view by a long error).
    const panel = await page.locator('#p-dead').boundingBox();
    for (const b of await page.getByTestId('replay-button').all()) {
      const box = await b.boundingBox();
      assert.ok(box && box.x + box.width <= panel.x + panel.width, 'Replay button inside the DEAD panel');
    }

    await page.screenshot({ path: SCREENSHOT, fullPage: true });
    t.diagnostic(`screenshot: ${SCREENSHOT}`);

    // Healthy again: replay one from the page; it is delivered and leaves the DEAD list.
    downstream.failing = false;
    const row = rows.first();
    const id = await row.getAttribute('data-event-id');
    const kind = await row.getAttribute('data-kind');
    await row.getByTestId('replay-button').click();
    await page.locator(sel('comp-entry', { 'event-id': id, status: 'SUCCEEDED' })).waitFor({ timeout: 15000 });
    await count(page, sel('dead-row', { 'event-id': id }), 0);
    await count(page, sel('dead-row'), 1);
    assert.equal(await rows.first().getAttribute('data-status'), 'DEAD');

    const ops2 = await server.gql(ops, `{ compensationEvents(filter: {orderNo: "${order.orderNo}"}) { edges { node { id status } } } }`);
    const status = Object.fromEntries(ops2.compensationEvents.edges.map(({ node }) => [node.id, node.status]));
    assert.equal(status[id], 'SUCCEEDED');
    const path = kind === 'DOOR_ACCESS_GRANT' ? '/door' : '/ai';
    assert.ok(
      downstream.hits.some((h) => h.path === path && !h.failing && h.body.eventId === id),
      `the downstream got event ${id} at ${path}`,
    );

    // A fresh load (token from sessionStorage now) queries what is there.
    await page.reload();
    await waitLive(page);
    await count(page, sel('dead-row'), 1);
    assert.notEqual(await rows.first().getAttribute('data-event-id'), id);
    await count(page, sel('ticket-row', { kind: 'COMPENSATION_DEAD' }), 2);
    await page.locator(`${sel('anomaly-chart')} g[data-category="COMPENSATION_DEAD"][data-count="2"]`).waitFor();

    assert.deepEqual(foreign, [], 'the page talks to its own server only');
    assert.deepEqual(problems, [], 'no page errors');
    assert.deepEqual(await violations(), [], 'the page broke its own policy');
  } finally {
    await page.close().catch(() => {});
  }
});

test('a refused token brings back the token form', { timeout: 30000 }, async () => {
  const page = await browser.newPage();
  const violations = await policyWatch(page);
  try {
    await page.goto(`${server.url}/ops#token=not-a-jwt`);
    await page.getByTestId('token-form').waitFor({ state: 'visible', timeout: 10000 });
    assert.equal(await page.getByTestId('connection-status').textContent(), 'token refused');

    // A good token typed in goes live.
    await page.locator('#token-input').fill(server.token('ops', 'ops-1'));
    await page.locator('#login button[type=submit]').click();
    await waitLive(page);
    assert.equal(await page.getByTestId('token-form').isVisible(), false);
    assert.deepEqual(await violations(), [], 'the page broke its own policy');
  } finally {
    await page.close().catch(() => {});
  }
});

test('a socket closed with 4403 brings back the token form', { timeout: 30000 }, async () => {
  const page = await browser.newPage();
  try {
    // The queries pass; the WebSocket is refused as the server does for a bad connection_init.
    await page.routeWebSocket(/\/graphql\/ws$/, (ws) => {
      ws.onMessage((m) => JSON.parse(m).type === 'connection_init' && ws.close({ code: 4403, reason: 'Forbidden' }));
    });
    await page.goto(`${server.url}/ops#token=${server.token('ops', 'ops-1')}`);
    await page.getByTestId('token-form').waitFor({ state: 'visible', timeout: 10000 });
    assert.equal(await page.getByTestId('connection-status').textContent(), 'token refused');
    assert.equal(await page.evaluate(() => sessionStorage.length), 0, 'the refused token is forgotten');
  } finally {
    await page.close().catch(() => {});
  }
});

test('a dropped socket reconnects with backoff and goes live again', { timeout: 30000 }, async () => {
  const page = await browser.newPage();
  let connections = 0;
  try {
    await page.routeWebSocket(/\/graphql\/ws$/, (ws) => {
      connections += 1;
      if (connections === 1) ws.onMessage(() => ws.close({ code: 1011, reason: 'test drop' }));
      else ws.connectToServer();
    });
    await page.goto(`${server.url}/ops#token=${server.token('ops', 'ops-1')}`);
    await page.waitForFunction(() => /retry in/.test(document.querySelector('[data-testid="connection-status"]').textContent), null, {
      timeout: 10000,
    });
    await waitLive(page);
    assert.equal(connections, 2);
  } finally {
    await page.close().catch(() => {});
  }
});
