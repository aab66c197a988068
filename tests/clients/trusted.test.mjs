// Trusted documents: the member app's build writes a manifest of its documents (here as
// GraphQL Code Generator's client preset does: SHA-256 of the printed document -> document),
// fitorder starts with FITORDER_TRUSTED_DOCUMENTS, and member tokens run only those documents,
// while staff tools and GraphiQL keep working.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApolloClient, HttpLink, InMemoryCache } from '@apollo/client';
import { PersistedQueryLink } from '@apollo/client/link/persisted-queries';
import { print } from 'graphql';
import { startServer } from '../../playground/tests/support.mjs';
import { operations, recordingFetch } from './operations.mjs';

const sha256 = (text) => createHash('sha256').update(text).digest('hex');
const ops = operations('member');
let server;
let dir;

before(async () => {
  // The app's build: every document as its client sends it (Apollo adds __typename).
  const cache = new InMemoryCache();
  const manifest = {};
  for (const doc of Object.values(ops)) {
    const text = print(cache.transformDocument(doc));
    manifest[sha256(text)] = text;
  }
  dir = mkdtempSync(join(tmpdir(), 'fitorder-trusted-'));
  writeFileSync(join(dir, 'persisted-documents.json'), JSON.stringify(manifest, null, 2));
  // GraphiQL fetches the schema before a token is pasted: outside development mode that takes
  // FITORDER_PUBLIC_INTROSPECTION=1, which the manifest must not undo.
  server = await startServer({
    FITORDER_TRUSTED_DOCUMENTS: join(dir, 'persisted-documents.json'),
    FITORDER_PUBLIC_INTROSPECTION: '1',
  });
});

after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

async function post(token, body) {
  const headers = { 'content-type': 'application/json', accept: 'application/graphql-response+json' };
  if (token) headers.authorization = `Bearer ${token}`;
  const r = await fetch(server.url + '/graphql', { method: 'POST', headers, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

test('a member runs the manifest by hash; anything else is refused', { timeout: 60000 }, async () => {
  const member = server.token('member', '1');
  const log = [];
  const client = new ApolloClient({
    link: new PersistedQueryLink({ sha256 }).concat(
      new HttpLink({ uri: server.url + '/graphql', headers: { authorization: `Bearer ${member}` }, fetch: recordingFetch(log) }),
    ),
    cache: new InMemoryCache(),
  });
  const account = await client.query({ query: ops.MyAccount, fetchPolicy: 'network-only' });
  assert.equal(account.data.me.role, 'member');
  // Known by hash at once: the document never travels.
  assert.deepEqual(log.map((r) => [r.hasQuery, r.hashed, r.status]), [[false, true, 200]], JSON.stringify(log));
  client.stop();

  const refused = await post(member, { query: '{ me { role subject } }' });
  assert.equal(refused.status, 403, JSON.stringify(refused.body));
  assert.equal(refused.body.errors[0].extensions.code, 'FORBIDDEN');
  assert.equal(refused.body.data, undefined);
});

test('staff and GraphiQL keep working in member mode', { timeout: 60000 }, async () => {
  const admin = await post(server.token('admin', 'admin-1'), { query: '{ orders(first: 1) { totalCount } }' });
  assert.equal(admin.status, 200, JSON.stringify(admin.body));
  assert.equal(typeof admin.body.data.orders.totalCount, 'number');
  const ops_ = await post(server.token('ops', 'ops-1'), { query: '{ me { role } }' });
  assert.equal(ops_.body.data.me.role, 'ops');
  // GraphiQL: the page, and the schema before a token is pasted.
  const page = await fetch(server.url + '/graphql', { headers: { accept: 'text/html' } });
  assert.equal(page.status, 200);
  assert.match(await page.text(), /tabs\.js/);
  const schema = await post(null, { query: '{ __schema { queryType { name } } }' });
  assert.equal(schema.status, 200, JSON.stringify(schema.body));
  assert.equal(schema.body.data.__schema.queryType.name, 'Query');
});
