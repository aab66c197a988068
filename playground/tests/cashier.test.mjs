// The payment walk-through in Chromium, against real processes: `fitorder sandbox-provider`
// plays WeChat Pay and Alipay on loopback with dev keys of its own, `fitorder serve` is
// configured with the settings it prints (nothing simulated inside fitorder), a member places
// an order over GraphQL, the qrCode / payUrl opens the sandbox's cashier, a click on Pay sends
// the signed notification, and the order is PAID.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { launchChromium, startServer, startSandbox, eventually } from './support.mjs';

let sandbox;
let keysDir;
let server;
let browser;

before(async () => {
  keysDir = mkdtempSync(join(tmpdir(), 'fitorder-sandbox-keys-'));
  sandbox = await startSandbox(keysDir);
  const env = sandbox.env;
  assert.match(env.WECHATPAY_API_BASE, /^http:\/\/127\.0\.0\.1:\d+\/wechatpay$/);
  server = await startServer(env);
  browser = await launchChromium();
});

after(async () => {
  await browser?.close().catch(() => {});
  await server?.stop();
  await sandbox?.stop();
  if (keysDir) rmSync(keysDir, { recursive: true, force: true });
});

const PLACE = `mutation($i: PlaceOrderInput!) { placeOrder(input: $i) {
  order { orderNo status expiresAt } payment { provider channel outTradeNo qrCode payUrl } } }`;
const STATUS = 'query($n: String!) { order(orderNo: $n) { status paidAt providerTxnId } }';

async function payInChromium(url) {
  const page = await browser.newPage();
  try {
    const blocked = [];
    page.on('console', (m) => /Content Security Policy|Refused to/.test(m.text()) && blocked.push(m.text()));
    await page.goto(url);
    await page.click('#pay');
    try {
      await page.waitForSelector('#paid', { timeout: 15000 });
    } catch (e) {
      const shown = await page.locator('#result').textContent().catch(() => '');
      throw new Error(`no #paid on the cashier (page says ${JSON.stringify(shown)}; CSP ${blocked.join(' | ')}):\n${server.log().slice(-3000)}`, { cause: e });
    }
    assert.equal(await page.locator('#paid').textContent(), 'Paid');
    assert.deepEqual(blocked, [], 'the page runs under its CSP without violations');
  } finally {
    await page.close();
  }
}

for (const [method, channel, field] of [
  ['WECHAT_PAY', 'WECHAT_NATIVE', 'qrCode'],
  ['ALIPAY', 'ALIPAY_WAP', 'payUrl'],
]) {
  test(`a ${channel} order placed over GraphQL is paid at the sandbox cashier`, async () => {
    const member = server.token('member', 1);
    const placed = await server.gql(member, PLACE, {
      i: { idempotencyKey: `cashier-${channel}-${Date.now()}`, storeId: '1', item: { classPackId: '1' }, paymentMethod: method, channel },
    });
    const { order, payment } = placed.placeOrder;
    assert.equal(order.status, 'WAIT_PAY');
    assert.equal(payment.channel, channel);
    assert.equal(payment.outTradeNo, order.orderNo);
    const url = payment[field];
    assert.ok(url && url.startsWith('http://127.0.0.1:'), `${field} is the sandbox's: ${url}`);

    await payInChromium(url);

    const paid = await eventually(async () => {
      const d = await server.gql(member, STATUS, { n: order.orderNo });
      return d.order.status === 'PAID' && d.order;
    }, `order ${order.orderNo} PAID`);
    assert.ok(paid.providerTxnId, 'the provider transaction is recorded');
  });
}
