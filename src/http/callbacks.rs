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

fn wechat_fail(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"code": "FAIL", "message": message}))).into_response()
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
        return wechat_fail(StatusCode::SERVICE_UNAVAILABLE, "WeChat Pay is not configured");
    };
    let h = wechat::Headers {
        timestamp: header(&headers, "wechatpay-timestamp"),
        nonce: header(&headers, "wechatpay-nonce"),
        signature: header(&headers, "wechatpay-signature"),
        serial: header(&headers, "wechatpay-serial"),
    };
    let evidence = json!({
        "Wechatpay-Timestamp": h.timestamp, "Wechatpay-Nonce": h.nonce,
        "Wechatpay-Serial": h.serial, "Wechatpay-Signature": h.signature,
    });
    let raw = String::from_utf8_lossy(&body).to_string();
    let now = chrono::Utc::now().timestamp();
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
            let msg = e.message();
            tracing::warn!(error = %msg, "WeChat Pay notification refused");
            let rec = Received {
                provider: "WECHAT_PAY",
                verified: false,
                event_type: None,
                body: &raw,
                headers: evidence,
                error: Some(&msg),
            };
            if let Err(err) = record_only(&s, rec, &trace).await {
                return wechat_fail(StatusCode::INTERNAL_SERVER_ERROR, &err);
            }
            return wechat_fail(StatusCode::UNAUTHORIZED, &msg);
        }
    };
    let mut evidence = evidence;
    evidence["notificationId"] = json!(env.id);
    let notice_error = notice.as_ref().err().map(|e| e.message());
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
            if let Err(err) = record_only(
                &s,
                Received {
                    error: Some(&e.message()),
                    ..rec
                },
                &trace,
            )
            .await
            {
                return wechat_fail(StatusCode::INTERNAL_SERVER_ERROR, &err);
            }
            return wechat_fail(StatusCode::UNAUTHORIZED, &e.message());
        }
    };
    match process(&s, rec, notice, &trace).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(msg) => wechat_fail(StatusCode::INTERNAL_SERVER_ERROR, &msg),
    }
}

pub async fn alipay_notify(State(s): State<HttpState>, Extension(trace): Extension<TraceId>, body: Bytes) -> Response {
    let failure = |status: StatusCode| (status, "failure").into_response();
    let Some(keys) = s.keys.alipay.as_ref() else {
        tracing::error!("Alipay notification refused: ALIPAY_APP_ID and ALIPAY_PUBLIC_KEY are not both set");
        return (StatusCode::SERVICE_UNAVAILABLE, "failure").into_response();
    };
    let raw = String::from_utf8_lossy(&body).to_string();
    let fields = match alipay::parse_form(&body) {
        Ok(f) => f,
        Err(e) => {
            let msg = e.message();
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
    let evidence = json!({"notify_id": alipay::field(&fields, "notify_id"), "notify_time": alipay::field(&fields, "notify_time"),
                          "app_id": alipay::field(&fields, "app_id")});
    let event = alipay::field(&fields, "trade_status").map(str::to_string);
    if let Err(e) = alipay::verify(keys, &fields) {
        let msg = e.message();
        tracing::warn!(error = %msg, "Alipay notification refused");
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
            let _ = record_only(
                &s,
                Received {
                    error: Some(&e.message()),
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
        Err(_) => failure(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// Records a refused callback (its own transaction) as BAD_SIGNATURE evidence.
async fn record_only(s: &HttpState, rec: Received<'_>, trace: &TraceId) -> Result<(), String> {
    let mut conn = s
        .app
        .pool
        .get()
        .await
        .map_err(|e| format!("database unavailable: {e}"))?;
    payments::record(&mut conn, rec, Outcome::BadSignature.as_str(), trace)
        .await
        .map(|_| ())
        .map_err(|e| e.message())
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
