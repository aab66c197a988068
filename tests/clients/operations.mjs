// The contract's documents as the apps hold them: one DocumentNode per operation of
// playground/operations/<audience>.graphql, with the fragments it spreads.

import { readFileSync } from 'node:fs';
import { parse, visit, Kind } from 'graphql';

export function operations(audience) {
  const text = readFileSync(new URL(`../../playground/operations/${audience}.graphql`, import.meta.url), 'utf8');
  const doc = parse(text);
  const fragments = new Map(doc.definitions.filter((d) => d.kind === Kind.FRAGMENT_DEFINITION).map((d) => [d.name.value, d]));
  const spread = (node) => {
    const names = new Set();
    visit(node, { FragmentSpread: (s) => void names.add(s.name.value) });
    return names;
  };
  const out = {};
  for (const def of doc.definitions) {
    if (def.kind !== Kind.OPERATION_DEFINITION) continue;
    const used = new Set();
    const pending = [...spread(def)];
    while (pending.length) {
      const name = pending.pop();
      if (used.has(name) || !fragments.has(name)) continue;
      used.add(name);
      pending.push(...spread(fragments.get(name)));
    }
    out[def.name.value] = { kind: Kind.DOCUMENT, definitions: [def, ...[...used].map((n) => fragments.get(n))] };
  }
  return out;
}

/** Records what went over HTTP: method, URL, the request body's keys, the status and the error codes. */
export function recordingFetch(log) {
  return async (input, init = {}) => {
    const res = await fetch(input, init);
    const body = await res.clone().text();
    let codes = [];
    try {
      codes = (JSON.parse(body).errors || []).map((e) => e.extensions?.code);
    } catch {
      /* not JSON */
    }
    const url = new URL(typeof input === 'string' ? input : input.url);
    let sent = {};
    if (init.body) sent = JSON.parse(init.body);
    else for (const [k, v] of url.searchParams) sent[k] = v;
    log.push({ method: init.method || 'GET', hasQuery: 'query' in sent, hashed: JSON.stringify(sent.extensions || '').includes('sha256Hash'), status: res.status, codes });
    return res;
  };
}
