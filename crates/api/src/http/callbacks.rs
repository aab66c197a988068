//! `POST /pay/<provider>/notify`: one handler for every provider of the registry
//! (`providers::provider::PLUGINS`), which answers in the provider's own words (`Plugin::reply`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::HttpState;
use crate::domain::payment::Provider;
use crate::error::AppError;
use crate::payments::{self, evidence_text, Outcome, Received};
use crate::providers::provider::{CheckedNotification, NotifyOutcome as Handled};
use crate::trace::TraceId;

/// Refused callbacks are logged at WARN at most this many times a minute (a flood of
/// forgeries must not flood the log); the rest are counted in the metric and the next line.
const WARN_PER_MINUTE: u64 = 20;

fn warn_refused(provider: Provider, error: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static MINUTE: AtomicU64 = AtomicU64::new(0);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    metrics::counter!("fitorder_callbacks_unverified_total", "provider" => provider.as_str()).increment(1);
    let minute = (chrono::Utc::now().timestamp() / 60) as u64;
    if MINUTE.swap(minute, Ordering::Relaxed) != minute {
        COUNT.store(0, Ordering::Relaxed);
    }
    if COUNT.fetch_add(1, Ordering::Relaxed) < WARN_PER_MINUTE {
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        tracing::warn!(%provider, error = %evidence_text(error.as_bytes(), Some(200)), suppressed, "notification refused");
    } else {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
    }
}

/// The address a callback came from, for sampling unverified ones: the client behind our own
/// proxies (`client_addr`, `FITORDER_TRUSTED_PROXIES`), else the connection's peer; None when
/// the server recorded no peer (all such callbacks then share one sample).
fn source_addr(s: &HttpState, extensions: &axum::http::Extensions, headers: &HeaderMap) -> Option<std::net::IpAddr> {
    let peer = extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()?.0;
    super::client_addr::client_addr(peer, headers, &s.app.config.trusted_proxies).or(Some(peer.ip()))
}

/// A notification that could not be recorded or applied: Busy when no connection could be
/// had, Retry otherwise. What went wrong is logged (and on the callback row when there is
/// one); the provider learns only that it must retry.
fn failed(e: &AppError) -> Handled {
    match e {
        AppError::Unavailable(_) => Handled::Busy,
        _ => Handled::Retry,
    }
}

/// One path for every provider: the provider's gateway authenticates and reads, then the
/// evidence is recorded (capped until authentic) and the notice applied.
async fn handle(
    s: &HttpState,
    provider: Provider,
    extensions: &axum::http::Extensions,
    headers: &HeaderMap,
    body: &[u8],
    trace: &TraceId,
) -> Handled {
    let Some(gateway) = s.app.providers.gateway(provider) else {
        tracing::error!(%provider, "notification refused: the provider is not configured (see the configuration table)");
        return Handled::Unconfigured;
    };
    match gateway.check_notification(headers, body, trace.as_str()).await {
        CheckedNotification::Refused {
            malformed,
            event_type,
            evidence,
            error,
        } => {
            let msg = evidence_text(error.as_bytes(), Some(1024));
            warn_refused(provider, &msg);
            // A flood of unsigned posts leaves a sample, not a row each (the metric counts all).
            if !s.app.unverified.keep(source_addr(s, extensions, headers)) {
                metrics::counter!("fitorder_callbacks_unverified_dropped_total", "provider" => provider.as_str())
                    .increment(1);
                return if malformed {
                    Handled::Malformed
                } else {
                    Handled::Unauthentic
                };
            }
            // Until the signature is checked the body is anybody's: only its beginning is kept.
            let raw = evidence_text(body, Some(s.app.config.unverified_callback_bytes));
            let rec = Received {
                provider,
                verified: false,
                event_type: event_type.as_deref(),
                body: &raw,
                headers: evidence,
                error: Some(&msg),
            };
            match (record_only(s, rec, trace).await, malformed) {
                (_, true) => Handled::Malformed,
                (Err(e), false) => failed(&e),
                (Ok(()), false) => Handled::Unauthentic,
            }
        }
        CheckedNotification::Authentic {
            event_type,
            evidence,
            body,
            notice,
        } => {
            // Authentic from here on: kept whole (NULs escaped).
            let body = evidence_text(body.as_bytes(), None);
            let notice_error = notice.as_ref().err().map(|e| evidence_text(e.as_bytes(), Some(1024)));
            let rec = Received {
                provider,
                verified: true,
                event_type: event_type.as_deref(),
                body: &body,
                headers: evidence,
                error: notice_error.as_deref(),
            };
            let notice = match notice {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(%provider, error = %e, "notification authentic but refused");
                    return match record_only(s, rec, trace).await {
                        Ok(()) => Handled::Unreadable,
                        Err(e) => failed(&e),
                    };
                }
            };
            match process(s, rec, notice, trace).await {
                Ok(_) => Handled::Processed,
                Err(e) => {
                    tracing::error!(%provider, error = %e.message(), "notification not processed");
                    failed(&e)
                }
            }
        }
    }
}

/// `POST` of `provider`'s notify path: handled, then answered as the provider expects.
pub async fn notify(
    provider: Provider,
    State(s): State<HttpState>,
    Extension(trace): Extension<TraceId>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let outcome = handle(&s, provider, &extensions, &headers, &body, &trace).await;
    let reply = crate::providers::provider::plugin(provider).reply(outcome);
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if reply.body.is_empty() {
        return status.into_response();
    }
    (
        status,
        [(axum::http::header::CONTENT_TYPE, reply.content_type)],
        reply.body,
    )
        .into_response()
}

/// Records a refused callback (its own transaction) as BAD_SIGNATURE evidence.
async fn record_only(s: &HttpState, rec: Received<'_>, trace: &TraceId) -> Result<(), AppError> {
    let recorded = async {
        let mut conn = s.app.pool.get().await?;
        payments::record(&mut conn, rec, Outcome::BadSignature, trace).await
    }
    .await;
    recorded.map(|_| ()).inspect_err(|e| {
        tracing::error!(error = %e.message(), "refused callback not recorded");
    })
}

/// Records the verified callback, then applies it: a payment not seen before in one
/// transaction (`payments::receive_and_apply`), a redelivery and any other notice by recording
/// it first (`payments::record_checked`, which answers a duplicate at once). An error means the
/// provider must retry (why is written on the callback row).
async fn process(
    s: &HttpState,
    rec: Received<'_>,
    notice: payments::Notice,
    trace: &TraceId,
) -> Result<Outcome, AppError> {
    let provider = rec.provider;
    if matches!(notice, payments::Notice::Paid { .. }) && !payments::processed_lately(&s.app, &notice) {
        // Not a redelivery this process knows of: received, claimed and applied in one
        // transaction (a duplicate all the same is found by the key's claim there).
        return payments::receive_and_apply(&s.app, rec, &notice, trace)
            .await
            .inspect_err(|e| {
                tracing::error!(error = %e.message(), "payment notification not applied; the provider will retry");
            });
    }
    let callback_id = {
        let mut conn = s.app.evidence.get().await?;
        let (id, duplicate) = payments::record_checked(&mut conn, rec, &notice, trace).await?;
        if duplicate {
            // Already processed: recorded as a DUPLICATE, answered like the first time.
            return Ok(Outcome::Duplicate);
        }
        id
    };
    payments::apply(&s.app, provider, callback_id, notice, trace)
        .await
        .inspect_err(|e| {
            tracing::error!(callback_id, error = %e.message(), "callback recorded but not applied; the provider will retry");
        })
}
