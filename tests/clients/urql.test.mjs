// The admin console's client: urql with @urql/exchange-persisted, queries by GET, running the
// contract's admin documents (Orders, OrderChain) against a real fitorder server.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Client, fetchExchange } from '@urql/core';
import { persistedExchange } from '@urql/exchange-persisted';
import { startServer, placeWalletOrder } from '../../playground/tests/support.mjs';
import { operations, recordingFetch } from './operations.mjs';

const ops = operations('admin');
let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

test('urql runs the admin console: Orders and OrderChain, persisted, by GET', { timeout: 90000 }, async () => {
  const order = await placeWalletOrder(server, '1', `urql-${Date.now()}`);
  const token = server.token('admin', 'admin-1');
  const log = [];
  const client = new Client({
    url: server.url + '/graphql',
    exchanges: [persistedExchange({ preferGetForPersistedQueries: true }), fetchExchange],
    fetchOptions: { headers: { authorization: `Bearer ${token}` } },
    fetch: recordingFetch(log),
    requestPolicy: 'network-only',
  });

  const orders = await client.query(ops.Orders, { first: 20 }).toPromise();
  assert.ok(!orders.error, String(orders.error));
  assert.ok(orders.data.orders.totalCount >= 1);
  const row = orders.data.orders.edges.find((e) => e.node.orderNo === order.orderNo);
  assert.ok(row, `${order.orderNo} in the console's list`);
  assert.equal(row.node.member.id, '1');
  // The hash by GET (unknown yet), then the document by GET with it.
  assert.deepEqual(
    log.map((r) => [r.method, r.hasQuery, r.hashed, r.codes.join()]),
    [
      ['GET', false, true, 'PERSISTED_QUERY_NOT_FOUND'],
      ['GET', true, true, ''],
    ],
    JSON.stringify(log),
  );

  log.length = 0;
  const chain = await client.query(ops.OrderChain, { orderNo: order.orderNo }).toPromise();
  assert.ok(!chain.error, String(chain.error));
  assert.equal(chain.data.order.orderNo, order.orderNo);
  assert.equal(chain.data.order.status, order.status);
  assert.ok(chain.data.order.timeline.length >= 1, 'the order has its timeline');
  assert.ok(log.every((r) => r.method === 'GET'), JSON.stringify(log));

  // Once sent, a query travels as its hash alone.
  log.length = 0;
  const again = await client.query(ops.Orders, { first: 20 }).toPromise();
  assert.ok(!again.error, String(again.error));
  assert.deepEqual(log.map((r) => [r.method, r.hasQuery, r.status]), [['GET', false, 200]], JSON.stringify(log));
});
