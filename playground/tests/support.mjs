// A fitorder server of the test's own: a fresh database, seeded demo data, `serve` on a free
// port, tokens, GraphQL over HTTP; `stop()` kills the server and drops the database.
//
// Env: FITORDER_BIN (default: ../../target/debug/fitorder), TEST_DATABASE_URL (a maintenance
// URL, default postgres://postgres@127.0.0.1:5432/postgres).

import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

export const BIN = process.env.FITORDER_BIN || fileURLToPath(new URL('../../target/debug/fitorder', import.meta.url));
export const ADMIN_URL = process.env.TEST_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/postgres';
export const OPS_DOC = readFileSync(new URL('../operations/ops.graphql', import.meta.url), 'utf8');
const SECRET = 'playground-test-secret-3b5d7f9a1c3e5';
const METRICS_TOKEN = 'playground-metrics-token';

/** A port nobody listens on right now. */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function psql(sql) {
  execFileSync('psql', [ADMIN_URL, '-v', 'ON_ERROR_STOP=1', '-q', '-c', sql], { stdio: ['ignore', 'ignore', 'pipe'] });
}

/** The parent's env without FITORDER_* and DATABASE_URL settings that could change the server. */
function cleanEnv(extra) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith('FITORDER_') && k !== 'DATABASE_URL') env[k] = v;
  }
  return { ...env, ...extra };
}

const live = new Set();
process.on('exit', () => {
  for (const child of live) child.kill('SIGKILL');
});

/**
 * Starts a server. `env` adds settings (e.g. downstream URLs). Returns
 * { url, wsUrl, token(role, sub), gql(token, query, variables, operationName), log(), stop() }.
 */
export async function startServer(env = {}) {
  if (!existsSync(BIN)) throw new Error(`FITORDER_BIN ${BIN} does not exist: build it (cargo build) or set FITORDER_BIN`);
  const db = `fitorder_pgt_${process.pid}_${Date.now().toString(36)}`;
  const dbUrl = new URL(ADMIN_URL);
  dbUrl.pathname = '/' + db;
  const port = await freePort();
  const baseEnv = cleanEnv({
    DATABASE_URL: dbUrl.href,
    FITORDER_JWT_SECRET: SECRET,
    // Outside development mode /metrics on the API port needs this bearer token.
    FITORDER_METRICS_TOKEN: METRICS_TOKEN,
    FITORDER_ADDR: `127.0.0.1:${port}`,
    RUST_LOG: process.env.RUST_LOG || 'info',
    ...env,
  });

  psql(`create database "${db}"`);
  let child = null;
  let output = '';
  const stop = async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(t);
    }
    if (child) live.delete(child);
    try {
      psql(`drop database if exists "${db}" with (force)`);
    } catch (e) {
      console.error(`could not drop ${db}: ${e.stderr || e.message}`);
    }
  };

  try {
    execFileSync(BIN, ['seed'], { env: baseEnv, stdio: ['ignore', 'pipe', 'pipe'], timeout: 60000 });
    child = spawn(BIN, ['serve'], { env: baseEnv, stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(child);
    const keep = (chunk) => {
      output += chunk;
      if (output.length > 200000) output = output.slice(-100000);
    };
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);

    const url = `http://127.0.0.1:${port}`;
    const deadline = Date.now() + 30000;
    for (;;) {
      if (child.exitCode !== null) throw new Error(`fitorder serve exited with ${child.exitCode}:\n${output}`);
      try {
        const r = await fetch(url + '/readyz');
        if (r.ok) break;
      } catch {
        /* not listening yet */
      }
      if (Date.now() > deadline) throw new Error(`fitorder serve not ready after 30s:\n${output}`);
      await sleep(100);
    }

    const token = (role, sub) =>
      execFileSync(BIN, ['token', '--role', role, '--sub', String(sub)], { env: baseEnv, encoding: 'utf8' }).trim();

    /** POST /graphql; throws on transport or GraphQL errors, returns `data`. */
    const gql = async (tok, query, variables = {}, operationName = undefined) => {
      const r = await fetch(url + '/graphql', {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${tok}` },
        body: JSON.stringify({ query, variables, operationName }),
      });
      const body = await r.json();
      if (!r.ok || body.errors) throw new Error(`GraphQL ${r.status}: ${JSON.stringify(body.errors || body)}`);
      return body.data;
    };

    /** Waits until the server runs at least `n` subscription streams (its fitorder_subscribers gauge). */
    const subscribers = (n) =>
      eventually(async () => {
        const text = await (await fetch(url + '/metrics', { headers: { authorization: `Bearer ${METRICS_TOKEN}` } })).text();
        const m = text.match(/^fitorder_subscribers (\S+)$/m);
        return m && Number(m[1]) >= n;
      }, `${n} live subscription(s) (fitorder_subscribers on /metrics)`);

    return { url, wsUrl: `ws://127.0.0.1:${port}/graphql/ws`, db, env: baseEnv, token, gql, subscribers, stop, log: () => output };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** Tops up member `memberId`'s wallet and places a WALLET class-pack order as that member. */
export async function placeWalletOrder(server, memberId, key) {
  const admin = server.token('admin', 'admin-1');
  await server.gql(admin, 'mutation($m: ID!, $r: String!) { topUpWallet(memberId: $m, amountCents: 100000, reference: $r) { id } }', {
    m: String(memberId),
    r: `topup-${key}`,
  });
  const member = server.token('member', memberId);
  const data = await server.gql(
    member,
    `mutation($k: String!) { placeOrder(input: {idempotencyKey: $k, storeId: "1", item: {classPackId: "1"}, paymentMethod: WALLET}) { order { orderNo status } } }`,
    { k: key },
  );
  return data.placeOrder.order;
}

/** Polls `fn` until it returns a truthy value; fails with `what` after `ms`. */
export async function eventually(fn, what, ms = 15000) {
  const deadline = Date.now() + ms;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ''}`);
    await sleep(100);
  }
}

/** Debian's Chromium, headless, with nothing that reaches beyond this machine on its own. */
export async function launchChromium(extraArgs = []) {
  const { chromium } = await import('playwright-core');
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: [
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
      ...extraArgs,
    ],
  });
}

/**
 * The door and AI-device services on loopback: each call is recorded in `hits` (with whether it
 * was answered while `failing`); 503 while `failing`, 200 otherwise.
 */
export function downstreamService({ failing = false } = {}) {
  const d = { failing, hits: [] };
  d.server = createHttpServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      d.hits.push({ path: req.url, body: JSON.parse(body || 'null'), failing: d.failing });
      res.writeHead(d.failing ? 503 : 200, { 'content-type': 'application/json' });
      res.end(d.failing ? '{"error":"down for the test"}' : '{"ok":true}');
    });
  });
  /** Listens; answers the server settings that point fitorder here, retrying fast and giving up after 2 attempts. */
  d.start = async () => {
    await new Promise((r) => d.server.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${d.server.address().port}`;
    return {
      FITORDER_DOOR_ACCESS_URL: `${url}/door`,
      FITORDER_AI_ACCESS_URL: `${url}/ai`,
      FITORDER_RETRY_BASE: '200ms',
      FITORDER_MAX_ATTEMPTS: '2',
      FITORDER_DOWNSTREAM_TIMEOUT: '2s',
    };
  };
  d.stop = async () => {
    d.server.closeAllConnections();
    await new Promise((r) => d.server.close(r));
  };
  return d;
}

/**
 * Starts `fitorder sandbox-provider` (WeChat Pay and Alipay on loopback) with its keys in
 * `keysDir`; returns { env: the settings it prints, stop() }.
 */
export async function startSandbox(keysDir) {
  const port = await freePort();
  const child = spawn(BIN, ['sandbox-provider', '--addr', `127.0.0.1:${port}`, '--keys', keysDir], { stdio: ['ignore', 'pipe', 'pipe'] });
  live.add(child);
  let log = '';
  child.stderr.on('data', (c) => (log += c));
  const env = {};
  const lines = createInterface({ input: child.stdout });
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    }
    live.delete(child);
  };
  try {
    await new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`sandbox-provider not ready after 30s:\n${log}`)), 30000);
      child.once('exit', (code) => reject(new Error(`sandbox-provider exited with ${code}:\n${log}`)));
      lines.on('line', (line) => {
        if (line.startsWith('# ready')) {
          clearTimeout(t);
          resolve();
        } else if (line.includes('=')) {
          env[line.slice(0, line.indexOf('='))] = line.slice(line.indexOf('=') + 1);
        }
      });
    });
  } catch (e) {
    await stop();
    throw e;
  }
  return { env, stop };
}
