// fitorder's Alipay signatures against the official Node SDK `alipay-sdk` (pinned in
// package.json). Input: a JSON file (argv[2]) written by tests/it/sdk_crosscheck.rs; output: one
// JSON object on stdout.
//
// What the SDK itself does here:
// - `sdkExec(method, params)`: the SDK signs a request the way `exec` / `pageExec` do (its
//   `sign()` util: every parameter, sign_type included, sorted) and returns the app order
//   string (`alipay.trade.app.pay`); PKCS#1 v1.5 is deterministic, so the signatures must match;
// - `notifyRSACheck(params, sign, 'RSA2', true)`: the SDK's verification over exactly the
//   parameters given (sign_type kept, raw values), i.e. what the gateway checks for a request;
// - `checkNotifySignV2`: the SDK's lenient check (with and without sign_type);
// - `checkResponseSign`: how the SDK checks a gateway answer (over the raw `<method>_response` text).
import { readFileSync } from 'node:fs';
import { createSign } from 'node:crypto';
import { AlipaySdk } from 'alipay-sdk';

const inp = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const out = { requests: [] };

// The gateway's view of the app: it knows the app public key.
const gateway = new AlipaySdk({
  appId: inp.app_id, privateKey: inp.app_key_pem, keyType: 'PKCS8', alipayPublicKey: inp.app_public_pem,
});
const COMMON = new Set(['app_id', 'method', 'charset', 'version', 'sign_type', 'sign', 'biz_content']);

for (const r of inp.requests) {
  const ours = Object.fromEntries(r.params);
  const bizParams = {};
  for (const [k, v] of r.params) {
    if (!COMMON.has(k)) bizParams[k] = v;
  }
  if (ours.biz_content) bizParams.bizContent = JSON.parse(ours.biz_content);
  const sdkString = gateway.sdkExec(r.method, bizParams);
  const sdkFields = Object.fromEntries(new URLSearchParams(sdkString));
  const signed = { ...ours };
  delete signed.sign;
  const tampered = { ...signed, biz_content: ours.biz_content.replace(/"total_amount":"[^"]*"/, '"total_amount":"9999.00"') };
  const withoutSignType = { ...signed };
  delete withoutSignType.sign_type;
  out.requests.push({
    sdk_string: sdkString,
    sdk_sign: sdkFields.sign,
    sdk_fields: sdkFields,
    ours_accepted: gateway.notifyRSACheck(signed, ours.sign, 'RSA2', true),
    tampered_accepted: gateway.notifyRSACheck(tampered, ours.sign, 'RSA2', true),
    tampered_accepted_v2: gateway.checkNotifySignV2({ ...tampered, sign: ours.sign }),
    without_sign_type_accepted: gateway.notifyRSACheck(withoutSignType, ours.sign, 'RSA2', true),
  });
}

// An answer the gateway side signs (over the exact text it writes), checked by the SDK.
const a = inp.answer;
const client = new AlipaySdk({
  appId: inp.app_id, privateKey: inp.app_key_pem, keyType: 'PKCS8', alipayPublicKey: a.alipay_public_pem,
});
const key = `${a.method.replaceAll('.', '_')}_response`;
const text = JSON.stringify(a.response).replaceAll('/', '\\/');
const sign = createSign('RSA-SHA256').update(text, 'utf8').sign(a.alipay_key_pem, 'base64');
const body = `{"${key}":${text},"sign":"${sign}"}`;
const tamperedBody = body.replace('TRADE_SUCCESS', 'TRADE_CLOSED');
const accepts = (raw) => {
  try {
    client.checkResponseSign(raw, key, JSON.parse(raw).sign);
    return true;
  } catch {
    return false;
  }
};
out.answer = { body, sdk_accepts: accepts(body), tampered_body: tamperedBody, sdk_accepts_tampered: accepts(tamperedBody) };
console.log(JSON.stringify(out));
