// The chain's identity provider for tests/it/oidc.rs: the npm `oidc-provider` (an OpenID
// Certified implementation) issuing JWT access tokens (RFC 9068) through the client_credentials
// grant, RS256 or ES256 as each client is configured, with the staff role and stores as claims.
//
//   node issuer.mjs INPUT.json
//
// INPUT: {"port", "audience", "other_audience", "role_claim", "stores_claim",
//         "clients": [{"client_id", "client_secret", "alg", "role", "stores"?}]}
// Prints one JSON line when it listens: {"issuer", "kids": {"RS256", "ES256"}}.
// On standard input, the line `rotate` makes new signing keys (new kids) and publishes them
// before the old ones (kept in the set, as a rotation does), answering {"rotated": {kids}}.
// Beside the provider, for the test only:
//   GET  /test/stats  -> {"discovery": n, "jwks": n} requests served so far
//   POST /test/forge  {"kind", "kid"?, "claims"} -> {"token"}: tokens the provider would never
//        issue, made with jose (the provider's own JOSE library): "RS256"/"ES256" with the
//        provider's current private key and any claims, "foreign" (RS256 with a key that is not
//        the provider's), "hs256-public" (HS256 keyed with the RSA public key's PEM: the
//        algorithm-confusion attack) and "none" (unsigned).
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';

import Provider, { errors } from 'oidc-provider';
import { SignJWT, exportJWK, exportSPKI, generateKeyPair, base64url } from 'jose';

const input = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const issuer = `http://127.0.0.1:${input.port}`;
const byId = Object.fromEntries(input.clients.map((c) => [c.client_id, c]));

let generation = 0;
// Private JWKs, newest first; and the current signing key per algorithm.
let published = [];
const current = {};

async function newKeys() {
  generation += 1;
  const made = {};
  for (const alg of ['RS256', 'ES256']) {
    const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
    const kid = `${alg.toLowerCase()}-${generation}-${Math.random().toString(36).slice(2, 8)}`;
    const jwk = { ...(await exportJWK(privateKey)), kid, alg, use: 'sig' };
    current[alg] = { kid, privateKey, publicKey };
    made[alg] = kid;
    published = [jwk, ...published];
  }
  return made;
}

function provider() {
  return new Provider(issuer, {
    clients: input.clients.map((c) => ({
      client_id: c.client_id,
      client_secret: c.client_secret,
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_basic',
    })),
    jwks: { keys: published },
    cookies: { keys: ['fitorder-test-issuer-cookie-key'] },
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => input.audience,
        useGrantedResource: () => true,
        getResourceServerInfo: (_ctx, resource, client) => {
          if (resource !== input.audience && resource !== input.other_audience) {
            throw new errors.InvalidTarget();
          }
          const { alg } = byId[client.clientId];
          return {
            scope: 'staff',
            audience: resource,
            accessTokenFormat: 'jwt',
            accessTokenTTL: 600,
            jwt: { sign: { alg, kid: current[alg].kid } },
          };
        },
      },
    },
    extraTokenClaims: (_ctx, token) => {
      const c = byId[token.clientId];
      const claims = { [input.role_claim]: c.role };
      if (c.stores) claims[input.stores_claim] = c.stores;
      return claims;
    },
  });
}

const stats = { discovery: 0, jwks: 0 };
await newKeys();
let handler = provider().callback();

async function body(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

async function forge({ kind, kid, claims }) {
  const enc = (o) => base64url.encode(JSON.stringify(o));
  switch (kind) {
    case 'RS256':
    case 'ES256':
      return new SignJWT(claims)
        .setProtectedHeader({ alg: kind, typ: 'at+jwt', kid: kid ?? current[kind].kid })
        .sign(current[kind].privateKey);
    case 'foreign': {
      const { privateKey } = await generateKeyPair('RS256');
      return new SignJWT(claims)
        .setProtectedHeader({ alg: 'RS256', typ: 'at+jwt', kid: kid ?? current.RS256.kid })
        .sign(privateKey);
    }
    case 'hs256-public': {
      const pem = await exportSPKI(current.RS256.publicKey);
      return new SignJWT(claims)
        .setProtectedHeader({ alg: 'HS256', typ: 'at+jwt', kid: kid ?? current.RS256.kid })
        .sign(new TextEncoder().encode(pem));
    }
    case 'none':
      return `${enc({ alg: 'none', typ: 'at+jwt', kid: kid ?? current.RS256.kid })}.${enc(claims)}.`;
    default:
      throw new Error(`unknown kind ${kind}`);
  }
}

const server = http.createServer(async (req, res) => {
  const path = req.url.split('?')[0];
  if (path === '/.well-known/openid-configuration') stats.discovery += 1;
  if (path === '/jwks') stats.jwks += 1;
  try {
    if (path === '/test/stats') {
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify(stats));
      return;
    }
    if (path === '/test/forge' && req.method === 'POST') {
      const token = await forge(await body(req));
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ token }));
      return;
    }
  } catch (e) {
    res.statusCode = 500;
    res.end(String(e));
    return;
  }
  handler(req, res);
});

server.listen(input.port, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ issuer, kids: { RS256: current.RS256.kid, ES256: current.ES256.kid } })}\n`);
});

createInterface({ input: process.stdin }).on('line', async (line) => {
  if (line.trim() === 'rotate') {
    const kids = await newKeys();
    handler = provider().callback();
    process.stdout.write(`${JSON.stringify({ rotated: kids })}\n`);
  }
});
// The test's end closes standard input: so ends the issuer.
process.stdin.on('end', () => process.exit(0));
