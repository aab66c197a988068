#!/usr/bin/env python3
"""A stand-in for WeChat's mini-program server API (api.weixin.qq.com), on 127.0.0.1, for testing
fitorder's member sign-in against something that is not fitorder.

Written from WeChat's documentation only, Python stdlib only; it shares no code with fitorder.
Pages it follows (cited again where used):

  [LOGIN]  小程序登录 code2Session: GET /sns/jscode2session?appid=&secret=&js_code=&grant_type=authorization_code
           https://developers.weixin.qq.com/miniprogram/dev/OpenApiDoc/user-login/code2Session.html
           answer {openid, session_key, unionid?} or {errcode, errmsg}: 40029 invalid code (also an
           expired one: a code lives 5 minutes), 40163 code been used (one use), 45011 api minute-quota
           reach limit (100 a minute per user), 40226 high risk user, -1 system busy
  [STABLE] 获取稳定版接口调用凭据 POST /cgi-bin/stable_token {grant_type: client_credential, appid,
           secret, force_refresh}: https://developers.weixin.qq.com/miniprogram/dev/OpenApiDoc/mp-access-token/getStableAccessToken.html
           answer {access_token, expires_in: 7200}; without force_refresh the token held is answered
           again while it is valid; force_refresh makes a new one and the old one stops working
  [TOKEN]  获取接口调用凭据 GET /cgi-bin/token?grant_type=client_credential&appid=&secret=:
           https://developers.weixin.qq.com/miniprogram/dev/OpenApiDoc/mp-access-token/getAccessToken.html
           every call makes a new token, the previous one stops working ("重复获取将导致上次获取的
           access_token 失效"); 40013 invalid appid, 40125 invalid appsecret
  [PHONE]  获取手机号 POST /wxa/business/getuserphonenumber?access_token= {code, openid?}:
           https://developers.weixin.qq.com/miniprogram/dev/server/API/user-info/phone-number/api_getphonenumber.md
           a code is used once and lives 5 minutes; with openid, WeChat checks the code was given to
           that user (openid和code的绑定关系); answer {errcode: 0, errmsg: "ok", phone_info:
           {phoneNumber, purePhoneNumber, countryCode, watermark: {timestamp, appid}}}; 40001 invalid
           credential (access_token invalid or not latest), 40029 invalid code, -1 system busy

Usage: wechat_miniprogram.py --appid APPID --secret SECRET [--port 0]
Prints one JSON line {"port": N} on stdout when it listens.

Control API (JSON), under /_standin/:
  POST login {"openid", "unionid"?}                -> {"code"}: what wx.login would hand out
  POST phone {"phone", "country_code"?, "openid"}  -> {"code"}: what getPhoneNumber would hand out
  POST expire {"code"}                             -> ages a code past its 5 minutes
  POST mode {"busy": n}                            -> the next n API calls answer -1 (system busy)
  POST invalidate                                  -> every access_token stops working (as after a reset)
  GET  stats                                       -> {"token_fetches", "calls": [{"path", "errcode"}]}
"""

import argparse
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

CODE_LIFETIME = 300  # [LOGIN], [PHONE]: 5 minutes
TOKEN_LIFETIME = 7200  # [STABLE], [TOKEN]
USER_MINUTE_QUOTA = 100  # [LOGIN] 45011


class State:
    def __init__(self, appid, secret):
        self.lock = threading.Lock()
        self.appid = appid
        self.secret = secret
        self.login_codes = {}  # code -> {openid, unionid, at, used}
        self.phone_codes = {}  # code -> {phone, country, openid, at, used}
        self.tokens = {}  # token -> expires_at (valid ones only)
        self.stable = None  # the token stable_token answers without force_refresh
        self.busy = 0
        self.token_fetches = 0
        self.calls = []
        self.user_calls = {}  # openid -> [timestamps]

    def new_code(self):
        # wx.login codes are 32 characters of letters and digits.
        return secrets.token_hex(16)

    def take_busy(self):
        if self.busy > 0:
            self.busy -= 1
            return True
        return False

    def new_token(self):
        t = secrets.token_urlsafe(96)[:128]
        self.tokens[t] = time.time() + TOKEN_LIFETIME
        self.token_fetches += 1
        return t


STATE = None


def err(code, msg):
    return {"errcode": code, "errmsg": msg}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, body, status=200):
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return None

    def record(self, path, body):
        STATE.calls.append({"path": path, "errcode": body.get("errcode", 0)})
        return body

    def do_GET(self):
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        with STATE.lock:
            if u.path == "/sns/jscode2session":
                return self.answer(self.record(u.path, self.code2session(q)))
            if u.path == "/cgi-bin/token":
                return self.answer(self.record(u.path, self.token(q)))
            if u.path == "/_standin/stats":
                return self.answer({"token_fetches": STATE.token_fetches, "calls": STATE.calls})
        self.answer(err(-1, "not found"), 404)

    def do_POST(self):
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        body = self.body()
        with STATE.lock:
            if u.path == "/cgi-bin/stable_token":
                return self.answer(self.record(u.path, self.stable_token(body)))
            if u.path == "/wxa/business/getuserphonenumber":
                return self.answer(self.record(u.path, self.phone(q, body)))
            if u.path.startswith("/_standin/"):
                return self.answer(self.control(u.path[len("/_standin/"):], body or {}))
        self.answer(err(-1, "not found"), 404)

    # [LOGIN]
    def code2session(self, q):
        if STATE.take_busy():
            return err(-1, "system error")
        if q.get("appid") != STATE.appid:
            return err(40013, "invalid appid")
        if q.get("secret") != STATE.secret:
            return err(40125, "invalid appsecret")
        if q.get("grant_type") != "authorization_code":
            return err(40002, "invalid grant_type")
        code = q.get("js_code")
        c = STATE.login_codes.get(code or "")
        if c is None or time.time() - c["at"] > CODE_LIFETIME:
            return err(40029, "invalid code")
        if c["used"]:
            return err(40163, "code been used")
        recent = [t for t in STATE.user_calls.get(c["openid"], []) if time.time() - t < 60]
        if len(recent) >= USER_MINUTE_QUOTA:
            return err(45011, "api minute-quota reach limit  mustslower  retry next minute")
        recent.append(time.time())
        STATE.user_calls[c["openid"]] = recent
        c["used"] = True
        out = {"openid": c["openid"], "session_key": secrets.token_urlsafe(16)}
        if c.get("unionid"):
            out["unionid"] = c["unionid"]
        return out

    # [TOKEN]
    def token(self, q):
        if STATE.take_busy():
            return err(-1, "system error")
        if q.get("grant_type") != "client_credential":
            return err(40002, "invalid grant_type")
        if q.get("appid") != STATE.appid:
            return err(40013, "invalid appid")
        if q.get("secret") != STATE.secret:
            return err(40125, "invalid appsecret")
        STATE.tokens.clear()
        STATE.stable = STATE.new_token()
        return {"access_token": STATE.stable, "expires_in": TOKEN_LIFETIME}

    # [STABLE]
    def stable_token(self, body):
        if STATE.take_busy():
            return err(-1, "system error")
        if not isinstance(body, dict) or body.get("grant_type") != "client_credential":
            return err(40002, "invalid grant_type")
        if body.get("appid") != STATE.appid:
            return err(40013, "invalid appid")
        if body.get("secret") != STATE.secret:
            return err(40125, "invalid appsecret")
        held = STATE.stable
        if body.get("force_refresh") or held is None or STATE.tokens.get(held, 0) <= time.time():
            STATE.tokens.pop(held, None)
            STATE.stable = STATE.new_token()
        return {"access_token": STATE.stable, "expires_in": int(STATE.tokens[STATE.stable] - time.time())}

    # [PHONE]
    def phone(self, q, body):
        if STATE.take_busy():
            return err(-1, "system error")
        token = q.get("access_token", "")
        if STATE.tokens.get(token, 0) <= time.time():
            return err(40001, "invalid credential, access_token is invalid or not latest")
        if not isinstance(body, dict):
            return err(47001, "data format error")
        c = STATE.phone_codes.get(body.get("code") or "")
        if c is None or c["used"] or time.time() - c["at"] > CODE_LIFETIME:
            return err(40029, "invalid code")
        if body.get("openid") is not None and body.get("openid") != c["openid"]:
            return err(40029, "invalid code, openid and code not match")
        c["used"] = True
        country = c["country"]
        return {
            "errcode": 0,
            "errmsg": "ok",
            "phone_info": {
                "phoneNumber": c["phone"] if country == "86" else "+%s %s" % (country, c["phone"]),
                "purePhoneNumber": c["phone"],
                "countryCode": country,
                "watermark": {"timestamp": int(c["at"]), "appid": STATE.appid},
            },
        }

    def control(self, what, body):
        if what == "login":
            code = STATE.new_code()
            STATE.login_codes[code] = {
                "openid": body["openid"],
                "unionid": body.get("unionid"),
                "at": time.time(),
                "used": False,
            }
            return {"code": code}
        if what == "phone":
            code = secrets.token_hex(32)
            STATE.phone_codes[code] = {
                "phone": body["phone"],
                "country": str(body.get("country_code", "86")),
                "openid": body["openid"],
                "at": time.time(),
                "used": False,
            }
            return {"code": code}
        if what == "expire":
            for table in (STATE.login_codes, STATE.phone_codes):
                if body.get("code") in table:
                    table[body["code"]]["at"] -= CODE_LIFETIME + 1
            return {}
        if what == "mode":
            STATE.busy = int(body.get("busy", 0))
            return {}
        if what == "invalidate":
            STATE.tokens.clear()
            return {}
        return err(-1, "unknown control call")


def main():
    global STATE
    p = argparse.ArgumentParser()
    p.add_argument("--appid", required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    STATE = State(a.appid, a.secret)
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
