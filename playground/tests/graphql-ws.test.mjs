// The npm `graphql-ws` client (what Apollo and urql use) against /graphql/ws: the ops screen's
// OrderStatusChanges document streams a member's WALLET order, and a bad token is refused (4403).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { startServer, placeWalletOrder, eventually, OPS_DOC } from './support.mjs';

let server;
const clients = [];

before(async () => {
  server = await startServer();
});

after(async () => {
  await Promise.all(clients.map((c) => c.dispose()));
  if (server) await server.stop();
});

function client(token, on = {}) {
  const c = createClient({
    url: server.wsUrl,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${token}` },
    retryAttempts: 0,
    lazy: false,
    onNonLazyError: () => {}, // seen through `on.closed` and the sinks instead
    on,
  });
  clients.push(c);
  return c;
}

test('OrderStatusChanges streams a WALLET order to ops', { timeout: 45000 }, async (t) => {
  let connected;
  const ready = new Promise((r) => (connected = r));
  const c = client(server.token('ops', 'ops-1'), { connected: () => connected() });
  const received = [];
  let failure = null;
  const unsubscribe = c.subscribe(
    { query: OPS_DOC, operationName: 'OrderStatusChanges', variables: { storeId: '1' } },
    {
      next: (msg) => received.push(msg),
      error: (e) => (failure = e),
      complete: () => {},
    },
  );
  // The same document filtered to the other studio must not see the order.
  const otherStore = [];
  const unsubscribeOther = c.subscribe(
    { query: OPS_DOC, operationName: 'OrderStatusChanges', variables: { storeId: '2' } },
    { next: (msg) => otherStore.push(msg), error: (e) => (failure = e), complete: () => {} },
  );
  await ready;
  await server.subscribers(2); // both streams run on the server: nothing placed now is missed

  const order = await placeWalletOrder(server, 1, `ws-${Date.now()}`);
  assert.equal(order.status, 'PAID');

  const mine = () => received.filter((m) => m.data?.orderStatusChanged?.orderNo === order.orderNo);
  await eventually(() => failure || mine().some((m) => m.data.orderStatusChanged.toStatus === 'PAID'), `PAID event for ${order.orderNo}`);
  assert.equal(failure, null, `subscription failed: ${failure?.message || failure?.code}`);

  for (const m of received) assert.equal(m.errors, undefined, JSON.stringify(m.errors));
  const changes = mine().map((m) => m.data.orderStatusChanged);
  t.diagnostic(changes.map((ch) => `${ch.fromStatus ?? '∅'} -> ${ch.toStatus} by ${ch.actor}`).join(', '));
  // WAIT_PAY (created) -> PAID, in order, each with who did it and a trace id.
  const paid = changes.findIndex((ch) => ch.toStatus === 'PAID');
  assert.ok(paid >= 0, JSON.stringify(changes));
  assert.ok(
    changes[paid].fromStatus === 'WAIT_PAY' || changes.slice(0, paid).some((ch) => ch.toStatus === 'WAIT_PAY'),
    `PAID should follow WAIT_PAY: ${JSON.stringify(changes)}`,
  );
  for (const ch of changes) {
    assert.ok(ch.actor, 'actor');
    assert.ok(ch.traceId, 'traceId');
    assert.ok(!Number.isNaN(Date.parse(ch.at)), `at: ${ch.at}`);
  }

  await sleep(200);
  assert.deepEqual(otherStore, [], 'storeId 2 sees nothing of a store 1 order');
  unsubscribe();
  unsubscribeOther();
});

test('a bad token is refused with 4403', { timeout: 20000 }, async () => {
  let closed;
  const closedEvent = new Promise((r) => (closed = r));
  const c = client('not-a-jwt', { closed: (e) => closed(e) });
  let error = null;
  const done = new Promise((resolve) => {
    c.subscribe(
      { query: OPS_DOC, operationName: 'TicketsOpened', variables: {} },
      { next: () => {}, error: (e) => resolve((error = e)), complete: () => resolve() },
    );
  });
  const event = await closedEvent;
  assert.equal(event.code, 4403, `close code ${event.code} ${event.reason}`);
  await done;
  assert.equal(error?.code, 4403, 'the subscription fails with the close event');
});
