#!/usr/bin/env python3
"""fitorder's WeChat Pay v3 signatures against the official-channel Python SDK `wechatpayv3`
(pinned in requirements.txt). Input: a JSON file (argv[1]) written by
tests/it/sdk_crosscheck.rs; output: one JSON object on stdout.

What the SDK itself does here:
- `WeChatPay.sign([...])`: the SDK's helper for the client pay parameters (JSAPI `paySign`
  over appId/timeStamp/nonceStr/package, APP `sign` over appid/timestamp/noncestr/prepayid);
- `utils.build_authorization`: the SDK's `Authorization` header (its clock pinned to our
  timestamp, our nonce passed in) - PKCS#1 v1.5 is deterministic, so the bytes must match;
- `Core._verify_signature`: how the SDK checks an answer's `Wechatpay-*` headers.
"""
import json
import sys
import types

import wechatpayv3.utils as wxutils
from wechatpayv3 import WeChatPay, WeChatPayType

inp = json.load(open(sys.argv[1], encoding="utf-8"))
out = {}

pay = WeChatPay(
    wechatpay_type=WeChatPayType.JSAPI,
    mchid=inp["mchid"],
    private_key=inp["merchant_key_pem"],
    cert_serial_no=inp["serial"],
    appid=inp["appid"],
    apiv3_key="0" * 32,
    public_key=inp["answer"]["platform_public_pem"],
    public_key_id=inp["answer"]["serial"],
)

j = inp["jsapi"]
out["jsapi_pay_sign"] = pay.sign([inp["appid"], str(j["timestamp"]), j["nonce"], "prepay_id=" + j["prepay_id"]])
a = inp["app"]
out["app_sign"] = pay.sign([inp["appid"], str(a["timestamp"]), a["nonce"], a["prepay_id"]])

key = wxutils.load_private_key(inp["merchant_key_pem"])
headers = []
for case in inp["authorization"]:
    wxutils.time = types.SimpleNamespace(time=lambda ts=case["timestamp"]: ts)
    headers.append(wxutils.build_authorization(case["path"], case["method"], inp["mchid"], inp["serial"], key,
                                               data=case["body"], nonce_str=case["nonce"]))
out["authorization"] = headers

ans = inp["answer"]


def verify(sig, body, serial=None):
    h = {"Wechatpay-Signature": sig, "Wechatpay-Timestamp": str(ans["timestamp"]), "Wechatpay-Nonce": ans["nonce"],
         "Wechatpay-Serial": serial or ans["serial"], "Wechatpay-Signature-Type": "WECHATPAY2-SHA256-RSA2048"}
    return pay._core._verify_signature(h, body)


# The provider's side, as the docs define it, signed with the SDK's RSA helper.
platform_key = wxutils.load_private_key(ans["platform_key_pem"])
out["answer_signature_by_sdk_side"] = wxutils.rsa_sign(platform_key, "%s\n%s\n%s\n" % (ans["timestamp"], ans["nonce"], ans["body"]))
out["sdk_accepts_sdk_side_signature"] = verify(out["answer_signature_by_sdk_side"], ans["body"])
out["sdk_accepts_our_signature"] = verify(ans["our_signature"], ans["body"])
out["sdk_accepts_tampered_body"] = verify(ans["our_signature"], ans["body"].replace("SUCCESS", "NOTPAY"))
out["sdk_accepts_tampered_timestamp"] = pay._core._verify_signature(
    {"Wechatpay-Signature": ans["our_signature"], "Wechatpay-Timestamp": str(ans["timestamp"] + 1),
     "Wechatpay-Nonce": ans["nonce"], "Wechatpay-Serial": ans["serial"],
     "Wechatpay-Signature-Type": "WECHATPAY2-SHA256-RSA2048"}, ans["body"])
print(json.dumps(out))
