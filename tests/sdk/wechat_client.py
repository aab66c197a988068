#!/usr/bin/env python3
"""The `wechatpayv3` SDK as a client of the provider stand-in (tests/standin/provider.py): if
the stand-in speaks WeChat Pay API v3, the SDK's own code accepts its answers (it verifies every
2xx answer's `Wechatpay-*` signature, and raises otherwise), decrypts its certificates
(certificate mode) and its notifications. Input: a JSON file (argv[1]) with `base`, `dir`,
`mode`, `merchant_key_path`; output: one JSON object of steps on stdout.

The SDK's gateway is fixed to https://api.mch.weixin.qq.com; only the transport is pointed at
the stand-in (the `requests` calls are given the stand-in's base URL), the SDK's code is untouched.
"""
import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import requests
import wechatpayv3.core as core
from wechatpayv3 import WeChatPay, WeChatPayType

inp = json.load(open(sys.argv[1], encoding="utf-8"))
base, d = inp["base"], inp["dir"]
cfg = json.load(open(d + "/config.json", encoding="utf-8"))["wechat"]
REAL = "https://api.mch.weixin.qq.com"


class Transport:
    @staticmethod
    def get(url, **kw):
        return requests.get(url.replace(REAL, base), **kw)

    @staticmethod
    def post(url, **kw):
        return requests.post(url.replace(REAL, base), **kw)


core.requests = Transport

# A notify_url the stand-in can reach: keeps the headers and body it is sent.
received = []


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        received.append((dict(self.headers.items()), body.decode()))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


server = HTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
notify_url = "http://127.0.0.1:%d/pay/wechat/notify" % server.server_address[1]

steps = {}


def step(name, fn):
    try:
        r = fn()
        if isinstance(r, tuple):
            code, text = r
            r = {"code": code, "body": json.loads(text) if text else None}
        steps[name] = r
    except Exception as e:  # the SDK raises when an answer does not verify
        steps[name] = {"error": "%s: %s" % (type(e).__name__, e)}


def control(path, body):
    req = urllib.request.Request(base + "/_standin/" + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return {"error": e.code}


kw = dict(mchid=cfg["mchid"], private_key=open(inp["merchant_key_path"]).read(), cert_serial_no=cfg["merchant_serial"],
          appid=cfg["appid"], apiv3_key=cfg["apiv3_key"], notify_url=notify_url)
if inp["mode"] == "public-key":
    kw.update(public_key=open(d + "/wechat_public_key.pem").read(), public_key_id=cfg["serial"])
pay = None


def init():
    global pay
    pay = WeChatPay(wechatpay_type=WeChatPayType.NATIVE, **kw)  # certificate mode: downloads /v3/certificates
    return {"ok": True, "certificates": [hex(c.serial_number)[2:].upper() for c in pay._core._certificates]}


step("init", init)
no = inp.get("out_trade_no", "SDK20261201000001")
if pay is not None:
    amount = {"total": 100, "currency": "CNY"}
    step("native", lambda: pay.pay(description="会员卡", out_trade_no=no, amount=amount,
                                   time_expire="2026-12-01T18:00:00+08:00"))
    step("jsapi", lambda: pay.pay(description="私教课", out_trade_no=no + "J", amount=amount,
                                  payer={"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"}, pay_type=WeChatPayType.JSAPI))
    step("app", lambda: pay.pay(description="团课", out_trade_no=no + "A", amount=amount, pay_type=WeChatPayType.APP))
    step("h5", lambda: pay.pay(description="团课", out_trade_no=no + "H", amount=amount, pay_type=WeChatPayType.H5,
                               scene_info={"payer_client_ip": "127.0.0.1", "h5_info": {"type": "Wap"}}))
    step("query_unpaid", lambda: pay.query(out_trade_no=no))
    step("close", lambda: pay.close(out_trade_no=no + "A"))
    control("trade", {"provider": "wechat", "out_trade_no": no, "state": "SUCCESS"})
    step("query_paid", lambda: pay.query(out_trade_no=no))
    step("refund", lambda: pay.refund(out_refund_no=no + "R1", out_trade_no=no,
                                      amount={"refund": 40, "total": 100, "currency": "CNY"}))
    step("refund_query", lambda: pay.query_refund(out_refund_no=no + "R1"))

    def notification():
        sent = control("notify", {"provider": "wechat", "out_trade_no": no})
        headers, body = received[-1]
        return {"status": sent["status"], "callback": pay.callback(headers, body)}

    step("notify", notification)

    # A refund PROCESSING that the refund query still finds PROCESSING, then SUCCESS once it ends.
    control("money", {"wechat_refund_hold": True})
    step("refund_processing", lambda: pay.refund(out_refund_no=no + "R2", out_trade_no=no,
                                                 amount={"refund": 10, "total": 100, "currency": "CNY"}))
    step("refund_query_processing", lambda: pay.query_refund(out_refund_no=no + "R2"))
    control("refund", {"provider": "wechat", "out_refund_no": no + "R2", "status": "SUCCESS"})
    step("refund_query_settled", lambda: pay.query_refund(out_refund_no=no + "R2"))
    # The deadline race: the member pays just before the close arrives.
    control("money", {"wechat_refund_hold": False, "pay_on_close": [no + "J"]})
    step("close_paid_meanwhile", lambda: pay.close(out_trade_no=no + "J"))
    step("query_paid_meanwhile", lambda: pay.query(out_trade_no=no + "J"))
print(json.dumps(steps, ensure_ascii=False))
