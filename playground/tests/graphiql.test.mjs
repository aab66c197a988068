// GraphiQL (GET /graphql) in Chromium with no network beyond loopback: every request the page
// makes to another host is aborted and recorded, and the page must still load the editor, run
// a query with a token from the header editor, and run a subscription over /graphql/ws.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { launchChromium, startServer } from './support.mjs';

let server;
let browser;

before(async () => {
  // GraphiQL loads the schema before a token is pasted: outside development mode that is
  // FITORDER_PUBLIC_INTROSPECTION=1 (docs/security.md).
  server = await startServer({ FITORDER_PUBLIC_INTROSPECTION: '1' });
  browser = await launchChromium([
    // Anything that is not loopback resolves to nothing, even if a route were missed.
    '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1',
  ]);
});

after(async () => {
  await browser?.close().catch(() => {});
  await server?.stop();
});

test('GraphiQL runs a query and a subscription with nothing but this service', { timeout: 60000 }, async () => {
  const token = server.token('ops', 'ops-1');
  const context = await browser.newContext();
  const outside = [];
  await context.route('**/*', (route) => {
    const u = new URL(route.request().url());
    if (u.hostname === '127.0.0.1' || u.protocol === 'data:') return route.continue();
    outside.push(route.request().url());
    return route.abort();
  });
  // What a newcomer would type: a query, and the token in the header editor.
  await context.addInitScript(
    ([t]) => {
      localStorage.setItem('graphiql:query', '{ me { role subject } }');
      localStorage.setItem('graphiql:headers', JSON.stringify({ Authorization: `Bearer ${t}` }));
    },
    [token],
  );
  const page = await context.newPage();
  const problems = [];
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(m.text());
  });
  page.on('pageerror', (e) => problems.push(String(e)));
  // GraphiQL's introspection (the schema for the docs and completion) must succeed too.
  const introspection = [];
  page.on('response', async (r) => {
    const body = r.request().postData() || '';
    if (r.url().endsWith('/graphql') && body.includes('__schema')) introspection.push(await r.json().catch(() => null));
  });
  const resp = await page.goto(server.url + '/graphql');
  assert.match(resp.headers()['content-security-policy'], /frame-ancestors 'none'/);

  await page.waitForSelector('.graphiql-container .graphiql-execute-button', { timeout: 20000 });
  await page.click('.graphiql-execute-button');
  const result = () => page.locator('.graphiql-response').innerText();
  await page.waitForFunction(() => /"subject": "ops-1"/.test(document.querySelector('.graphiql-response')?.innerText || ''), null, {
    timeout: 15000,
  });
  assert.match(await result(), /"role": "ops"/);

  // A subscription through the page's WebSocket client, authenticated from the same header.
  await page.evaluate(() => {
    const cm = document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror;
    cm.setValue('subscription { orderStatusChanged { orderNo toStatus } }');
  });
  await page.click('.graphiql-execute-button');
  try {
    await server.subscribers(1);
  } catch (e) {
    throw new Error(`${e.message}\nresponse pane: ${await result()}\nconsole: ${problems.join('\n')}\n${server.log().slice(-2000)}`);
  }
  const admin = server.token('admin', 'admin-1');
  await server.gql(admin, 'mutation($m: ID!, $r: String!) { topUpWallet(memberId: $m, amountCents: 100000, reference: $r) { id } }', {
    m: '1',
    r: `topup-graphiql-${Date.now()}`,
  });
  const member = server.token('member', '1');
  const placed = await server.gql(
    member,
    `mutation($k: String!) { placeOrder(input: {idempotencyKey: $k, storeId: "1", item: {classPackId: "1"}, paymentMethod: WALLET}) { order { orderNo } } }`,
    { k: `graphiql-${Date.now()}` },
  );
  const no = placed.placeOrder.order.orderNo;
  await page.waitForFunction((n) => (document.querySelector('.graphiql-response')?.innerText || '').includes(n), no, {
    timeout: 15000,
  });

  assert.deepEqual(outside, [], 'the page asked another host');
  assert.ok(introspection.length > 0, 'GraphiQL asked for the schema');
  for (const r of introspection) assert.ok(r && r.data && r.data.__schema && !r.errors, JSON.stringify(r).slice(0, 300));
  assert.deepEqual(
    problems.filter((p) => /Content Security Policy|Refused to/.test(p)),
    [],
    'the page broke its own policy',
  );
  await context.close();
});

test('GraphiQL opens with the contract documents as tabs, each runnable as it stands', { timeout: 60000 }, async () => {
  const context = await browser.newContext();
  await context.route('**/*', (route) => {
    const u = new URL(route.request().url());
    return u.hostname === '127.0.0.1' ? route.continue() : route.abort();
  });
  const page = await context.newPage();
  await page.goto(server.url + '/graphql');
  await page.waitForSelector('.graphiql-container .graphiql-execute-button', { timeout: 20000 });
  const titles = await page.locator('.graphiql-tab').allInnerTexts();
  for (const name of ['SignInWithWechat', 'MyAccount', 'PlaceOrder', 'MyOrderStatus', 'Orders', 'OrderChain', 'CompensationUpdates']) {
    assert.ok(titles.some((t) => t.trim() === name), `a tab ${name} in ${JSON.stringify(titles)}`);
  }
  const editor = () =>
    page.evaluate(() => document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror.getValue());
  assert.match(await editor(), /^# The member app/);
  // The member app's first document is signing in (no token needed).
  assert.match(await editor(), /mutation SignInWithWechat/);
  // The PlaceOrder tab carries its fragment and its example variables.
  await page.locator('.graphiql-tab').filter({ hasText: 'PlaceOrder' }).locator('button').first().click();
  await page.waitForFunction(() => /mutation PlaceOrder/.test(document.querySelector('.graphiql-query-editor .CodeMirror').CodeMirror.getValue()));
  assert.match(await editor(), /fragment PaymentInstructionFields/);
  const variables = await page.evaluate(() =>
    [...document.querySelectorAll('.CodeMirror')].map((e) => e.CodeMirror.getValue()).find((v) => v.includes('idempotencyKey')),
  );
  assert.ok(variables, 'the example variables of PlaceOrder are in the tab');
  await context.close();
});
