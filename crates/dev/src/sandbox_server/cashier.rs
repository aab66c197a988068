//! The cashier page: `GET {base}/cashier/{wechat|alipay}/{out_trade_no}` shows the merchant,
//! the amount and the deadline, and a Pay button (`#pay`) that POSTs to `…/pay`; the page then
//! shows `#paid` once fitorder acknowledged the notification, or `#error`. Plain HTML, no
//! external assets, a strict CSP (the one inline script and style carry a per-page nonce).
//!
//! The Pay POST is the page's own: it carries the page's token (`X-Cashier-Token`, from the
//! button's `data-token`, which another site cannot read) and, when the browser names one, an
//! `Origin` of this sandbox. A cross-site form or fetch (`Origin: http://evil.example`) is
//! refused with 403 and pays nothing.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::Utc;
use serde_json::json;

use super::{alnum, html_escape, pay_trade, provider_name, shanghai, yuan, Inner, PayError, SandboxTrade, ALIPAY};

pub(super) fn router() -> Router<Arc<Inner>> {
    Router::new()
        .route("/{provider}/{no}", get(show))
        .route("/{provider}/{no}/pay", post(pay))
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:28rem;margin:2rem auto;padding:0 1rem;color:#222}\
h1{font-size:1.2rem}dl{display:grid;grid-template-columns:auto 1fr;gap:.3rem 1rem}dt{color:#666}dd{margin:0}\
button{font-size:1.1rem;padding:.6rem 2rem;border:0;border-radius:.4rem;color:#fff;cursor:pointer}\
button[disabled]{opacity:.5;cursor:default}.wechat button{background:#07c160}.alipay button{background:#1677ff}\
#paid{color:#07893f;font-weight:bold}#error{color:#c00}.note{color:#888;font-size:.8rem}";

const SCRIPT: &str = "const b=document.getElementById('pay');const out=document.getElementById('result');\
function show(id,text){out.replaceChildren();const p=document.createElement('p');p.id=id;p.textContent=text;out.append(p);}\
b&&b.addEventListener('click',async()=>{b.disabled=true;show('paying','Paying…');\
try{const r=await fetch(b.dataset.action,{method:'POST',headers:{'X-Cashier-Token':b.dataset.token}});const v=await r.json();\
if(v.ok){show('paid','Paid');b.textContent='Paid';}else{show('error',v.message);b.disabled=false;}}\
catch(e){show('error',String(e));b.disabled=false;}});";

/// The header the Pay button sends its page's token in.
pub const TOKEN_HEADER: &str = "x-cashier-token";

/// The token of the cashier page of trade `no` at `provider` (`wechat` or `alipay`): a keyed
/// digest under a secret made at start, so only a page this sandbox served has it.
pub fn page_token(provider: &str, no: &str) -> String {
    use sha2::{Digest, Sha256};
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let secret = SECRET.get_or_init(|| alnum(32));
    let mut h = Sha256::new();
    for part in [secret.as_str(), provider, no] {
        h.update(part.len().to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Whether a Pay POST comes from the cashier page itself: the page's token, and an `Origin`
/// (sent by browsers with every POST) naming this host, if there is one.
fn from_the_page(headers: &HeaderMap, provider: &str, no: &str) -> Result<(), &'static str> {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(origin) = text(header::ORIGIN) {
        let host = text(header::HOST).unwrap_or_default();
        let same = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|o| !host.is_empty() && o.eq_ignore_ascii_case(host));
        if !same {
            return Err("a payment is made on the cashier page itself, not from another site");
        }
    }
    let token = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok());
    if token != Some(page_token(provider, no).as_str()) {
        return Err("the cashier page's token is missing or wrong: open the cashier page and press Pay");
    }
    Ok(())
}

fn html(status: StatusCode, title: &str, class: &str, main: &str) -> Response {
    let nonce = alnum(24);
    let csp = format!(
        "default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; \
         img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    );
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{title}</title>\
         <style nonce=\"{nonce}\">{STYLE}</style></head><body class=\"{class}\"><main>{main}</main>\
         <script nonce=\"{nonce}\">{SCRIPT}</script></body></html>",
        title = html_escape(title),
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8".to_string()),
            (header::CONTENT_SECURITY_POLICY, csp),
            (header::CACHE_CONTROL, "no-store".to_string()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_string()),
            (header::REFERRER_POLICY, "no-referrer".to_string()),
        ],
        page,
    )
        .into_response()
}

/// The cashier of `t`.
pub(super) fn page(inner: &Inner, t: &SandboxTrade) -> Response {
    let alipay = t.provider == ALIPAY;
    let (brand, class, merchant) = if alipay {
        ("支付宝 Alipay", "alipay", format!("app {}", inner.keys.alipay_app_id))
    } else {
        (
            "微信支付 WeChat Pay",
            "wechat",
            format!("merchant {}", inner.keys.mch_id),
        )
    };
    let expired = Utc::now() > t.time_expire;
    let paid = matches!(t.state.as_str(), "SUCCESS" | "REFUND" | "TRADE_SUCCESS");
    let payable = matches!(t.state.as_str(), "NOTPAY" | "USERPAYING" | "WAIT_BUYER_PAY") && !expired;
    let amount = format!("¥{}", yuan(t.amount_cents));
    let action = format!("/cashier/{class}/{}/pay", t.out_trade_no);
    let button = if payable || paid {
        // A paid trade's button sends the notification again, as the provider's retry would.
        let label = if paid {
            "Send the notification again".to_string()
        } else {
            format!("Pay {amount}")
        };
        format!(
            "<button id=\"pay\" type=\"button\" data-action=\"{}\" data-token=\"{}\">{}</button>",
            html_escape(&action),
            page_token(class, &t.out_trade_no),
            html_escape(&label)
        )
    } else if expired && !paid {
        "<p id=\"expired\">This payment has expired: the merchant's deadline has passed.</p>".to_string()
    } else {
        format!(
            "<p id=\"closed\">This trade is {}: it cannot be paid.</p>",
            html_escape(&t.state)
        )
    };
    let main = format!(
        "<h1>{brand} — sandbox cashier</h1><dl>\
         <dt>Merchant</dt><dd id=\"merchant\">{merchant}</dd>\
         <dt>Item</dt><dd id=\"description\">{description}</dd>\
         <dt>Order</dt><dd id=\"out-trade-no\">{no}</dd>\
         <dt>Amount</dt><dd id=\"amount\">{amount}</dd>\
         <dt>Pay before</dt><dd id=\"deadline\">{deadline} (Asia/Shanghai)</dd>\
         <dt>State</dt><dd id=\"state\">{state}</dd></dl>\
         {button}<div id=\"result\" role=\"status\"></div>\
         <p class=\"note\">fitorder's development sandbox: no money moves. Pay sends the signed notification to {notify}.</p>",
        merchant = html_escape(&merchant),
        description = html_escape(&t.description),
        no = html_escape(&t.out_trade_no),
        deadline = html_escape(&shanghai(t.time_expire)),
        state = html_escape(&t.state),
        notify = html_escape(&t.notify_url),
    );
    html(StatusCode::OK, &format!("{brand} sandbox cashier"), class, &main)
}

/// A page telling why the cashier cannot open (a bad WAP URL or order string).
pub(super) fn error_page(status: StatusCode, code: &str, message: &str) -> Response {
    let main = format!(
        "<h1>The sandbox cashier cannot open this payment</h1><p id=\"error\">{}: {}</p>",
        html_escape(code),
        html_escape(message)
    );
    html(status, "sandbox cashier: error", "", &main)
}

async fn show(State(inner): State<Arc<Inner>>, Path((provider, no)): Path<(String, String)>) -> Response {
    let Some(p) = provider_name(&provider) else {
        return error_page(StatusCode::NOT_FOUND, "NOT_FOUND", "no such provider");
    };
    let trade = {
        let mut s = inner.lock();
        let t = s.trades.get_mut(&(p, no.clone()));
        // Opening an Alipay precreate's QR code is the scan that makes the trade exist.
        if let Some(t) = t {
            if p == ALIPAY && !t.exists_at_provider {
                t.exists_at_provider = true;
                t.txn_id.get_or_insert_with(super::alipay_trade_no);
            }
            Some(t.clone())
        } else {
            None
        }
    };
    match trade {
        Some(t) => page(&inner, &t),
        None => error_page(
            StatusCode::NOT_FOUND,
            "ORDER_NOT_EXIST",
            "the sandbox has no such trade",
        ),
    }
}

async fn pay(
    State(inner): State<Arc<Inner>>,
    Path((provider, no)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let Some(p) = provider_name(&provider) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"ok": false, "message": "no such provider"})),
        )
            .into_response();
    };
    let class = if p == ALIPAY { "alipay" } else { "wechat" };
    if let Err(why) = from_the_page(&headers, class, &no) {
        return (StatusCode::FORBIDDEN, Json(json!({"ok": false, "message": why}))).into_response();
    }
    match pay_trade(&inner, p, &no).await {
        Ok(sent) if sent.acknowledged => {
            Json(json!({"ok": true, "message": "Paid", "status": sent.status})).into_response()
        }
        Ok(sent) => Json(json!({
            "ok": false,
            "status": sent.status,
            "message": format!(
                "Paid, but {} did not acknowledge the notification ({}: {}). Press again to resend it.",
                sent.url,
                sent.status.map(|s| s.to_string()).unwrap_or_else(|| "no answer".into()),
                sent.reply.chars().take(200).collect::<String>()
            ),
        }))
        .into_response(),
        Err(e) => {
            let status = match e {
                PayError::UnknownTrade => StatusCode::NOT_FOUND,
                _ => StatusCode::CONFLICT,
            };
            (status, Json(json!({"ok": false, "message": e.to_string()}))).into_response()
        }
    }
}
