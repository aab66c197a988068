//! The provider seam: what fitorder asks of a payment provider, as one trait. WeChat Pay
//! (`wechat::client`) and Alipay (`alipay::client`) implement it; a new provider is one more
//! module implementing [`Gateway`] and one line in [`super::api::ProviderApi::with_pool`].
//!
//! Every answer a gateway acts on is verified first: an answer that is not properly signed is
//! [`ProviderError::Unsigned`], which callers treat as no answer at all.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::payment::{PayChannel, Provider};

/// A trade to open at the provider for the online part of an order.
#[derive(Debug, Clone)]
pub struct TradeRequest<'a> {
    pub channel: PayChannel,
    /// Our order number (`out_trade_no`).
    pub out_trade_no: &'a str,
    pub amount_cents: i64,
    /// What the member sees on the cashier.
    pub description: &'a str,
    /// The provider refuses payment after this (`time_expire`).
    pub expires_at: DateTime<Utc>,
    /// WECHAT_JSAPI: the payer.
    pub openid: Option<&'a str>,
    /// WECHAT_H5: the payer's IP, as WeChat requires.
    pub client_ip: Option<&'a str>,
    pub trace_id: &'a str,
}

/// What the member's client needs, by channel (the contract's `PaymentInstruction`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Instruction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wechat_jsapi: Option<super::wechat::signing::JsapiParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wechat_app: Option<super::wechat::signing::AppParams>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qr_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pay_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alipay_order_string: Option<String>,
}

/// What the provider says about a trade, in a signed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TradeState {
    /// Money was collected (also when it has been refunded since: it was paid).
    Paid { txn_id: String, amount_cents: i64 },
    /// The member is entering a password or the bank is deciding: ask again before canceling.
    Paying,
    /// Not paid (never, or closed unpaid).
    NotPaid,
}

/// A refund to send back to the payer.
#[derive(Debug, Clone)]
pub struct RefundRequest<'a> {
    pub out_trade_no: &'a str,
    pub refund_no: &'a str,
    pub provider_txn_id: Option<&'a str>,
    pub amount_cents: i64,
    pub total_cents: i64,
    pub reason: &'a str,
    pub trace_id: &'a str,
}

/// What became of a refund, as the provider says in a signed answer. Only [`RefundState::Done`]
/// means the money went back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundState {
    /// The money went back: WeChat `SUCCESS`; Alipay `fund_change` `Y`, or `REFUND_SUCCESS` from
    /// `alipay.trade.fastpay.refund.query`.
    Done { provider_refund_id: Option<String> },
    /// Accepted, the money not moved yet: WeChat `PROCESSING`; Alipay `fund_change` `N` without
    /// `REFUND_SUCCESS`. `recheck_in`: when to ask again (None: the delivery's own backoff).
    Pending {
        status: String,
        provider_refund_id: Option<String>,
        recheck_in: Option<std::time::Duration>,
    },
    /// It ended without the money going back (WeChat `ABNORMAL`, `CLOSED`): asking again will not
    /// change that; people must look at it.
    Failed {
        status: String,
        provider_refund_id: Option<String>,
    },
    /// The provider knows no such refund (only a refund query answers this).
    Unknown,
}

/// How the provider answered a close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Closed (or never opened there): it cannot be paid any more.
    Closed,
    /// Refused because the trade is not open any more (WeChat `ORDERPAID`, Alipay
    /// `ACQ.TRADE_STATUS_ERROR` / `ACQ.TRADE_HAS_SUCCESS`): paid meanwhile, as a rule. Only a
    /// query says what it is now.
    NotOpen,
}

/// What a bill request got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BillDownload {
    /// The provider has not made the day's bill yet (both are T+1, after about 09:00–10:00):
    /// WeChat `STATEMENT_CREATING`.
    NotReady(String),
    /// The provider says there is no bill of that day because nothing happened (WeChat
    /// `NO_STATEMENT_EXIST`, Alipay `isp.bill_not_exist`): reconciled as an empty bill.
    NoBill(String),
    /// The raw download, streamed to `archive`, packed as its provider packs bills
    /// ([`Plugin::unpack_bill`] unpacks it). `sha1`: the SHA1 of the unpacked bill, when the
    /// provider's signed answer gave one (WeChat Pay does), lowercase hex.
    Downloaded {
        archive: std::path::PathBuf,
        sha1: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// No answer: connection refused, timeout, TLS.
    #[error("{0}")]
    Unreachable(String),
    /// An answer whose signature is missing or does not verify: no answer at all.
    #[error("unsigned or forged answer: {0}")]
    Unsigned(String),
    /// An error answer the provider did not sign (WeChat `401 SIGN_ERROR`, an Alipay
    /// `error_response` or `isv.*` code): no answer at all, as [`ProviderError::Unsigned`] —
    /// it changes nothing — but its code and message are reported as they came (capped), so
    /// staff can tell a configuration mistake from an attack.
    #[error("the provider answered an error without a signature (nothing was changed): {0}")]
    UnsignedError(String),
    /// A signed answer refusing the request.
    #[error("refused by the provider: {0}")]
    Refused(String),
    /// This provider cannot do that (a channel of another provider).
    #[error("{0}")]
    Unsupported(String),
    /// A signed refusal: the provider keeps this out_trade_no to the trade it opened first.
    #[error("the provider keeps this out_trade_no to an earlier trade: {0}")]
    TradeTaken(String),
}

/// What a provider made of a notification as received.
#[derive(Debug)]
pub enum CheckedNotification {
    /// Refused at authentication; `malformed`: not even in the provider's format. The evidence
    /// (capped header values) is recorded with the capped body.
    Refused {
        malformed: bool,
        event_type: Option<String>,
        evidence: serde_json::Value,
        error: String,
    },
    /// Authentic. `body` is what the provider meant (decrypted where it encrypts), kept whole;
    /// `notice` is `Err` when it is authentic but not ours or not readable.
    Authentic {
        event_type: Option<String>,
        evidence: serde_json::Value,
        body: String,
        notice: Result<Notice, String>,
    },
}

/// What a verified notification says, in the providers' common terms.
#[derive(Debug, Clone)]
pub enum Notice {
    /// Money was collected for `out_trade_no`.
    Paid {
        out_trade_no: String,
        txn_id: String,
        amount_cents: i64,
    },
    /// A refund finished (or failed) at the provider.
    Refund {
        out_trade_no: String,
        refund_no: String,
        refund_id: String,
        ok: bool,
        status: String,
        amount_cents: i64,
    },
    /// Alipay says a refund of `out_trade_no` went through: `refund_no` (its `out_biz_no`) names
    /// our refund, `refunded_total_cents` (its `refund_fee`) is how much of the trade has been
    /// refunded in all so far, not this refund's own amount. It confirms a refund we asked for;
    /// it is never a payment.
    RefundConfirmed {
        out_trade_no: String,
        refund_no: String,
        trade_no: String,
        refunded_total_cents: i64,
        /// `TRADE_SUCCESS` after a partial refund, `TRADE_CLOSED` after a full one.
        trade_status: String,
    },
    /// Nothing to apply (a closed trade, a state we only record).
    Other { out_trade_no: Option<String>, what: String },
}

impl Notice {
    /// The idempotency key of a notice that changes something; None for the ones only recorded.
    pub fn key(&self) -> Option<String> {
        match self {
            Notice::Paid {
                out_trade_no, txn_id, ..
            } => Some(format!("{out_trade_no}:{txn_id}")),
            Notice::Refund {
                out_trade_no,
                refund_no,
                refund_id,
                status,
                ..
            } => Some(format!("refund:{out_trade_no}:{refund_no}:{refund_id}:{status}")),
            // The key Alipay refunds had as `Refund` notices, so retries of notifications received
            // before that change are still duplicates.
            Notice::RefundConfirmed {
                out_trade_no,
                refund_no,
                trade_no,
                trade_status,
                ..
            } => Some(format!(
                "refund:{out_trade_no}:{refund_no}:{trade_no}:REFUND:{trade_status}"
            )),
            Notice::Other { .. } => None,
        }
    }

    pub fn out_trade_no(&self) -> Option<&str> {
        match self {
            Notice::Paid { out_trade_no, .. }
            | Notice::Refund { out_trade_no, .. }
            | Notice::RefundConfirmed { out_trade_no, .. } => Some(out_trade_no),
            Notice::Other { out_trade_no, .. } => out_trade_no.as_deref(),
        }
    }
}

/// Text fit for a PostgreSQL `text` or `jsonb` string: invalid UTF-8 replaced, NUL (which
/// neither type stores) escaped as `\u0000`. With `limit`, cut at a character boundary
/// and marked with the original length.
pub fn evidence_text(bytes: &[u8], limit: Option<usize>) -> String {
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
pub fn evidence_header(value: Option<&str>) -> Option<String> {
    value.map(|v| evidence_text(v.as_bytes(), Some(256)))
}

/// How a notification ended, for the provider's reply ([`Plugin::reply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyOutcome {
    /// Recorded and applied (or a duplicate of one that was).
    Processed,
    /// The provider is not configured here.
    Unconfigured,
    /// Not in the provider's format at all.
    Malformed,
    /// Not authentic (signature, time window, decryption).
    Unauthentic,
    /// Authentic but not ours or not readable: refused, evidence kept.
    Unreadable,
    /// Could not be recorded or applied: the provider must retry.
    Retry,
    /// No database connection within the checkout wait: nothing was recorded, the provider
    /// must retry.
    Busy,
}

/// The reply to a notification, in the provider's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyReply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

/// A provider as fitorder knows it whether or not its keys are configured here: where its
/// notifications arrive, how it is answered, and how its [`Gateway`] is made from its keys.
/// Every provider is one `Plugin` in [`PLUGINS`]; the routes, the gateways and the key refresh
/// come from that list.
pub trait Plugin: Sync {
    fn provider(&self) -> Provider;

    /// Where its notifications arrive (the contract's path, `/pay/<provider>/notify`).
    fn notify_path(&self) -> &'static str;

    /// Its reply to a notification that ended so. The caller learns only that it was refused
    /// or must be retried; what went wrong is logged under the trace id and kept as evidence.
    fn reply(&self, outcome: NotifyOutcome) -> NotifyReply;

    /// Its gateway, when its keys are configured (`keys`); None otherwise.
    fn gateway(&self, keys: &super::keys::ProviderKeys, with: &GatewayParts) -> Option<std::sync::Arc<dyn Gateway>>;

    /// Unpacks a bill its gateway downloaded (`archive`, with the `sha1` its answer named) into
    /// `dest`, the bill as the parser reads it. Blocking: run on a blocking thread.
    fn unpack_bill(
        &self,
        archive: &std::path::Path,
        sha1: Option<&str>,
        dest: &std::path::Path,
    ) -> Result<super::bills::Unpacked, super::bills::ArchiveError>;

    /// Reads one of its unpacked bills, calling `row` for each data row in file order, and
    /// checks the bill's own totals.
    fn parse_bill(
        &self,
        input: &mut dyn std::io::BufRead,
        row: &mut dyn FnMut(super::bills::BillRow) -> Result<(), String>,
    ) -> Result<super::bills::BillSummary, super::bills::BillError>;
}

/// What every gateway is made with.
pub struct GatewayParts {
    /// The one HTTP client every provider shares.
    pub http: reqwest::Client,
    /// Where members' providers reach us (`FITORDER_PUBLIC_URL`): the notify URLs.
    pub public_url: String,
    /// A provider call's whole deadline (`FITORDER_PROVIDER_TIMEOUT`).
    pub timeout: std::time::Duration,
    /// Where keys fetched from a provider are kept for every instance.
    pub pool: crate::db::DbPool,
}

/// Every provider fitorder can use: one line each.
pub static PLUGINS: &[&dyn Plugin] = &[&super::wechat::WechatPlugin, &super::alipay::AlipayPlugin];

/// The plugin of `provider`.
pub fn plugin(provider: Provider) -> &'static dyn Plugin {
    *PLUGINS
        .iter()
        .find(|p| p.provider() == provider)
        .expect("every provider has its plugin in PLUGINS")
}

/// A payment provider, as fitorder uses it. Object-safe (`&dyn Gateway`): `async_trait` boxes
/// each call's future, which is what a registry of providers chosen at start needs.
#[async_trait::async_trait]
pub trait Gateway: Send + Sync {
    fn provider(&self) -> Provider;

    /// Authenticates and reads a notification (`POST /pay/<provider>/notify`).
    async fn check_notification(
        &self,
        headers: &reqwest::header::HeaderMap,
        body: &[u8],
        trace_id: &str,
    ) -> CheckedNotification;

    /// Opens the trade for `t.channel` and answers what the client needs.
    async fn start_trade(&self, t: &TradeRequest<'_>) -> Result<Instruction, ProviderError>;

    /// Asks whether `out_trade_no` was paid (a callback may be late or lost).
    async fn query(&self, out_trade_no: &str, trace_id: &str) -> Result<TradeState, ProviderError>;

    /// Closes the trade so that it cannot be paid any more. A trade the provider never saw is
    /// closed; one it refuses to close because it is not open any more is [`Closed::NotOpen`].
    async fn close(&self, out_trade_no: &str, trace_id: &str) -> Result<Closed, ProviderError>;

    /// Sends money back; the provider deduplicates by the refund number. Done only when the
    /// provider says the money moved.
    async fn refund(&self, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError>;

    /// Asks what became of refund `r.refund_no` (WeChat `GET /v3/refund/domestic/refunds/{no}`,
    /// Alipay `alipay.trade.fastpay.refund.query`).
    async fn refund_status(&self, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError>;

    /// Downloads the trade bill of business day `date` into `dir` (a short-lived download URL
    /// that lapsed is asked for again).
    async fn fetch_bill(
        &self,
        date: chrono::NaiveDate,
        dir: &std::path::Path,
        trace_id: &str,
    ) -> Result<BillDownload, ProviderError>;

    /// Keeps the provider's own keys current, at start and every hour (the task
    /// `provider:keys`): WeChat Pay loads the platform certificates other instances stored and
    /// fetches them when the newest fetch is 12 hours old. Answers how many were fetched. A
    /// provider whose keys are all in its settings keeps this default.
    async fn refresh_keys(&self, _trace_id: &str) -> anyhow::Result<usize> {
        Ok(0)
    }
}

/// Streams `resp`'s body into a new file `path` (a bill of a million rows never sits in memory).
pub async fn stream_to_file(
    mut resp: reqwest::Response,
    path: &std::path::Path,
    timeout: std::time::Duration,
) -> Result<u64, ProviderError> {
    use tokio::io::AsyncWriteExt;
    let failed = |e: std::io::Error| ProviderError::Unreachable(format!("writing the download: {}", e.kind()));
    let mut file = tokio::fs::File::create(path).await.map_err(failed)?;
    let mut written = 0u64;
    while let Some(chunk) = resp.chunk().await.map_err(|e| unreachable(&e, timeout))? {
        file.write_all(&chunk).await.map_err(failed)?;
        written += chunk.len() as u64;
    }
    file.flush().await.map_err(failed)?;
    Ok(written)
}

/// WeChat Pay's `time_expire`: RFC 3339 in Beijing time, whole seconds.
pub fn wechat_time(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%dT%H:%M:%S%:z")
        .to_string()
}

/// Alipay's times: `yyyy-MM-dd HH:mm:ss` in Asia/Shanghai.
pub fn alipay_time(t: DateTime<Utc>) -> String {
    t.with_timezone(&chrono_tz::Asia::Shanghai)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// The code and message of an unsigned error answer, as staff should read them: printable
/// characters only, at most 200 of them.
pub fn unsigned_error(status: u16, code: &str, message: &str) -> ProviderError {
    let clean = |t: &str, max: usize| -> String { t.chars().filter(|c| !c.is_control()).take(max).collect::<String>() };
    let message = clean(message, 200);
    ProviderError::UnsignedError(
        format!("HTTP {status} {} {message}", clean(code, 64))
            .trim_end()
            .to_string(),
    )
}

/// Describes a transport failure without internals.
pub fn unreachable(err: &reqwest::Error, timeout: std::time::Duration) -> ProviderError {
    ProviderError::Unreachable(if err.is_timeout() {
        format!("no answer within {}", humantime::format_duration(timeout))
    } else if err.is_connect() {
        "connection refused".into()
    } else {
        "request failed".into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn deadlines_are_written_in_beijing_time() {
        let t = Utc.with_ymd_and_hms(2026, 11, 30, 16, 5, 9).unwrap();
        assert_eq!(wechat_time(t), "2026-12-01T00:05:09+08:00");
        assert_eq!(alipay_time(t), "2026-12-01 00:05:09");
    }
}
