#!/usr/bin/env python3
"""A local stand-in for the chat robots fitorder alerts go to, written from the providers'
documentation and sharing no code with fitorder's client:

- WeCom (企业微信) group robot: POST {"msgtype": "markdown", "markdown": {"content": ...}},
  content at most 4096 bytes; answers {"errcode": 0, "errmsg": "ok"}.
- DingTalk (钉钉) custom robot with the 加签 setting: `timestamp` (ms) and `sign` query
  parameters, sign = urlencode(base64(HmacSHA256(key=secret, msg=timestamp + "\n" + secret))),
  timestamp within an hour; a wrong one is answered HTTP 200 {"errcode": 310000, ...}.
- Feishu (飞书) custom bot with 签名校验: `timestamp` (s) and `sign` in the body,
  sign = base64(HmacSHA256(key=timestamp + "\n" + secret, msg="")); a wrong one is answered
  HTTP 200 {"code": 19021, "msg": "sign match fail or timestamp is not within one hour ..."}.
- A generic receiver of Alertmanager's webhook payload (version "4").

Paths: /<kind>/<name>. argv[1] is JSON: {"secrets": {name: secret}, "fail_first": {name: n}}
(the first n requests to `name` are answered with the provider's "too many requests" code).
GET /_log returns every request with what was checked. The first line printed is the port.
"""
import base64, hashlib, hmac, json, sys, threading, time, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
SECRETS = CONFIG.get("secrets", {})
FAIL_FIRST = dict(CONFIG.get("fail_first", {}))
LOG = []
LOCK = threading.Lock()


def dingtalk_expected(secret, ts):
    digest = hmac.new(secret.encode(), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def feishu_expected(secret, ts):
    digest = hmac.new(f"{ts}\n{secret}".encode(), b"", hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def check(kind, name, query, body):
    """Returns (accepted, answer, problem)."""
    secret = SECRETS.get(name)
    if kind == "wecom":
        ok = body.get("msgtype") == "markdown" and isinstance(body.get("markdown", {}).get("content"), str)
        if not ok or len(body["markdown"]["content"].encode()) > 4096:
            return False, {"errcode": 40008, "errmsg": "invalid message type"}, "shape"
        return True, {"errcode": 0, "errmsg": "ok"}, None
    if kind == "dingtalk":
        if secret is not None:
            ts = query.get("timestamp", [""])[0]
            sign = query.get("sign", [""])[0]  # parse_qs has URL-decoded it once
            fresh = ts.isdigit() and abs(time.time() * 1000 - int(ts)) < 3600 * 1000
            if not fresh or not hmac.compare_digest(sign, dingtalk_expected(secret, ts)):
                return False, {"errcode": 310000, "errmsg": "sign not match"}, "signature"
        md = body.get("markdown", {})
        if body.get("msgtype") != "markdown" or not isinstance(md.get("title"), str) or not isinstance(md.get("text"), str):
            return False, {"errcode": 40035, "errmsg": "missing parameter"}, "shape"
        return True, {"errcode": 0, "errmsg": "ok"}, None
    if kind == "feishu":
        if secret is not None:
            ts = str(body.get("timestamp", ""))
            fresh = ts.isdigit() and abs(time.time() - int(ts)) < 3600
            if not fresh or not hmac.compare_digest(str(body.get("sign", "")), feishu_expected(secret, ts)):
                return False, {"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time"}, "signature"
        mt = body.get("msg_type")
        content = body.get("content", {})
        ok = (mt == "text" and isinstance(content.get("text"), str)) or (
            mt == "post" and isinstance(content.get("post", {}).get("zh_cn", {}).get("content"), list))
        if not ok:
            return False, {"code": 9499, "msg": "Bad Request"}, "shape"
        return True, {"code": 0, "msg": "success", "data": {}}, None
    if kind == "webhook":
        alerts = body.get("alerts")
        if body.get("version") != "4" or not alerts or "alertname" not in alerts[0].get("labels", {}):
            return False, None, "shape"
        return True, None, None
    return False, None, "unknown kind"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, obj):
        data = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with LOCK:
            self.answer(200, LOG)

    def do_POST(self):
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        kind, name = (parts + ["", ""])[:2]
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        query = urllib.parse.parse_qs(url.query)
        with LOCK:
            failing = FAIL_FIRST.get(name, 0) > 0
            if failing:
                FAIL_FIRST[name] -= 1
        if failing:
            accepted, problem = False, "injected failure"
            answer = {"code": 11232, "msg": "frequency limited"} if kind == "feishu" else {"errcode": 45009, "errmsg": "api freq out of limit"}
            status = 200 if kind != "webhook" else 503
        else:
            accepted, answer, problem = check(kind, name, query, body)
            status = 200 if accepted or kind != "webhook" else 400
        with LOCK:
            LOG.append({"kind": kind, "name": name, "accepted": accepted, "problem": problem,
                        "body": body, "trace": self.headers.get("X-Trace-Id")})
        self.answer(status, answer)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
