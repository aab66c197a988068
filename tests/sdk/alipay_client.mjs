// The official `alipay-sdk` as a client of the provider stand-in (tests/standin/provider.py):
// `exec` against the stand-in's gateway with `validateSign: true` (the SDK checks every answer's
// `sign` over the raw `<method>_response` text and throws otherwise); in certificate mode the SDK
// reads the stand-in's certificates and computes app_cert_sn / alipay_root_cert_sn itself; the
// notification is checked with `checkNotifySignV2`. Input: a JSON file (argv[2]) with
// `gateway`, `dir`, `mode`, `app_key_path`; output: one JSON object of steps on stdout.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { AlipaySdk } from 'alipay-sdk';

const inp = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const dir = inp.dir;
const cfg = JSON.parse(readFileSync(`${dir}/config.json`, 'utf8')).alipay;
const config = { appId: cfg.app_id, privateKey: readFileSync(inp.app_key_path, 'utf8'), keyType: 'PKCS8', gateway: inp.gateway };
if (inp.mode === 'certificate') {
  Object.assign(config, {
    appCertPath: `${dir}/appCertPublicKey.crt`,
    alipayPublicCertPath: `${dir}/alipayCertPublicKey_RSA2.crt`,
    alipayRootCertPath: `${dir}/alipayRootCert.crt`,
  });
} else {
  config.alipayPublicKey = readFileSync(`${dir}/alipay_public_key.pem`, 'utf8');
}
const sdk = new AlipaySdk(config);

// A notify_url the stand-in can reach.
const received = [];
const server = createServer((req, res) => {
  let body = '';
  req.on('data', (c) => { body += c; });
  req.on('end', () => { received.push(body); res.end('success'); });
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const notifyUrl = `http://127.0.0.1:${server.address().port}/pay/alipay/notify`;

const steps = { sns: { app_cert_sn: sdk.config.appCertSn ?? null, alipay_root_cert_sn: sdk.config.alipayRootCertSn ?? null } };
async function step(name, fn) {
  try {
    steps[name] = await fn();
  } catch (e) {
    steps[name] = { error: `${e.name}: ${e.message}` };
  }
}
const control = async (path, body) => (await fetch(`${new URL(inp.gateway).origin}/_standin/${path}`, {
  method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
})).json();
const exec = (method, bizContent, extra = {}) => sdk.exec(method, { bizContent, ...extra }, { validateSign: true });

const no = inp.out_trade_no ?? 'SDK20261201000002';
await step('precreate', () => exec('alipay.trade.precreate', { out_trade_no: no, total_amount: '88.00', subject: '会员卡' }, { notifyUrl }));
await step('query_before_scan', () => exec('alipay.trade.query', { out_trade_no: no }));
await control('trade', { provider: 'alipay', out_trade_no: no, state: 'TRADE_SUCCESS' });
await step('query_paid', () => exec('alipay.trade.query', { out_trade_no: no }));
await step('refund', () => exec('alipay.trade.refund', { out_trade_no: no, refund_amount: '8.00', out_request_no: `${no}R1` }));
await step('refund_query', () => exec('alipay.trade.fastpay.refund.query', { out_trade_no: no, out_request_no: `${no}R1` }));
await step('close_paid', () => exec('alipay.trade.close', { out_trade_no: no }));
await step('notify', async () => {
  const sent = await control('notify', { provider: 'alipay', out_trade_no: no });
  const fields = Object.fromEntries(new URLSearchParams(received.at(-1)));
  return { status: sent.status, body: sent.body, verified: sdk.checkNotifySignV2(fields), fields };
});
// fund_change N: the money has not moved; the refund query finds no finished refund until then.
await control('money', { alipay_refund_pending: true });
await step('refund_pending', () => exec('alipay.trade.refund', { out_trade_no: no, refund_amount: '2.00', out_request_no: `${no}R2` }));
await step('refund_query_pending', () => exec('alipay.trade.fastpay.refund.query', { out_trade_no: no, out_request_no: `${no}R2` }));
await control('refund', { provider: 'alipay', out_request_no: `${no}R2` });
await step('refund_query_settled', () => exec('alipay.trade.fastpay.refund.query', { out_trade_no: no, out_request_no: `${no}R2` }));
// The deadline race: the member pays just before the close arrives.
const race = `${no}C`;
await control('money', { alipay_refund_pending: false, pay_on_close: [race] });
await step('precreate_race', () => exec('alipay.trade.precreate', { out_trade_no: race, total_amount: '88.00', subject: '会员卡' }, { notifyUrl }));
await control('trade', { provider: 'alipay', out_trade_no: race, state: 'WAIT_BUYER_PAY' });
await step('close_paid_meanwhile', () => exec('alipay.trade.close', { out_trade_no: race }));
await step('query_paid_meanwhile', () => exec('alipay.trade.query', { out_trade_no: race }));
server.close();
console.log(JSON.stringify(steps));
