// The member app's client: Apollo Client with automatic persisted queries (HttpLink behind
// PersistedQueryLink, SHA-256) and GraphQLWsLink for the subscription, running the contract's
// member documents against a real fitorder server.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { ApolloClient, ApolloLink, HttpLink, InMemoryCache } from '@apollo/client';
import { PersistedQueryLink } from '@apollo/client/link/persisted-queries';
import { GraphQLWsLink } from '@apollo/client/link/subscriptions';
import { getMainDefinition } from '@apollo/client/utilities';
import { createClient } from 'graphql-ws';
import WebSocket from 'ws';
import { startServer, eventually } from '../../playground/tests/support.mjs';
import { operations, recordingFetch } from './operations.mjs';

const ops = operations('member');
const sha256 = (text) => createHash('sha256').update(text).digest('hex');
let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

/** The member app's client: hashed queries first, the document only when the server asks. */
function memberClient(token, log) {
  const ws = createClient({
    url: server.wsUrl,
    webSocketImpl: WebSocket,
    connectionParams: { authorization: `Bearer ${token}` },
  });
  const http = new PersistedQueryLink({ sha256 }).concat(
    new HttpLink({ uri: server.url + '/graphql', headers: { authorization: `Bearer ${token}` }, fetch: recordingFetch(log) }),
  );
  const link = ApolloLink.split(
    ({ query }) => {
      const def = getMainDefinition(query);
      return def.kind === 'OperationDefinition' && def.operation === 'subscription';
    },
    new GraphQLWsLink(ws),
    http,
  );
  return { client: new ApolloClient({ link, cache: new InMemoryCache() }), ws };
}

test('Apollo Client runs the member app: MyAccount, PlaceOrder, MyOrders to the end, MyOrderStatus', { timeout: 90000 }, async () => {
  const admin = server.token('admin', 'admin-1');
  await server.gql(admin, 'mutation($m: ID!, $r: String!) { topUpWallet(memberId: $m, amountCents: 500000, reference: $r) { id } }', {
    m: '1',
    r: `topup-apollo-${Date.now()}`,
  });
  const log = [];
  const { client, ws } = memberClient(server.token('member', '1'), log);
  try {
    // MyAccount: the hash first (unknown: PERSISTED_QUERY_NOT_FOUND), then the document with it.
    const account = await client.query({ query: ops.MyAccount, fetchPolicy: 'network-only' });
    assert.equal(account.data.me.role, 'member');
    assert.equal(account.data.me.member.id, '1');
    assert.deepEqual(
      log.map((r) => [r.hasQuery, r.hashed, r.codes.join()]),
      [
        [false, true, 'PERSISTED_QUERY_NOT_FOUND'],
        [true, true, ''],
      ],
      JSON.stringify(log),
    );
    // Asked again: the hash alone is enough now.
    log.length = 0;
    await client.query({ query: ops.MyAccount, fetchPolicy: 'network-only' });
    assert.deepEqual(log.map((r) => [r.hasQuery, r.hashed, r.status]), [[false, true, 200]], JSON.stringify(log));

    // PlaceOrder, with its fragment (PaymentInstructionFields).
    const placed = [];
    for (let i = 0; i < 5; i++) {
      const r = await client.mutate({
        mutation: ops.PlaceOrder,
        variables: {
          input: { idempotencyKey: `apollo-${Date.now()}-${i}`, storeId: '1', item: { classPackId: '1' }, paymentMethod: 'WALLET' },
        },
      });
      assert.ok(!r.error, JSON.stringify(r.error));
      placed.push(r.data.placeOrder.order);
      assert.equal(r.data.placeOrder.order.paymentMethod, 'WALLET');
      assert.ok('payment' in r.data.placeOrder);
    }

    // MyOrders, two at a time, to the last page.
    const seen = [];
    let after = null;
    let total = null;
    for (let pages = 0; ; pages++) {
      assert.ok(pages < 50, 'paging ends');
      const r = await client.query({ query: ops.MyOrders, variables: { first: 2, after }, fetchPolicy: 'network-only' });
      const conn = r.data.orders;
      total = conn.totalCount;
      seen.push(...conn.edges.map((e) => e.node.orderNo));
      if (!conn.pageInfo.hasNextPage) break;
      after = conn.pageInfo.endCursor;
    }
    assert.equal(seen.length, total);
    assert.equal(new Set(seen).size, seen.length, 'no order twice');
    for (const o of placed) assert.ok(seen.includes(o.orderNo), `${o.orderNo} listed`);

    // MyOrderStatus over GraphQLWsLink, then the member checks in: the transition arrives.
    const order = placed[0];
    const events = [];
    const sub = client.subscribe({ query: ops.MyOrderStatus, variables: { orderNo: order.orderNo } }).subscribe({
      next: (r) => events.push(r),
      error: (e) => events.push({ error: String(e) }),
    });
    await server.subscribers(1);
    const checkIn = await client.mutate({
      mutation: ops.CheckIn,
      variables: { input: { orderNo: order.orderNo, consumeTxnNo: `GATE-apollo-${Date.now()}`, sessions: 1 } },
    });
    assert.ok(!checkIn.error, JSON.stringify(checkIn.error));
    const got = await eventually(() => events.find((e) => e.data?.orderStatusChanged), 'the transition over GraphQLWsLink');
    assert.equal(got.data.orderStatusChanged.orderNo, order.orderNo);
    assert.equal(got.data.orderStatusChanged.fromStatus, order.status);
    assert.equal(got.data.orderStatusChanged.toStatus, checkIn.data.checkIn.order.status);
    sub.unsubscribe();
  } finally {
    await ws.dispose();
    client.stop();
  }
});
