#!/usr/bin/env python3
"""A stand-in for the two payment providers, WeChat Pay API v3 and the Alipay open gateway,
on 127.0.0.1, for testing fitorder's provider client against something that is not fitorder.

Written from the providers' documentation only; it shares no code with fitorder (Python
stdlib `http.server` + PyPI `cryptography`). Pages it follows (cited again where used):

WeChat Pay API v3
  [W-SIGN]   签名生成 / Authorization:
             https://pay.weixin.qq.com/docs/merchant/development/interface-rules/signature-generation.html
             (message `METHOD\\nURL\\ntimestamp\\nnonce_str\\nbody\\n`; header
             `WECHATPAY2-SHA256-RSA2048 mchid="",nonce_str="",signature="",timestamp="",serial_no=""`;
             unsigned or wrongly signed requests are not executed: 401 Unauthorized)
  [W-VERIFY] 验证签名 (answers and notifications):
             https://pay.weixin.qq.com/docs/merchant/development/interface-rules/signature-verification.html
             (`Wechatpay-Timestamp\\nWechatpay-Nonce\\nbody\\n`, `Wechatpay-Serial` = platform
             certificate serial or 微信支付公钥ID `PUB_KEY_ID_` + 32 digits)
  [W-ERR]    error answers `{"code": "...", "message": "..."}`: 401 SIGN_ERROR, 400 PARAM_ERROR,
             400 INVALID_REQUEST, 400 APPID_MCHID_NOT_MATCH, 403 OUT_TRADE_NO_USED,
             404 ORDER_NOT_EXIST, 400 ORDER_CLOSED (关闭订单 https://pay.weixin.qq.com/doc/v3/merchant/4012556398,
             https://pay.weixin.qq.com/wiki/doc/apiv3/apis/chapter3_4_3.shtml)
  [W-PAY]    JSAPI/APP/H5/Native 下单: https://pay.weixin.qq.com/wiki/doc/apiv3/apis/chapter3_1_1.shtml,
             chapter3_2_1 (APP), chapter3_3_1 (H5), chapter3_4_1 (Native); 查询订单 chapter3_4_2;
             退款 chapter3_4_9; 查询单笔退款 chapter3_4_10
  [W-NOTIFY] 支付通知: https://pay.weixin.qq.com/docs/merchant/apis/h5-payment/payment-notice.html and
             https://pay.weixin.qq.com/wiki/doc/apiv3/apis/chapter3_2_5.shtml (resource AEAD_AES_256_GCM
             with the APIv3 key, 12-byte nonce, associated_data; ciphertext = base64(ct || tag))
  [W-CERT]   下载平台证书 GET /v3/certificates: https://pay.weixin.qq.com/wiki/doc/api_external/ch/apis/chapter3_2_8.shtml
             (associated_data "certificate"; a certificate being replaced is listed next to the new one)

  [W-BILL]   申请交易账单 GET /v3/bill/tradebill?bill_date=&bill_type=&tar_type=GZIP
             (https://pay.weixin.qq.com/docs/merchant/apis/combine-payment/bill-download/get-trade-bill.html):
             answer {hash_type: SHA1, hash_value: SHA1 of the *unpacked* bill, download_url}, the URL
             valid 30 s, fetched with a signed GET (the file itself is not signed); the bill made after
             10:00 of the next day; the file: 明细表头, rows each cell prefixed with `, 汇总表头, 汇总
             (the layout of provider-samples/wechat/bill/v3_tradebill_ALL_20210128.csv)

Alipay open gateway
  [A-BILL]   alipay.data.dataservice.bill.downloadurl.query (bill_type trade, bill_date yyyy-MM-dd):
             bill_download_url valid 30 s; the zip holds {pid}_{yyyyMMdd}_业务明细.csv and
             …_业务明细(汇总).csv, GBK, names GBK; isp.bill_not_exist when there is no bill
             (layout of provider-samples/alipay/bill/)
  [A-SIGN]   自行实现签名 https://opendocs.alipay.com/common/02kf5q and https://opendocs.alipay.com/open/291/sign
             (request: every parameter but `sign`, empty values dropped, sorted by key, `k=v` joined by
             `&`, raw values; sign_type is in the content; RSA2 = SHA256withRSA; in certificate mode
             `app_cert_sn` and `alipay_root_cert_sn` are parameters, so signed too)
  [A-RESP]   同步响应验签 (the official Node SDK's checkResponseSign cites the same rule): the answer
             `{"<method>_response": {...}, "sign": "..."}` is signed over the exact text of the
             `<method>_response` value; certificate mode adds `alipay_cert_sn` (segmentfault.com/a/1190000020671193)
  [A-ERR]    公共错误码 (opendocs.alipay.com, 公共错误码): 40001 Missing Required Arguments, 40002 Invalid
             Arguments with isv.invalid-signature ("验签出错…网关生成的验签字符串为：…"), isv.invalid-app-id,
             isv.app-cert-not-exist (应用公钥证书不存在), isv.invalid-alipay-root-cert-sn (无效支付宝根证书序列号);
             40004 Business Failed with ACQ.* sub codes
  [A-TRADE]  API pages alipay.trade.precreate / .query / .close / .refund / .fastpay.refund.query
             (opendocs.alipay.com/open, 当面付): ACQ.TRADE_NOT_EXIST until the buyer has scanned a
             precreated code, ACQ.TRADE_STATUS_ERROR, ACQ.TRADE_HAS_SUCCESS, ACQ.REFUND_AMT_NOT_EQUAL_TOTAL;
             refund_fee is the total refunded; a refund query that finds nothing answers 10000 without
             refund_amount ("如果没有查询到则代表未退款成功")
  [A-REFUND] alipay.trade.refund: `fund_change` "本次退款是否发生了资金变化" — N for a repeated
             out_request_no, or when the money has not moved (yet); then alipay.trade.fastpay.refund.query
             decides: `refund_status` REFUND_SUCCESS "退款处理成功", absent "表示退款请求未收到或者退款失败"
             (opendocs.alipay.com/open/357441a2_alipay.trade.fastpay.refund.query). Closing a paid trade:
             sub_code ACQ.TRADE_HAS_SUCCESS "交易已被支付" (help.aliyun.com/document_detail/2978201,
             trade.close), a closed one ACQ.TRADE_STATUS_ERROR
  [W-REFUND] 退款 status SUCCESS / CLOSED / PROCESSING / ABNORMAL; PROCESSING ends later, told by
             REFUND.* notifications or 查询单笔退款 (chapter3_4_10); 关闭订单 of a paid trade: 400
             ORDERPAID "订单已支付"
  [A-NOTIFY] 异步通知 https://opendocs.alipay.com/open/270/105902 (form POST; "除去 sign、sign_type 两个参数外，
             凡是通知返回回来的参数皆是待验签的参数"; reply `success`, otherwise retried)
  [A-CERT]   公钥证书模式 https://opendocs.alipay.com/open/291/sign: the SN of a certificate is md5 of the
             issuer DN (RDNs from the last to the first, `k=v` joined by `,`) followed by the decimal
             serial; the root SN joins the SNs of the root file's RSA-signed certificates with `_`
  [A-CERTDL] alipay.open.app.alipaycert.download (opendocs.alipay.com/open/03j7vb, 应用支付宝公钥证书下载):
             biz_content {"alipay_cert_sn"}; answers alipay_cert_content = base64 of the certificate
             file; "支付宝公钥证书到期前会自动更新…响应报文中的 alipay_cert_sn 与本地不一致时，通过此接口
             下载新证书，验证其由支付宝根证书签发后使用" (the certificate-mode SDKs do exactly this)

Usage: provider.py --dir DIR --mode public-key|certificate --merchant-public-key PEM
                   --app-public-key PEM [--port 0]
Prints one JSON line `{"port": N}` on stdout when it listens. The control API is under /_standin/
(see README in this folder and the module docs of tests/it/standin.rs).
"""

import argparse
import base64
import datetime
import hashlib
import json
import os
import re
import secrets
import string
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import gzip
import io
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import NameOID

CST = datetime.timezone(datetime.timedelta(hours=8))
ALNUM = string.ascii_letters + string.digits


# ---------------------------------------------------------------- crypto, from the docs

def rsa_sign(key, message: bytes) -> str:
    """SHA256withRSA, PKCS#1 v1.5, base64 ([W-SIGN], [A-SIGN])."""
    return base64.b64encode(key.sign(message, padding.PKCS1v15(), hashes.SHA256())).decode()


def rsa_verify(public_key, message: bytes, signature_b64: str) -> bool:
    try:
        raw = base64.b64decode(signature_b64, validate=True)
        public_key.verify(raw, message, padding.PKCS1v15(), hashes.SHA256())
        return True
    except (InvalidSignature, ValueError, TypeError):
        return False


def new_rsa_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def pem_public(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_public(path):
    with open(path, "rb") as f:
        return serialization.load_pem_public_key(f.read())


def aead_encrypt(apiv3_key: str, plaintext: str, associated_data: str) -> dict:
    """AEAD_AES_256_GCM with the 32-byte APIv3 key, a 12-character nonce ([W-NOTIFY])."""
    nonce = "".join(secrets.choice(ALNUM) for _ in range(12))
    ct = AESGCM(apiv3_key.encode()).encrypt(nonce.encode(), plaintext.encode(), associated_data.encode())
    return {
        "algorithm": "AEAD_AES_256_GCM",
        "associated_data": associated_data,
        "nonce": nonce,
        "ciphertext": base64.b64encode(ct).decode(),
    }


def name(cn, ou="Alipay", o="Ant Financial", c="CN"):
    return x509.Name([
        x509.NameAttribute(NameOID.COUNTRY_NAME, c),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, o),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou),
        x509.NameAttribute(NameOID.COMMON_NAME, cn),
    ])


def issue(subject, public_key, issuer, issuer_key, serial=None, days=365 * 5, ca=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(subject).issuer_name(issuer).public_key(public_key)
         .serial_number(serial or x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(days=1))
         .not_valid_after(now + datetime.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    algo = hashes.SHA256()
    return b.sign(issuer_key, algo)


def cert_pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def alipay_cert_sn(cert) -> str:
    """[A-CERT]: md5(issuer DN, last RDN first, `k=v` joined by `,` + decimal serial)."""
    rdns = [f"{a.rfc4514_attribute_name}={a.value}" for a in cert.issuer]
    principal = ",".join(reversed(rdns))
    return hashlib.md5((principal + str(cert.serial_number)).encode()).hexdigest()


def alipay_root_sn(certs) -> str:
    """[A-CERT]: the SNs of the RSA-signed certificates of the root file, joined by `_`."""
    return "_".join(alipay_cert_sn(c) for c in certs
                    if c.signature_algorithm_oid.dotted_string.startswith("1.2.840.113549.1.1"))


def wechat_serial(cert) -> str:
    return "%040X" % cert.serial_number


def rfc3339_now():
    return datetime.datetime.now(CST).replace(microsecond=0).isoformat()


def alipay_now():
    return datetime.datetime.now(CST).strftime("%Y-%m-%d %H:%M:%S")


def yuan(fen: int) -> str:
    return "%d.%02d" % divmod(int(fen), 100)


def fen(amount: str):
    if not isinstance(amount, str) or not re.fullmatch(r"\d{1,9}(\.\d{1,2})?", amount):
        return None
    whole, _, frac = amount.partition(".")
    return int(whole) * 100 + int((frac + "00")[:2])


def write(path, data):
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---------------------------------------------------------------- state

class Provider:
    def __init__(self, args):
        self.lock = threading.RLock()
        self.dir = args.dir
        self.cert_mode = args.mode == "certificate"
        self.modes = {"wrong_key": False, "unknown_serial": False, "latency_ms": 0, "bill_not_ready": False}
        self.requests = []
        self.wrong_key = new_rsa_key()  # signs answers in the wrong_key mode; published nowhere

        # WeChat Pay: the merchant's identity and its API certificate (WeChat's CA issues it).
        self.mchid = args.mchid
        self.wechat_appid = args.wechat_appid
        self.apiv3_key = "".join(secrets.choice(ALNUM) for _ in range(32))
        self.merchant_public = load_public(args.merchant_public_key)
        self.wechat_ca_key = new_rsa_key()
        self.wechat_ca = issue(name("Tenpay.com Root CA", "Tenpay.com CA Center", "Tenpay.com"),
                               self.wechat_ca_key.public_key(), name("Tenpay.com Root CA", "Tenpay.com CA Center",
                                                                     "Tenpay.com"), self.wechat_ca_key, ca=True)
        self.merchant_cert = issue(name(self.mchid, "Tenpay.com", "微信商户系统"), self.merchant_public,
                                   self.wechat_ca.subject, self.wechat_ca_key)
        self.merchant_serial = wechat_serial(self.merchant_cert)
        # The platform side: a list of (serial, key, cert or None); the last one signs.
        self.platform = []
        self.new_platform_key()

        # Alipay: the app, and Alipay's own key (bare in public-key mode, certified otherwise).
        self.alipay_app_id = args.alipay_app_id
        self.app_public = load_public(args.app_public_key)
        self.alipay_key = new_rsa_key()
        if self.cert_mode:
            root_key = new_rsa_key()
            root_name = name("Ant Financial Certification Authority R1", "Certification Authority")
            self.alipay_root = issue(root_name, root_key.public_key(), root_name, root_key, ca=True)
            # The real root file also holds non-RSA roots, which the root SN leaves out [A-CERT].
            ec_key = ec.generate_private_key(ec.SECP256R1())
            ec_name = name("Ant Financial Certification Authority E1", "Certification Authority")
            self.alipay_ec_root = issue(ec_name, ec_key.public_key(), ec_name, ec_key, ca=True)
            self.alipay_cert = issue(name("支付宝(中国)网络技术有限公司-" + self.alipay_app_id, "Alipay", "Alipay"),
                                     self.alipay_key.public_key(), root_name, root_key)
            self.app_cert = issue(name(self.alipay_app_id, "Alipay", "fitorder"), self.app_public, root_name, root_key)
            self.alipay_cert_sn = alipay_cert_sn(self.alipay_cert)
            self.alipay_root_key, self.alipay_root_name = root_key, root_name
            # Every Alipay certificate ever used, by SN: [A-CERTDL] hands out any of them.
            self.alipay_certs = {self.alipay_cert_sn: self.alipay_cert}
            self.app_cert_sn = alipay_cert_sn(self.app_cert)
            self.alipay_root_cert_sn = alipay_root_sn([self.alipay_root, self.alipay_ec_root])

        self.wechat_trades = {}
        self.wechat_refunds = {}
        # Money's hard cases (`POST /_standin/money`): Alipay refunds answered `fund_change` N
        # whose money moves only when settled; WeChat refunds that stay PROCESSING when queried;
        # trades the member pays just before a close arrives (the deadline race).
        self.money = {"alipay_refund_pending": False, "wechat_refund_hold": False, "pay_on_close": []}
        self.alipay_trades = {}
        self.bill_files = {}  # token -> (provider, bytes)
        self.port = 0
        self.seq = 0
        self.write_material()

    def new_platform_key(self):
        key = new_rsa_key()
        if self.cert_mode:
            cert = issue(name("Tenpay.com sign", "Tenpay.com CA Center", "Tenpay.com"), key.public_key(),
                         self.wechat_ca.subject, self.wechat_ca_key)
            serial = wechat_serial(cert)
        else:
            cert = None
            serial = "PUB_KEY_ID_" + "".join(secrets.choice(string.digits) for _ in range(32))
        self.platform.append({"serial": serial, "key": key, "cert": cert})

    def next_id(self, prefix=""):
        self.seq += 1
        return prefix + time.strftime("%Y%m%d") + "%014d" % (int(time.time() * 1000) % 10 ** 10 * 10 + self.seq)

    def write_material(self):
        d = self.dir
        current = self.platform[-1]
        write(os.path.join(d, "wechat_apiv3_key.txt"), self.apiv3_key)
        write(os.path.join(d, "wechat_merchant_cert.pem"), cert_pem(self.merchant_cert))
        write(os.path.join(d, "wechat_merchant_serial.txt"), self.merchant_serial)
        write(os.path.join(d, "wechat_serial.txt"), current["serial"])
        write(os.path.join(d, "wechat_public_key.pem"), pem_public(current["key"]))
        for p in self.platform:
            if p["cert"] is not None:
                write(os.path.join(d, f"wechat_platform_cert_{p['serial']}.pem"), cert_pem(p["cert"]))
        if current["cert"] is not None:
            write(os.path.join(d, "wechat_platform_cert.pem"), cert_pem(current["cert"]))
        write(os.path.join(d, "alipay_public_key.pem"), pem_public(self.alipay_key))
        config = {
            "mode": "certificate" if self.cert_mode else "public-key",
            "wechat": {
                "mchid": self.mchid, "appid": self.wechat_appid, "merchant_serial": self.merchant_serial,
                "apiv3_key": self.apiv3_key, "serial": current["serial"],
                "serials": [p["serial"] for p in self.platform],
            },
            "alipay": {"app_id": self.alipay_app_id},
        }
        if self.cert_mode:
            write(os.path.join(d, "alipayCertPublicKey_RSA2.crt"), cert_pem(self.alipay_cert))
            write(os.path.join(d, "alipayRootCert.crt"), cert_pem(self.alipay_root) + cert_pem(self.alipay_ec_root))
            write(os.path.join(d, "appCertPublicKey.crt"), cert_pem(self.app_cert))
            write(os.path.join(d, "alipay_cert_sn.txt"), self.alipay_cert_sn)
            write(os.path.join(d, "app_cert_sn.txt"), self.app_cert_sn)
            write(os.path.join(d, "alipay_root_cert_sn.txt"), self.alipay_root_cert_sn)
            config["alipay"].update(alipay_cert_sn=self.alipay_cert_sn, app_cert_sn=self.app_cert_sn,
                                    alipay_root_cert_sn=self.alipay_root_cert_sn)
        tmp = os.path.join(d, "config.json.tmp")
        write(tmp, json.dumps(config, indent=2))
        os.replace(tmp, os.path.join(d, "config.json"))
        self.config = config

    # What signs an answer or a notification, as the modes say.
    def wechat_signer(self):
        current = self.platform[-1]
        key = self.wrong_key if self.modes["wrong_key"] else current["key"]
        serial = current["serial"]
        if self.modes["unknown_serial"]:
            serial = ("PUB_KEY_ID_" + "9" * 32) if not self.cert_mode else "%040X" % (int(serial, 16) ^ 0xABCDEF)
        return key, serial

    def alipay_signer(self):
        key = self.wrong_key if self.modes["wrong_key"] else self.alipay_key
        sn = None
        if self.cert_mode:
            sn = self.alipay_cert_sn
            if self.modes["unknown_serial"]:
                sn = hashlib.md5(sn.encode()).hexdigest()
        return key, sn

    def wechat_sign_headers(self, body: bytes) -> dict:
        """[W-VERIFY]: `timestamp\\nnonce\\nbody\\n`, signed with the platform key."""
        key, serial = self.wechat_signer()
        ts = str(int(time.time()))
        nonce = secrets.token_hex(16).upper()
        sig = rsa_sign(key, ts.encode() + b"\n" + nonce.encode() + b"\n" + body + b"\n")
        return {
            "Wechatpay-Timestamp": ts, "Wechatpay-Nonce": nonce, "Wechatpay-Signature": sig,
            "Wechatpay-Serial": serial, "Wechatpay-Signature-Type": "WECHATPAY2-SHA256-RSA2048",
        }


# ---------------------------------------------------------------- WeChat Pay

class Answer(Exception):
    def __init__(self, status, code, message, detail=None):
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail


AUTH_RE = re.compile(r'(\w+)="([^"]*)"')
OUT_NO_RE = re.compile(r"[0-9A-Za-z_\-*|]{6,32}")
RFC3339_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:\d{2}|Z)")


def wechat_verify_request(p: Provider, method, raw_path, headers, body: bytes):
    """[W-SIGN]: the merchant's Authorization, checked with the merchant API certificate's key."""
    auth = headers.get("Authorization", "")
    scheme, _, rest = auth.partition(" ")
    if scheme != "WECHATPAY2-SHA256-RSA2048":
        raise Answer(401, "SIGN_ERROR", "Authorization不合法")
    fields = dict(AUTH_RE.findall(rest))
    for f in ("mchid", "nonce_str", "signature", "timestamp", "serial_no"):
        if not fields.get(f):
            raise Answer(401, "SIGN_ERROR", f"Authorization不合法: 缺少{f}")
    if fields["mchid"] != p.mchid:
        raise Answer(401, "SIGN_ERROR", "商户号不存在或与Authorization不符")
    if fields["serial_no"].upper() != p.merchant_serial:
        raise Answer(401, "SIGN_ERROR", "商户证书序列号有误。请使用签名私钥匹配的证书序列号")
    try:
        ts = int(fields["timestamp"])
    except ValueError:
        raise Answer(401, "SIGN_ERROR", "Authorization不合法: timestamp")
    if abs(time.time() - ts) > 300:
        raise Answer(401, "SIGN_ERROR", "请求时间与当前时间相差超过5分钟")
    message = (f"{method}\n{raw_path}\n{fields['timestamp']}\n{fields['nonce_str']}\n".encode() + body + b"\n")
    if not rsa_verify(p.merchant_public, message, fields["signature"]):
        raise Answer(401, "SIGN_ERROR", "签名错误,请检查后再试", {
            "detail": {"issue": "sign not match"}, "field": "signature", "location": "authorization",
            "sign_information": {"method": method, "url": raw_path, "sign_message_length": len(message)}})


def require(cond, message):
    if not cond:
        raise Answer(400, "PARAM_ERROR", message)


def wechat_prepay(p: Provider, kind, req):
    """[W-PAY] 下单: the fields the four kinds of order need."""
    require(isinstance(req, dict), "请求体不是JSON对象")
    if req.get("appid") != p.wechat_appid or req.get("mchid") != p.mchid:
        raise Answer(400, "APPID_MCHID_NOT_MATCH", "AppID和mch_id不匹配")
    d = req.get("description")
    require(isinstance(d, str) and 0 < len(d) <= 127, "description 缺失或超长")
    no = req.get("out_trade_no")
    require(isinstance(no, str) and OUT_NO_RE.fullmatch(no), "out_trade_no 应为6-32位数字、字母_-*")
    if "time_expire" in req:
        require(isinstance(req["time_expire"], str) and RFC3339_RE.fullmatch(req["time_expire"]),
                "time_expire 格式应为 yyyy-MM-DDTHH:mm:ss+TIMEZONE (RFC 3339)")
    url = req.get("notify_url")
    parsed = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    # The real notify_url must be https and carry no query; loopback http is allowed here.
    require(parsed is not None and parsed.scheme in ("http", "https") and parsed.netloc and not parsed.query,
            "notify_url 应为不带查询串的绝对地址")
    amount = req.get("amount")
    require(isinstance(amount, dict) and type(amount.get("total")) is int and amount["total"] > 0,
            "amount.total 应为正整数(分)")
    require(amount.get("currency", "CNY") == "CNY", "amount.currency 只支持 CNY")
    if kind == "jsapi":
        payer = req.get("payer")
        require(isinstance(payer, dict) and isinstance(payer.get("openid"), str) and payer["openid"],
                "JSAPI下单 payer.openid 必填")
    if kind == "h5":
        s = req.get("scene_info")
        require(isinstance(s, dict) and s.get("payer_client_ip") and isinstance(s.get("h5_info"), dict)
                and s["h5_info"].get("type"), "H5下单 scene_info.payer_client_ip 与 scene_info.h5_info.type 必填")
    with p.lock:
        t = p.wechat_trades.get(no)
        if t is not None:
            if t["state"] in ("SUCCESS", "REFUND"):
                raise Answer(400, "ORDERPAID", "该订单已支付")
            if t["state"] == "CLOSED":
                raise Answer(400, "ORDER_CLOSED", "订单已关闭")
            if t.get("request") != req or t.get("kind") != kind:
                raise Answer(403, "OUT_TRADE_NO_USED", "商户订单号重复")
            return t["answer"]
        prepay = "wx" + time.strftime("%d%H%M%S") + secrets.token_hex(12)
        if kind in ("jsapi", "app"):
            answer = {"prepay_id": prepay}
        elif kind == "native":
            answer = {"code_url": "weixin://wxpay/bizpayurl?pr=" + secrets.token_urlsafe(6)}
        else:
            answer = {"h5_url": "https://wx.tenpay.com/cgi-bin/mmpayweb-bin/checkmweb?prepay_id=%s&package=%d"
                                % (prepay, secrets.randbelow(10 ** 10))}
        p.wechat_trades[no] = {
            "kind": kind, "request": req, "answer": answer, "state": "NOTPAY", "out_trade_no": no,
            "appid": req["appid"], "total": amount["total"], "notify_url": url, "transaction_id": None,
            "openid": (req.get("payer") or {}).get("openid"), "success_time": None, "refunded": 0,
        }
        return answer


STATE_DESC = {"SUCCESS": "支付成功", "REFUND": "转入退款", "NOTPAY": "未支付", "CLOSED": "已关闭",
              "USERPAYING": "用户支付中（付款码支付）", "REVOKED": "已撤销", "PAYERROR": "支付失败"}
TRADE_TYPE = {"jsapi": "JSAPI", "native": "NATIVE", "app": "APP", "h5": "MWEB"}


def wechat_transaction(p: Provider, t):
    """[W-PAY] 查询订单 answer; the same object is the decrypted resource of the notification."""
    o = {"appid": t["appid"], "mchid": p.mchid, "out_trade_no": t["out_trade_no"],
         "trade_state": t["state"], "trade_state_desc": STATE_DESC.get(t["state"], t["state"]),
         "amount": {"total": t["total"], "currency": "CNY", "payer_currency": "CNY"}}
    if t["state"] in ("SUCCESS", "REFUND"):
        o.update(transaction_id=t["transaction_id"], trade_type=TRADE_TYPE.get(t["kind"], "NATIVE"),
                 bank_type="OTHERS", attach="", success_time=t["success_time"],
                 payer={"openid": t.get("openid") or "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"})
        o["amount"]["payer_total"] = t["total"]
    return o


def wechat_refund_answer(p: Provider, r):
    a = {"refund_id": r["refund_id"], "out_refund_no": r["out_refund_no"],
         "transaction_id": r["transaction_id"], "out_trade_no": r["out_trade_no"], "channel": "ORIGINAL",
         "user_received_account": "支付用户零钱", "create_time": r["create_time"], "status": r["status"],
         "funds_account": "AVAILABLE",
         "amount": {"total": r["total"], "refund": r["refund"], "payer_total": r["total"],
                    "payer_refund": r["refund"], "settlement_total": r["total"], "settlement_refund": r["refund"],
                    "discount_refund": 0, "currency": "CNY", "refund_fee": 0}}
    if r["status"] == "SUCCESS":
        a["success_time"] = r["success_time"]
    return a


def paid_meanwhile(p: Provider, provider, t):
    """The deadline race: a trade named in `pay_on_close` is paid by the member just before the
    close arrives (its notification is not sent: lost, or later by `POST notify`)."""
    if t["out_trade_no"] not in p.money["pay_on_close"]:
        return
    p.money["pay_on_close"].remove(t["out_trade_no"])
    if provider == "wechat" and t["state"] in ("NOTPAY", "USERPAYING"):
        t["state"] = "SUCCESS"
        t["transaction_id"] = t["transaction_id"] or p.next_id("42")
        t["success_time"] = t["success_time"] or rfc3339_now()
    elif provider == "alipay" and t["state"] == "WAIT_BUYER_PAY":
        t["state"] = "TRADE_SUCCESS"
        t["paid_at"] = t["paid_at"] or alipay_now()


def wechat_route(p: Provider, method, path, query, body: bytes):
    """Answers (status, JSON object or None)."""
    def json_body():
        try:
            return json.loads(body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise Answer(400, "PARAM_ERROR", "请求体不是合法的JSON")

    m = re.fullmatch(r"/v3/pay/transactions/(jsapi|native|app|h5)", path)
    if m and method == "POST":
        return 200, wechat_prepay(p, m.group(1), json_body())
    m = re.fullmatch(r"/v3/pay/transactions/out-trade-no/([^/]+)", path)
    if m and method == "GET":
        no = urllib.parse.unquote(m.group(1))
        mchid = query.get("mchid", [None])[0]
        if not mchid:
            raise Answer(400, "PARAM_ERROR", "缺少参数 mchid")
        if mchid != p.mchid:
            raise Answer(400, "MCH_NOT_EXISTS", "商户号不存在")
        with p.lock:
            t = p.wechat_trades.get(no)
            if t is None:
                raise Answer(404, "ORDER_NOT_EXIST", "订单不存在")
            return 200, wechat_transaction(p, t)
    m = re.fullmatch(r"/v3/pay/transactions/out-trade-no/([^/]+)/close", path)
    if m and method == "POST":
        no = urllib.parse.unquote(m.group(1))
        req = json_body()
        require(isinstance(req, dict) and req.get("mchid"), "mchid 必填")
        if req["mchid"] != p.mchid:
            raise Answer(400, "MCH_NOT_EXISTS", "商户号不存在")
        with p.lock:
            t = p.wechat_trades.get(no)
            if t is None:
                raise Answer(404, "ORDER_NOT_EXIST", "订单不存在")
            paid_meanwhile(p, "wechat", t)
            if t["state"] in ("SUCCESS", "REFUND"):
                raise Answer(400, "ORDERPAID", "订单已支付")  # [W-REFUND]
            if t["state"] == "USERPAYING":
                raise Answer(202, "USER_PAYING", "用户支付中,需要输入密码")
            t["state"] = "CLOSED"
            return 204, None
    if path == "/v3/refund/domestic/refunds" and method == "POST":
        req = json_body()
        require(isinstance(req, dict), "请求体不是JSON对象")
        no_r = req.get("out_refund_no")
        require(isinstance(no_r, str) and 1 <= len(no_r) <= 64, "out_refund_no 必填")
        amount = req.get("amount")
        require(isinstance(amount, dict) and type(amount.get("refund")) is int and type(amount.get("total")) is int
                and amount["refund"] > 0, "amount.refund 与 amount.total 必填且为正整数(分)")
        require(amount.get("currency") == "CNY", "amount.currency 必填, CNY")
        if req.get("notify_url") is not None:
            require(urllib.parse.urlsplit(req["notify_url"]).scheme in ("http", "https"), "notify_url 无效")
        with p.lock:
            if no_r in p.wechat_refunds:
                r = p.wechat_refunds[no_r]
                if r["request"] != req:
                    raise Answer(400, "INVALID_REQUEST", "退款单号重复,请求参数与首次不一致")
                return 200, wechat_refund_answer(p, r)
            t = None
            if req.get("out_trade_no"):
                t = p.wechat_trades.get(req["out_trade_no"])
            elif req.get("transaction_id"):
                t = next((x for x in p.wechat_trades.values() if x["transaction_id"] == req["transaction_id"]), None)
            else:
                raise Answer(400, "PARAM_ERROR", "out_trade_no 与 transaction_id 须填其一")
            if t is None:
                raise Answer(404, "RESOURCE_NOT_EXISTS", "订单不存在")
            if t["state"] not in ("SUCCESS", "REFUND"):
                raise Answer(403, "TRADE_ERROR", "订单未支付")
            if amount["total"] != t["total"]:
                raise Answer(400, "INVALID_REQUEST", "订单金额或退款金额与之前请求不一致")
            if amount["refund"] > t["total"] - t["refunded"]:
                raise Answer(403, "NOT_ENOUGH", "申请退款金额超过订单可退金额")
            t["refunded"] += amount["refund"]
            t["state"] = "REFUND"
            r = {"request": req, "refund_id": p.next_id("50"), "out_refund_no": no_r,
                 "transaction_id": t["transaction_id"], "out_trade_no": t["out_trade_no"],
                 "create_time": rfc3339_now(), "status": "PROCESSING", "total": t["total"],
                 "refund": amount["refund"], "success_time": None}
            p.wechat_refunds[no_r] = r
            return 200, wechat_refund_answer(p, r)
    m = re.fullmatch(r"/v3/refund/domestic/refunds/([^/]+)", path)
    if m and method == "GET":
        with p.lock:
            r = p.wechat_refunds.get(urllib.parse.unquote(m.group(1)))
            if r is None:
                raise Answer(404, "RESOURCE_NOT_EXISTS", "退款单不存在")
            # A refund settles by the time it is first queried, unless held [W-REFUND].
            if r["status"] == "PROCESSING" and not p.money["wechat_refund_hold"]:
                r["status"], r["success_time"] = "SUCCESS", rfc3339_now()
            return 200, wechat_refund_answer(p, r)
    if path == "/v3/bill/tradebill" and method == "GET":
        bill_date = query.get("bill_date", [""])[0]
        require(re.fullmatch(r"\d{4}-\d{2}-\d{2}", bill_date), "bill_date 格式为 yyyy-MM-DD")
        with p.lock:
            if p.modes["bill_not_ready"]:
                raise Answer(400, "STATEMENT_CREATING", "账单生成中，请稍后再试")
            bill = wechat_bill(p, bill_date)
            if bill.count(b"\r\n") <= 3:
                raise Answer(400, "NO_STATEMENT_EXIST", "请求的账单日期不存在账单")
            data = gzip.compress(bill) if query.get("tar_type", [""])[0] == "GZIP" else bill
            token = bill_token(p, "wechat", data)
        return 200, {"hash_type": "SHA1", "hash_value": hashlib.sha1(bill).hexdigest(),
                     "download_url": f"http://127.0.0.1:{p.port}/v3/billdownload/file?token={token}"}
    if path == "/v3/certificates" and method == "GET":
        data = []
        for pl in p.platform:
            if pl["cert"] is None:
                continue
            data.append({
                "serial_no": pl["serial"],
                "effective_time": pl["cert"].not_valid_before_utc.astimezone(CST).replace(microsecond=0).isoformat(),
                "expire_time": pl["cert"].not_valid_after_utc.astimezone(CST).replace(microsecond=0).isoformat(),
                "encrypt_certificate": aead_encrypt(p.apiv3_key, cert_pem(pl["cert"]).decode(), "certificate"),
            })
        return 200, {"data": data}
    raise Answer(404, "NOT_FOUND", "接口不存在")


# ---------------------------------------------------------------- Alipay

def alipay_content(params: dict, drop=("sign",)) -> str:
    """[A-SIGN]: every non-empty parameter but those dropped, sorted by key, raw `k=v` joined by `&`."""
    return "&".join(f"{k}={params[k]}" for k in sorted(params) if k not in drop and params[k] != "")


class AlipayError(Exception):
    def __init__(self, code, msg, sub_code, sub_msg):
        super().__init__(sub_msg)
        self.fields = {"code": code, "msg": msg, "sub_code": sub_code, "sub_msg": sub_msg}


def biz_fail(sub_code, sub_msg):
    return AlipayError("40004", "Business Failed", sub_code, sub_msg)


def alipay_verify_request(p: Provider, params: dict):
    """[A-SIGN], [A-ERR]: what the gateway checks before it looks at the business."""
    for f in ("app_id", "method", "sign_type", "sign", "timestamp", "charset", "version"):
        if not params.get(f):
            raise AlipayError("40001", "Missing Required Arguments", f"isv.missing-{f.replace('_', '-')}",
                              f"缺少{f}参数")
    if params["app_id"] != p.alipay_app_id:
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-app-id", "无效的AppID参数")
    if params["sign_type"] != "RSA2":
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-signature-type", "无效的签名类型")
    if params["charset"].lower() != "utf-8":
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-charset", "字符集错误")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", params["timestamp"]):
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-timestamp", "非法的时间戳参数")
    if p.cert_mode:
        if params.get("app_cert_sn") != p.app_cert_sn:
            raise AlipayError("40002", "Invalid Arguments", "isv.app-cert-not-exist", "应用公钥证书不存在")
        if params.get("alipay_root_cert_sn") != p.alipay_root_cert_sn:
            raise AlipayError("40002", "Invalid Arguments", "isv.invalid-alipay-root-cert-sn", "无效支付宝根证书序列号")
    content = alipay_content(params)
    if not rsa_verify(p.app_public, content.encode(), params["sign"]):
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-signature",
                          "验签出错，建议检查签名字符串或签名私钥与应用公钥是否匹配，网关生成的验签字符串为：" + content)


def alipay_trade_view(p, t):
    o = {"trade_no": t["trade_no"], "out_trade_no": t["out_trade_no"], "buyer_logon_id": "159****5620",
         "trade_status": t["state"], "total_amount": yuan(t["total"])}
    if t["state"] in ("TRADE_SUCCESS", "TRADE_FINISHED") or t["refunded"]:
        o.update(buyer_pay_amount=yuan(t["total"]), receipt_amount=yuan(t["total"]),
                 send_pay_date=t["paid_at"], buyer_user_id="2088102177846880")
    return o


def alipay_method(p: Provider, method, params):
    try:
        biz = json.loads(params.get("biz_content") or "{}")
    except ValueError:
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-biz-content", "biz_content 不是合法的JSON")
    if not isinstance(biz, dict):
        raise AlipayError("40002", "Invalid Arguments", "isv.invalid-biz-content", "biz_content 不是JSON对象")
    ok = {"code": "10000", "msg": "Success"}
    with p.lock:
        def find():
            t = None
            if biz.get("out_trade_no"):
                t = p.alipay_trades.get(biz["out_trade_no"])
            elif biz.get("trade_no"):
                t = next((x for x in p.alipay_trades.values() if x["trade_no"] == biz["trade_no"]), None)
            else:
                raise biz_fail("ACQ.INVALID_PARAMETER", "out_trade_no 与 trade_no 不能同时为空")
            # A precreated trade exists at Alipay only once the buyer has scanned it [A-TRADE].
            if t is None or t["state"] is None:
                raise biz_fail("ACQ.TRADE_NOT_EXIST", "交易不存在")
            return t

        if method == "alipay.trade.precreate":
            no, subject = biz.get("out_trade_no"), biz.get("subject")
            total = fen(biz.get("total_amount"))
            if not (isinstance(no, str) and 0 < len(no) <= 64) or not subject or total is None or total <= 0:
                raise biz_fail("ACQ.INVALID_PARAMETER", "参数无效: out_trade_no, total_amount(元, 两位小数), subject 必填")
            t = p.alipay_trades.get(no)
            if t is not None:
                if t["state"] in ("TRADE_SUCCESS", "TRADE_FINISHED"):
                    raise biz_fail("ACQ.TRADE_HAS_SUCCESS", "交易已被支付")
                if t["state"] == "TRADE_CLOSED":
                    raise biz_fail("ACQ.TRADE_HAS_CLOSE", "交易已经关闭")
                if t["biz"] != biz:
                    raise biz_fail("ACQ.CONTEXT_INCONSISTENT", "交易信息被篡改")
                return dict(ok, out_trade_no=no, qr_code=t["qr_code"])
            t = {"out_trade_no": no, "biz": biz, "total": total, "state": None, "refunded": 0, "refunds": {},
                 "trade_no": p.next_id(), "qr_code": "https://qr.alipay.com/" + secrets.token_urlsafe(12),
                 "notify_url": params.get("notify_url"), "paid_at": None, "subject": subject,
                 "created_at": alipay_now()}
            p.alipay_trades[no] = t
            return dict(ok, out_trade_no=no, qr_code=t["qr_code"])
        if method == "alipay.trade.query":
            return dict(ok, **alipay_trade_view(p, find()))
        if method == "alipay.trade.close":
            t = find()
            paid_meanwhile(p, "alipay", t)
            if t["state"] in ("TRADE_SUCCESS", "TRADE_FINISHED"):
                raise biz_fail("ACQ.TRADE_HAS_SUCCESS", "交易已被支付")  # [A-REFUND]
            if t["state"] != "WAIT_BUYER_PAY":
                raise biz_fail("ACQ.TRADE_STATUS_ERROR", "交易状态不合法")
            t["state"] = "TRADE_CLOSED"
            return dict(ok, trade_no=t["trade_no"], out_trade_no=t["out_trade_no"])
        if method == "alipay.trade.refund":
            t = find()
            amount = fen(biz.get("refund_amount"))
            if amount is None or amount <= 0:
                raise biz_fail("ACQ.INVALID_PARAMETER", "refund_amount 无效")
            req_no = biz.get("out_request_no") or t["trade_no"]
            if req_no in t["refunds"]:
                if t["refunds"][req_no] != amount:
                    raise biz_fail("ACQ.DISCORDANT_REPEAT_REQUEST", "请求信息不一致")
                return dict(ok, trade_no=t["trade_no"], out_trade_no=t["out_trade_no"], buyer_logon_id="159****5620",
                            fund_change="N", refund_fee=yuan(t["refunded"]))
            if t["state"] != "TRADE_SUCCESS":
                raise biz_fail("ACQ.TRADE_STATUS_ERROR", "交易状态不合法")
            if amount > t["total"] - t["refunded"]:
                raise biz_fail("ACQ.REFUND_AMT_NOT_EQUAL_TOTAL", "退款金额超限")
            t["refunds"][req_no] = amount
            t["refunded"] += amount
            t["gmt_refund"] = alipay_now()
            t["last_refund_no"] = req_no
            if p.money["alipay_refund_pending"]:
                # Accepted, the money not moved yet: N, and the query finds no finished refund
                # until settled [A-REFUND].
                t.setdefault("pending_refunds", set()).add(req_no)
                return dict(ok, trade_no=t["trade_no"], out_trade_no=t["out_trade_no"],
                            buyer_logon_id="159****5620", fund_change="N", refund_fee=yuan(t["refunded"]))
            if t["refunded"] == t["total"]:
                t["state"] = "TRADE_CLOSED"
            return dict(ok, trade_no=t["trade_no"], out_trade_no=t["out_trade_no"], buyer_logon_id="159****5620",
                        fund_change="Y", refund_fee=yuan(t["refunded"]), gmt_refund_pay=t["gmt_refund"])
        if method == "alipay.trade.fastpay.refund.query":
            t = find()
            req_no = biz.get("out_request_no")
            if not req_no:
                raise biz_fail("ACQ.INVALID_PARAMETER", "out_request_no 必填")
            o = dict(ok, trade_no=t["trade_no"], out_trade_no=t["out_trade_no"])
            if req_no in t["refunds"] and req_no not in t.get("pending_refunds", ()):
                # no (finished) refund found: success without refund fields [A-TRADE] [A-REFUND]
                o.update(out_request_no=req_no, total_amount=yuan(t["total"]),
                         refund_amount=yuan(t["refunds"][req_no]), refund_status="REFUND_SUCCESS")
            return o
        if method == "alipay.open.app.alipaycert.download":
            if not p.cert_mode:
                raise AlipayError("40002", "Invalid Arguments", "isv.invalid-method", "不存在的方法名")
            cert = p.alipay_certs.get(biz.get("alipay_cert_sn") or "")
            if cert is None:
                raise biz_fail("ALIPAY_CERT_NOT_EXIST", "支付宝公钥证书不存在")
            return dict(ok, alipay_cert_content=base64.b64encode(cert_pem(cert)).decode())
        if method == "alipay.data.dataservice.bill.downloadurl.query":
            bill_date = biz.get("bill_date") or ""
            if biz.get("bill_type") != "trade" or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", bill_date):
                raise AlipayError("40002", "Invalid Arguments", "isv.invalid-parameter", "bill_type/bill_date 无效")
            made = None if p.modes["bill_not_ready"] else alipay_bill(p, bill_date)
            if made is None:
                raise biz_fail("isp.bill_not_exist", "账单不存在")
            token = bill_token(p, "alipay", alipay_zip(bill_date, *made))
            return dict(ok, bill_download_url=f"http://127.0.0.1:{p.port}/downloadBillFile.resource?fileId={token}")
    raise AlipayError("40002", "Invalid Arguments", "isv.invalid-method", "不存在的方法名")


def alipay_answer(p: Provider, method, fields) -> bytes:
    """[A-RESP]: the `<method>_response` text is written once and signed as written. Like the
    gateway, '/' is escaped as '\\/', so a client that re-serializes the object cannot verify."""
    key_name = method.replace(".", "_") + "_response" if method else "error_response"
    text = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).replace("/", "\\/")
    key, sn = p.alipay_signer()
    sign = rsa_sign(key, text.encode())
    out = '{"%s":%s' % (key_name, text)
    if sn is not None:
        out += ',"alipay_cert_sn":"%s"' % sn
    out += ',"sign":"%s"}' % sign
    return out.encode()


# ---------------------------------------------------------------- bills [W-BILL] [A-BILL]

WECHAT_BILL_HEADER = ("交易时间,公众账号ID,商户号,特约商户号,设备号,微信订单号,商户订单号,用户标识,交易类型,交易状态,"
                      "付款银行,货币种类,应结订单金额,代金券金额,微信退款单号,商户退款单号,退款金额,充值券退款金额,"
                      "退款类型,退款状态,商品名称,商户数据包,手续费,费率,订单金额,申请退款金额,费率备注")


def wechat_bill(p: Provider, bill_date: str) -> bytes:
    """The trade bill of `bill_date` (ALL): one SUCCESS row per trade paid that day."""
    rows, total = [], 0
    for t in p.wechat_trades.values():
        if t["state"] not in ("SUCCESS", "REFUND") or not t.get("success_time"):
            continue
        if t["success_time"][:10] != bill_date:
            continue
        when = t["success_time"][:19].replace("T", " ")
        fee = "%d.%05d" % divmod(t["total"] * 6, 100000)
        cells = [when, t["appid"], p.mchid, "0", "", t["transaction_id"], t["out_trade_no"], t.get("openid") or "",
                 (t.get("kind") or "native").upper(), "SUCCESS", "OTHERS", "CNY", yuan(t["total"]), "0.00", "0", "0",
                 "0.00", "0.00", "", "", "standin", "", fee, "0.60%", yuan(t["total"]), "0.00", ""]
        rows.append(",".join("`" + c for c in cells))
        total += t["total"]
    fees = sum(t["total"] * 6 for t in p.wechat_trades.values()
               if t["state"] in ("SUCCESS", "REFUND") and (t.get("success_time") or "")[:10] == bill_date)
    lines = [WECHAT_BILL_HEADER] + rows + [
        "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额",
        ",".join("`" + c for c in [str(len(rows)), yuan(total), "0.00", "0.00", "%d.%05d" % divmod(fees, 100000),
                                      yuan(total), "0.00"]),
    ]
    return ("\r\n".join(lines) + "\r\n").encode("utf-8")


def alipay_bill(p: Provider, bill_date: str):
    """(detail, summary) of `bill_date`, GBK, CRLF; None when nothing was paid that day."""
    rows, total = [], 0
    for t in p.alipay_trades.values():
        if not t.get("paid_at") or t["paid_at"][:10] != bill_date:
            continue
        a = yuan(t["total"])
        rows.append(f"{t['trade_no']}\t,{t['out_trade_no']}\t,交易,{t.get('subject') or 'standin'},{t['created_at']},"
                    f"{t['paid_at']},,,,,159****5620\t,{a},{a},0.00,0.00,0.00,0.00,0.00,,0.00,0.00,,0.00,0.00,")
        total += t["total"]
    if not rows:
        return None
    d = datetime.date.fromisoformat(bill_date)
    zh = lambda x: x.strftime("%Y年%m月%d日")
    head = ["#支付宝业务明细查询", "#账号：[2088101106499364]",
            f"#起始日期：[{zh(d)} 00:00:00]   终止日期：[{zh(d + datetime.timedelta(days=1))} 00:00:00]",
            "#-----------------------------------------业务明细列表----------------------------------------",
            "支付宝交易号,商户订单号,业务类型,商品名称,创建时间,完成时间,门店编号,门店名称,操作员,终端号,对方账户,"
            "订单金额（元）,商家实收（元）,支付宝红包（元）,集分宝（元）,支付宝优惠（元）,商家优惠（元）,券核销金额（元）,"
            "券名称,商家红包消费金额（元）,卡消费金额（元）,退款批次号/请求号,服务费（元）,分润（元）,备注"]
    tail = ["#-----------------------------------------业务明细列表结束------------------------------------",
            f"#交易合计：{len(rows)}笔，商家实收共{yuan(total)}元，商家优惠共0.00元",
            "#退款合计：0笔，商家实收退款共0.00元，商家优惠退款共0.00元",
            "#导出时间：[" + datetime.datetime.now(CST).strftime("%Y年%m月%d日 %H:%M:%S") + "]"]
    detail = ("\r\n".join(head + rows + tail) + "\r\n").encode("gbk")
    summary = ("#支付宝业务汇总查询\r\n门店编号,门店名称,交易订单总笔数,退款订单总笔数,订单金额（元）\r\n"
               f"合计,,{len(rows)},0,{yuan(total)}\r\n").encode("gbk")
    return detail, summary


class GbkName(zipfile.ZipInfo):
    """A zip entry named in GBK with the UTF-8 flag unset, as Alipay's are."""
    def _encodeFilenameFlags(self):
        return self.filename.encode("gbk"), self.flag_bits & ~0x800


def alipay_zip(bill_date: str, detail: bytes, summary: bytes) -> bytes:
    stem = "2088101106499364_" + bill_date.replace("-", "")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in ((stem + "_业务明细(汇总).csv", summary), (stem + "_业务明细.csv", detail)):
            info = GbkName(name, date_time=time.localtime()[:6])
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return out.getvalue()


def bill_token(p: Provider, provider: str, data: bytes) -> str:
    token = secrets.token_urlsafe(18)
    p.bill_files[token] = (provider, data)
    return token


# ---------------------------------------------------------------- notifications

def send(url, body: bytes, headers: dict):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return 0, f"unreachable: {e}"


def notify_wechat(p: Provider, t):
    """[W-NOTIFY]: TRANSACTION.SUCCESS with the transaction encrypted with the APIv3 key."""
    with p.lock:
        resource = wechat_transaction(p, t)
        body = json.dumps({
            "id": "EV-" + secrets.token_hex(10), "create_time": rfc3339_now(), "resource_type": "encrypt-resource",
            "event_type": "TRANSACTION.SUCCESS" if t["state"] in ("SUCCESS", "REFUND") else "TRANSACTION." + t["state"],
            "summary": "支付成功",
            "resource": dict(aead_encrypt(p.apiv3_key, json.dumps(resource, ensure_ascii=False), "transaction"),
                             original_type="transaction"),
        }, ensure_ascii=False).encode()
        headers = p.wechat_sign_headers(body)
    headers["Content-Type"] = "application/json"
    return send(t["notify_url"], body, headers)


def notify_alipay(p: Provider, t):
    """[A-NOTIFY]: a form, RSA2 over every non-empty field but sign and sign_type."""
    with p.lock:
        f = {"notify_time": alipay_now(), "notify_type": "trade_status_sync", "notify_id": secrets.token_hex(16),
             "app_id": p.alipay_app_id, "charset": "utf-8", "version": "1.0", "sign_type": "RSA2",
             "auth_app_id": p.alipay_app_id, "trade_no": t["trade_no"], "out_trade_no": t["out_trade_no"],
             "trade_status": t["state"] or "WAIT_BUYER_PAY", "total_amount": yuan(t["total"]),
             "subject": t.get("subject") or "", "gmt_create": t["created_at"], "seller_id": "2088101117955611",
             "buyer_id": "2088102177846880", "buyer_logon_id": "159****5620"}
        if t["paid_at"]:
            f.update(gmt_payment=t["paid_at"], receipt_amount=yuan(t["total"]), buyer_pay_amount=yuan(t["total"]),
                     invoice_amount=yuan(t["total"]), point_amount="0.00")
        if t["refunded"]:
            f.update(refund_fee=yuan(t["refunded"]), gmt_refund=t.get("gmt_refund") or alipay_now(),
                     out_biz_no=t.get("last_refund_no") or t["trade_no"])
        if t["state"] == "TRADE_CLOSED":
            f["gmt_close"] = t.get("gmt_close") or alipay_now()
        key, _ = p.alipay_signer()
        f["sign"] = rsa_sign(key, alipay_content(f, drop=("sign", "sign_type")).encode())
    body = urllib.parse.urlencode(f).encode()
    return send(t["notify_url"], body, {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})


# ---------------------------------------------------------------- HTTP

WECHAT_STATES = {"SUCCESS", "USERPAYING", "NOTPAY", "CLOSED", "REFUND", "PAYERROR", "REVOKED"}
ALIPAY_STATES = {"WAIT_BUYER_PAY", "TRADE_SUCCESS", "TRADE_CLOSED", "TRADE_FINISHED"}


def control(p: Provider, method, path, query, body: bytes):
    """The /_standin/ control API (JSON in, JSON out)."""
    try:
        req = json.loads(body or b"{}")
    except ValueError:
        return 400, {"error": "body is not JSON"}
    if path == "/_standin/requests" and method == "GET":
        with p.lock:
            return 200, list(p.requests)
    if path == "/_standin/requests" and method == "DELETE":
        with p.lock:
            p.requests.clear()
        return 200, {}
    if path == "/_standin/config" and method == "GET":
        return 200, p.config
    if path == "/_standin/mode" and method == "POST":
        with p.lock:
            for k in ("wrong_key", "unknown_serial", "bill_not_ready"):
                if k in req:
                    p.modes[k] = bool(req[k])
            if "latency_ms" in req:
                p.modes["latency_ms"] = int(req["latency_ms"])
            return 200, dict(p.modes)
    if path == "/_standin/money" and method == "POST":
        with p.lock:
            for k in ("alipay_refund_pending", "wechat_refund_hold"):
                if k in req:
                    p.money[k] = bool(req[k])
            if "pay_on_close" in req:
                p.money["pay_on_close"] = list(req["pay_on_close"])
            return 200, dict(p.money)
    if path == "/_standin/refund" and method == "POST":
        # Ends a refund: WeChat `status` SUCCESS/ABNORMAL/CLOSED; Alipay the money moved.
        with p.lock:
            if req.get("provider") == "alipay":
                t = next((x for x in p.alipay_trades.values() if req.get("out_request_no") in x.get("pending_refunds", ())), None)
                if t is None:
                    return 404, {"error": "no pending Alipay refund"}
                t["pending_refunds"].discard(req["out_request_no"])
                if not t["pending_refunds"] and t["refunded"] == t["total"]:
                    t["state"] = "TRADE_CLOSED"
                return 200, {"out_request_no": req["out_request_no"], "refund_status": "REFUND_SUCCESS"}
            r = p.wechat_refunds.get(req.get("out_refund_no"))
            if r is None:
                return 404, {"error": "no WeChat refund"}
            r["status"] = req.get("status", "SUCCESS")
            if r["status"] == "SUCCESS":
                r["success_time"] = rfc3339_now()
            return 200, wechat_refund_answer(p, r)
    if path == "/_standin/rotate" and method == "POST":
        with p.lock:
            old = p.platform[-1]["serial"]
            p.new_platform_key()
            if req.get("drop_old"):
                p.platform = p.platform[-1:]
            p.write_material()
            return 200, {"old_serial": old, "new_serial": p.platform[-1]["serial"],
                         "serials": [x["serial"] for x in p.platform]}
    if path == "/_standin/renew_alipay_cert" and method == "POST":
        # [A-CERTDL]: Alipay renews its certificate; answers are signed by the new key under the
        # new SN from now on. `trusted: false` issues it from a CA of the same name that is not
        # the root of the root file (what a forged renewal would look like).
        if not p.cert_mode:
            return 400, {"error": "certificate mode only"}
        with p.lock:
            key = new_rsa_key()
            if req.get("trusted", True):
                issuer_name, issuer_key = p.alipay_root_name, p.alipay_root_key
            else:
                issuer_name, issuer_key = p.alipay_root_name, new_rsa_key()
            cert = issue(name("支付宝(中国)网络技术有限公司-" + p.alipay_app_id, "Alipay", "Alipay"),
                         key.public_key(), issuer_name, issuer_key)
            old = p.alipay_cert_sn
            p.alipay_key, p.alipay_cert = key, cert
            p.alipay_cert_sn = alipay_cert_sn(cert)
            p.alipay_certs[p.alipay_cert_sn] = cert
            return 200, {"old_sn": old, "new_sn": p.alipay_cert_sn}
    if path == "/_standin/trade" and method in ("POST", "GET"):
        provider = req.get("provider") or query.get("provider", [None])[0]
        no = req.get("out_trade_no") or query.get("out_trade_no", [None])[0]
        if provider not in ("wechat", "alipay") or not no:
            return 400, {"error": "provider (wechat|alipay) and out_trade_no are required"}
        with p.lock:
            trades = p.wechat_trades if provider == "wechat" else p.alipay_trades
            if method == "GET":
                t = trades.get(no)
                return (200, {k: v for k, v in t.items() if k not in ("request", "biz")}) if t else (404, {})
            state = req.get("state")
            if state not in (WECHAT_STATES if provider == "wechat" else ALIPAY_STATES):
                return 400, {"error": f"unknown state {state!r} for {provider}"}
            t = trades.get(no)
            if t is None:
                if "amount" not in req:
                    return 400, {"error": "a trade the stand-in has not seen needs amount (fen)"}
                if provider == "wechat":
                    t = {"kind": req.get("trade_type", "native"), "request": None, "answer": None, "out_trade_no": no,
                         "appid": p.wechat_appid, "total": int(req["amount"]), "notify_url": req.get("notify_url"),
                         "transaction_id": None, "openid": req.get("openid"), "success_time": None, "refunded": 0}
                else:
                    t = {"out_trade_no": no, "biz": None, "total": int(req["amount"]), "refunded": 0, "refunds": {},
                         "trade_no": p.next_id(), "qr_code": None, "notify_url": req.get("notify_url"),
                         "paid_at": None, "subject": req.get("subject", ""), "created_at": alipay_now()}
                trades[no] = t
            if "amount" in req:
                t["total"] = int(req["amount"])
            if req.get("notify_url"):
                t["notify_url"] = req["notify_url"]
            t["state"] = state
            if provider == "wechat":
                if req.get("transaction_id"):
                    t["transaction_id"] = req["transaction_id"]
                if state in ("SUCCESS", "REFUND"):
                    t["transaction_id"] = t["transaction_id"] or p.next_id("42")
                    t["success_time"] = t["success_time"] or rfc3339_now()
                if req.get("openid"):
                    t["openid"] = req["openid"]
            else:
                if req.get("transaction_id"):
                    t["trade_no"] = req["transaction_id"]
                if state in ("TRADE_SUCCESS", "TRADE_FINISHED") or (state == "TRADE_CLOSED" and req.get("refund_fee")):
                    t["paid_at"] = t["paid_at"] or alipay_now()
                if "refund_fee" in req:
                    t["refunded"] = int(req["refund_fee"] or 0)
                    if t["refunded"]:
                        t["gmt_refund"] = alipay_now()
                if state == "TRADE_CLOSED":
                    t["gmt_close"] = alipay_now()
            return 200, {k: v for k, v in t.items() if k not in ("request", "biz")}
    if path == "/_standin/notify" and method == "POST":
        no = req.get("out_trade_no")
        provider = req.get("provider")
        with p.lock:
            if provider is None:
                provider = "wechat" if no in p.wechat_trades else "alipay" if no in p.alipay_trades else None
            t = (p.wechat_trades if provider == "wechat" else p.alipay_trades).get(no) if provider else None
        if t is None:
            return 404, {"error": f"no trade {no!r}"}
        if not t.get("notify_url"):
            return 400, {"error": "the trade has no notify_url"}
        status, text = notify_wechat(p, t) if provider == "wechat" else notify_alipay(p, t)
        return 200, {"provider": provider, "status": status, "body": text}
    return 404, {"error": "no such control endpoint"}


def make_handler(p: Provider):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "standin"

        def log_message(self, *args):
            pass

        def read_body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def reply(self, status, body: bytes, headers=None, content_type="application/json; charset=utf-8"):
            self.send_response(status)
            if body or status != 204:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Request-ID", secrets.token_hex(16))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if body:
                self.wfile.write(body)

        def handle_any(self, method):
            body = self.read_body()
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            if url.path.startswith("/_standin/"):
                status, obj = control(p, method, url.path, query, body)
                return self.reply(status, json.dumps(obj, ensure_ascii=False).encode())
            if p.modes["latency_ms"]:
                time.sleep(p.modes["latency_ms"] / 1000)
            record = {"method": method, "path": self.path, "headers": dict(self.headers.items()),
                      "body": body.decode("utf-8", "replace"), "verified": False, "error": None}
            if url.path == "/v3/billdownload/file":
                record["provider"] = "wechat"
                status, out, headers = self.wechat_download(method, query, body, record)
            elif url.path == "/downloadBillFile.resource":
                record["provider"] = "alipay"
                with p.lock:
                    f = p.bill_files.get(query.get("fileId", [""])[0])
                if f and f[0] == "alipay":
                    status, out, headers = 200, f[1], {"Content-Type": "application/oct-stream"}
                else:
                    status, out, headers = 404, "<html>链接已失效</html>".encode(), {"Content-Type": "text/html"}
            elif url.path.startswith("/v3/"):
                record["provider"] = "wechat"
                status, out, headers = self.wechat(method, url, query, body, record)
            elif url.path == "/gateway.do":
                record["provider"] = "alipay"
                status, out, headers = self.alipay(method, query, body, record)
            else:
                record["provider"] = None
                status, out, headers = 404, b'{"error":"unknown path"}', {}
            record["status"] = status
            record["answer"] = out.decode("utf-8", "replace") if status != 200 or not out[:2] in (b"PK", b"\x1f\x8b") else "<binary>"
            ctype = headers.pop("Content-Type", None) if headers else None
            with p.lock:
                record["id"] = len(p.requests) + 1
                p.requests.append(record)
            if ctype:
                return self.reply(status, out, headers, content_type=ctype)
            self.reply(status, out, headers)

        def wechat_download(self, method, query, body, record):
            """[W-BILL]: a signed GET of the download_url; the file is not signed."""
            try:
                wechat_verify_request(p, method, self.path, self.headers, body)
                record["verified"] = True
            except Answer as a:
                record["error"] = a.code + ": " + a.message
                return a.status, json.dumps({"code": a.code, "message": a.message}, ensure_ascii=False).encode(), {}
            with p.lock:
                f = p.bill_files.get(query.get("token", [""])[0])
            if not f or f[0] != "wechat":
                return 400, json.dumps({"code": "PARAM_ERROR", "message": "token 无效或已过期"}).encode(), {}
            return 200, f[1], {"Content-Type": "application/octet-stream"}

        def wechat(self, method, url, query, body, record):
            try:
                wechat_verify_request(p, method, self.path, self.headers, body)
                record["verified"] = True
            except Answer as a:  # a refused signature gets an unsigned 401 [W-SIGN]
                record["error"] = a.code + ": " + a.message
                obj = {"code": a.code, "message": a.message}
                if a.detail:
                    obj["detail"] = a.detail
                return a.status, json.dumps(obj, ensure_ascii=False).encode(), {}
            try:
                status, obj = wechat_route(p, method, url.path, query, body)
                out = b"" if obj is None else json.dumps(obj, ensure_ascii=False).encode()
            except Answer as a:
                record["error"] = a.code + ": " + a.message
                status, out = a.status, json.dumps({"code": a.code, "message": a.message}, ensure_ascii=False).encode()
            with p.lock:
                headers = p.wechat_sign_headers(out)
            return status, out, headers

        def alipay(self, method, query, body, record):
            params = {k: v[-1] for k, v in query.items()}
            ctype = self.headers.get("Content-Type", "")
            if body and "application/x-www-form-urlencoded" in ctype:
                for k, v in urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
                    params[k] = v
            api = params.get("method")
            record["params"] = params
            try:
                if method != "POST" and method != "GET":
                    raise AlipayError("40002", "Invalid Arguments", "isv.invalid-http-method", "不支持的请求方法")
                alipay_verify_request(p, params)
                record["verified"] = True
                fields = alipay_method(p, api, params)
            except AlipayError as e:
                record["error"] = e.fields["sub_code"] + ": " + e.fields["sub_msg"]
                fields = e.fields
                if fields["sub_code"] == "isv.invalid-method":
                    api = None
            return 200, alipay_answer(p, api, fields), {}

        def do_GET(self):
            self.handle_any("GET")

        def do_POST(self):
            self.handle_any("POST")

        def do_DELETE(self):
            self.handle_any("DELETE")

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--mode", choices=["public-key", "certificate"], default="public-key")
    ap.add_argument("--merchant-public-key", required=True)
    ap.add_argument("--app-public-key", required=True)
    ap.add_argument("--mchid", default="1900000109")
    ap.add_argument("--wechat-appid", default="wxd678efh567hg6787")
    ap.add_argument("--alipay-app-id", default="2021000000000001")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    provider = Provider(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(provider))
    provider.port = server.server_address[1]
    server.daemon_threads = True
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
