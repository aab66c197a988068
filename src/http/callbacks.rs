//! `POST /pay/wechat/notify` and `POST /pay/alipay/notify`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::json;

use super::HttpState;
use crate::payments::{self, alipay, wechat, Outcome, Received};
use crate::trace::TraceId;

/// The caller learns only that the notification was refused (or must be retried); what went
/// wrong is in the log under the trace id, and in the recorded evidence.
fn wechat_fail(status: StatusCode) -> Response {
    let message = match status {
        StatusCode::UNAUTHORIZED => "notification refused",
        StatusCode::SERVICE_UNAVAILABLE => "WeChat Pay is not configured",
        _ => "not processed, please retry",
    };
    (status, axum::Json(json!({"code": "FAIL", "message": message}))).into_response()
}

/// Text fit for a PostgreSQL `text` or `jsonb` string: invalid UTF-8 replaced, NUL (which
/// neither type stores) escaped as `\u0000`. With `limit`, cut at a character boundary
/// and marked with the original length.
pub(crate) fn evidence_text(bytes: &[u8], limit: Option<usize>) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = match limit {
        Some(max) if text.len() > max => {
            let mut cut = max;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            format!("{}…[{} bytes received, first {} kept]", &text[..cut], bytes.len(), cut)
        }
        _ => text.into_owned(),
    };
    if out.contains('\0') {
        out = out.replace('\0', "\\u0000");
    }
    out
}

/// An unverified callback's header, as kept: at most 256 bytes.
fn evidence_header(value: Option<&str>) -> Option<String> {
    value.map(|v| evidence_text(v.as_bytes(), Some(256)))
}

/// Refused callbacks are logged at WARN at most this many times a minute (a flood of
/// forgeries must not flood the log); the rest are counted in the metric and the next line.
const WARN_PER_MINUTE: u64 = 20;

fn warn_refused(provider: &str, error: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static MINUTE: AtomicU64 = AtomicU64::new(0);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    metrics::counter!("fitorder_callbacks_unverified_total", "provider" => provider.to_string()).increment(1);
    let minute = (chrono::Utc::now().timestamp() / 60) as u64;
    if MINUTE.swap(minute, Ordering::Relaxed) != minute {
        COUNT.store(0, Ordering::Relaxed);
    }
    if COUNT.fetch_add(1, Ordering::Relaxed) < WARN_PER_MINUTE {
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        tracing::warn!(provider, error = %evidence_text(error.as_bytes(), Some(200)), suppressed, "notification refused");
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

pub async fn wechat_notify(
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(keys) = s.keys.wechat.as_ref() else {
        tracing::error!("WeChat Pay notification refused: WECHATPAY_MCH_ID, WECHATPAY_APIV3_KEY and WECHATPAY_PLATFORM_PUBLIC_KEY are not all set");
        return wechat_fail(StatusCode::SERVICE_UNAVAILABLE);
    };
    let h = wechat::Headers {
        timestamp: header(&headers, "wechatpay-timestamp"),
        nonce: header(&headers, "wechatpay-nonce"),
        signature: header(&headers, "wechatpay-signature"),
        serial: header(&headers, "wechatpay-serial"),
    };
    let evidence = json!({
        "Wechatpay-Timestamp": evidence_header(h.timestamp), "Wechatpay-Nonce": evidence_header(h.nonce),
        "Wechatpay-Serial": evidence_header(h.serial), "Wechatpay-Signature": evidence_header(h.signature),
    });
    // Until the signature is checked the body is anybody's: only its beginning is kept.
    let raw = evidence_text(&body, Some(s.app.config.unverified_callback_bytes));
    let now = chrono::Utc::now().timestamp();
    // A serial we do not know may be a platform certificate WeChat Pay just switched to:
    // fetch the certificates once (rate-limited across the cluster) before judging.
    if let (Some(serial), Some(w)) = (h.serial, s.app.providers.wechat()) {
        if keys.platform.key_for(serial.trim()).is_none() {
            w.unknown_serial(trace.as_str()).await;
        }
    }
    // Authenticate, then decrypt.
    let checked = wechat::verify(keys, &h, &body, now)
        .and_then(|_| wechat::parse_envelope(&body))
        .and_then(|env| {
            let plain = wechat::decrypt(&keys.apiv3_key, &env.resource)?;
            let notice = wechat::notice(&keys.mch_id, &env.event_type, &plain);
            Ok((env, plain, notice))
        });
    let (env, plain, notice) = match checked {
        Ok(v) => v,
        Err(e) => {
            let msg = evidence_text(e.message().as_bytes(), Some(1024));
            warn_refused("WECHAT_PAY", &msg);
            let rec = Received {
                provider: "WECHAT_PAY",
                verified: false,
                event_type: None,
                body: &raw,
                headers: evidence,
                error: Some(&msg),
            };
            if record_only(&s, rec, &trace).await.is_err() {
                return wechat_fail(StatusCode::INTERNAL_SERVER_ERROR);
            }
            return wechat_fail(StatusCode::UNAUTHORIZED);
        }
    };
    // Authentic from here on: kept whole (NULs escaped).
    let plain = evidence_text(plain.as_bytes(), None);
    let mut evidence = evidence;
    evidence["notificationId"] = json!(env.id);
    let notice_error = notice
        .as_ref()
        .err()
        .map(|e| evidence_text(e.message().as_bytes(), Some(1024)));
    let rec = Received {
        provider: "WECHAT_PAY",
        verified: true,
        event_type: Some(&env.event_type),
        body: &plain,
        headers: evidence,
        error: notice_error.as_deref(),
    };
    let notice = match notice {
        Ok(n) => n,
        Err(e) => {
            // Authentic but not ours (another merchant) or not readable: refuse, keep the evidence.
            tracing::warn!(error = %e.message(), "WeChat Pay notification authentic but refused");
            if record_only(&s, rec, &trace).await.is_err() {
                return wechat_fail(StatusCode::INTERNAL_SERVER_ERROR);
            }
            return wechat_fail(StatusCode::UNAUTHORIZED);
        }
    };
    match process(&s, rec, notice, &trace).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(msg) => {
            tracing::error!(error = %msg, "WeChat Pay notification not processed");
            wechat_fail(StatusCode::INTERNAL_SERVER_ERROR)
        }
    }
}

pub async fn alipay_notify(State(s): State<HttpState>, Extension(trace): Extension<TraceId>, body: Bytes) -> Response {
    let failure = |status: StatusCode| (status, "failure").into_response();
    let Some(keys) = s.keys.alipay.as_ref() else {
        tracing::error!("Alipay notification refused: ALIPAY_APP_ID and ALIPAY_PUBLIC_KEY are not both set");
        return (StatusCode::SERVICE_UNAVAILABLE, "failure").into_response();
    };
    let raw = evidence_text(&body, Some(s.app.config.unverified_callback_bytes));
    let fields = match alipay::parse_form(&body) {
        Ok(f) => f,
        Err(e) => {
            let msg = evidence_text(e.message().as_bytes(), Some(1024));
            warn_refused("ALIPAY", &msg);
            let rec = Received {
                provider: "ALIPAY",
                verified: false,
                event_type: None,
                body: &raw,
                headers: json!({}),
                error: Some(&msg),
            };
            let _ = record_only(&s, rec, &trace).await;
            return failure(StatusCode::BAD_REQUEST);
        }
    };
    let evidence = json!({"notify_id": evidence_header(alipay::field(&fields, "notify_id")),
                          "notify_time": evidence_header(alipay::field(&fields, "notify_time")),
                          "app_id": evidence_header(alipay::field(&fields, "app_id"))});
    let event = alipay::field(&fields, "trade_status").map(|e| evidence_text(e.as_bytes(), Some(64)));
    if let Err(e) = alipay::verify(keys, &fields) {
        let msg = evidence_text(e.message().as_bytes(), Some(1024));
        warn_refused("ALIPAY", &msg);
        let rec = Received {
            provider: "ALIPAY",
            verified: false,
            event_type: event.as_deref(),
            body: &raw,
            headers: evidence,
            error: Some(&msg),
        };
        if record_only(&s, rec, &trace).await.is_err() {
            return failure(StatusCode::INTERNAL_SERVER_ERROR);
        }
        return failure(StatusCode::UNAUTHORIZED);
    }
    // Authentic: kept whole.
    let raw = evidence_text(&body, None);
    let rec = Received {
        provider: "ALIPAY",
        verified: true,
        event_type: event.as_deref(),
        body: &raw,
        headers: evidence,
        error: None,
    };
    let notice = match alipay::notice(&fields) {
        Ok(n) => n,
        Err(e) => {
            let msg = evidence_text(e.message().as_bytes(), Some(1024));
            let _ = record_only(
                &s,
                Received {
                    error: Some(&msg),
                    ..rec
                },
                &trace,
            )
            .await;
            return failure(StatusCode::BAD_REQUEST);
        }
    };
    match process(&s, rec, notice, &trace).await {
        Ok(_) => (StatusCode::OK, "success").into_response(),
        Err(msg) => {
            tracing::error!(error = %msg, "Alipay notification not processed");
            failure(StatusCode::INTERNAL_SERVER_ERROR)
        }
    }
}

/// Records a refused callback (its own transaction) as BAD_SIGNATURE evidence.
async fn record_only(s: &HttpState, rec: Received<'_>, trace: &TraceId) -> Result<(), String> {
    let mut conn = s.app.pool.get().await.map_err(|e| {
        tracing::error!(error = %e, "refused callback not recorded: database unavailable");
        format!("database unavailable: {e}")
    })?;
    payments::record(&mut conn, rec, Outcome::BadSignature.as_str(), trace)
        .await
        .map(|_| ())
        .map_err(|e| {
            let msg = e.message();
            tracing::error!(error = %msg, "refused callback not recorded");
            msg
        })
}

/// Records the verified callback, then applies it. An error means the provider must retry.
async fn process(
    s: &HttpState,
    rec: Received<'_>,
    notice: payments::Notice,
    trace: &TraceId,
) -> Result<Outcome, String> {
    let provider = rec.provider;
    let callback_id = {
        let mut conn = s
            .app
            .evidence
            .get()
            .await
            .map_err(|e| format!("database unavailable: {e}"))?;
        let (id, duplicate) = payments::record_checked(&mut conn, rec, &notice, trace)
            .await
            .map_err(|e| e.message())?;
        if duplicate {
            // Already processed: recorded as a DUPLICATE, answered like the first time.
            return Ok(Outcome::Duplicate);
        }
        id
    };
    payments::apply(&s.app, provider, callback_id, notice, trace)
        .await
        .map_err(|e| {
            let msg = e.message();
            tracing::error!(callback_id, error = %msg, "callback recorded but not applied; the provider will retry");
            msg
        })
}
