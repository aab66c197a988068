//! Starting a payment: the trade at the provider for the online part of an order, and what
//! the member's client needs to pay it. One trade per order and channel, kept, so that asking
//! again (a double tap, `startPayment`) answers the same trade. No connection is held while
//! the provider answers.

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::app::AppState;
use crate::db::models::Order;
use crate::db::schema::{members, payment_trades};
use crate::domain::{OrderStatus, PayChannel, PaymentMethod, Provider};
use crate::error::{AppError, AppResult};
use crate::providers::provider::{Instruction, ProviderError, TradeRequest};
use crate::trace::TraceId;

/// Why a JSAPI payment cannot start (checked before placing and again when it starts).
const NO_OPENID: &str = "WECHAT_JSAPI needs wechatOpenId, the payer's openid under the merchant's appid";

/// The contract's `PaymentInstruction`.
#[derive(Debug, Clone)]
pub struct PaymentStarted {
    pub provider: Provider,
    pub channel: PayChannel,
    pub out_trade_no: String,
    pub amount_cents: i64,
    pub expires_at: Option<DateTime<Utc>>,
    pub instruction: Instruction,
}

/// The provider of an online payment method (the online part of MIXED comes from the channel).
pub fn online_provider(
    method: PaymentMethod,
    channel: Option<PayChannel>,
    legacy: Option<Provider>,
) -> AppResult<Option<Provider>> {
    let named = channel.map(PayChannel::provider);
    let provider = match method {
        PaymentMethod::WechatPay => Provider::WechatPay,
        PaymentMethod::Alipay => Provider::Alipay,
        PaymentMethod::Mixed => match (named, legacy) {
            (Some(a), Some(b)) if a != b => {
                return Err(AppError::bad("channel and onlineProvider name different providers"));
            }
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => Provider::WechatPay,
        },
        PaymentMethod::Wallet | PaymentMethod::Offline => {
            if channel.is_some() {
                return Err(AppError::bad(format!(
                    "a {method} order has no online payment: channel is not taken"
                )));
            }
            return Ok(None);
        }
    };
    if named.is_some_and(|n| n != provider) {
        return Err(AppError::bad(format!(
            "channel {} is not a {} channel",
            channel.map(|c| c.as_str()).unwrap_or_default(),
            provider
        )));
    }
    Ok(Some(provider))
}

/// Refuses, before anything is placed, what could never be paid: a provider that is not
/// configured, a JSAPI payment without the payer's openid.
pub async fn check_payable(
    state: &AppState,
    conn: &mut crate::db::DbConn,
    provider: Provider,
    channel: PayChannel,
    member_id: i64,
    openid: Option<&str>,
) -> AppResult<()> {
    if !state.keys.configured(provider) {
        return Err(AppError::bad(format!(
            "{provider} is not configured here: choose another payment method"
        )));
    }
    if channel == PayChannel::WechatJsapi && openid.is_none() && stored_openid(conn, member_id).await?.is_none() {
        return Err(AppError::bad(NO_OPENID));
    }
    Ok(())
}

/// Why a `WECHAT_H5` payment cannot start without the payer's address.
const NO_PAYER_IP: &str = "WECHAT_H5 needs the payer's IP address as a trusted load balancer reports it \
     (X-Forwarded-For from a proxy in FITORDER_TRUSTED_PROXIES): choose another channel";

/// WeChat H5 needs the payer's real address (`scene_info.payer_client_ip`): without one that a
/// trusted proxy reported, the channel is refused rather than given a made-up address.
pub fn check_payer_ip(channel: PayChannel, payer_ip: Option<&str>) -> AppResult<()> {
    if channel == PayChannel::WechatH5 && payer_ip.is_none_or(|ip| ip.parse::<std::net::IpAddr>().is_err()) {
        return Err(AppError::bad(NO_PAYER_IP));
    }
    Ok(())
}

async fn stored_openid(conn: &mut crate::db::DbConn, member_id: i64) -> AppResult<Option<String>> {
    Ok(members::table
        .find(member_id)
        .select(members::wechat_open_id)
        .get_result::<Option<String>>(conn)
        .await
        .optional()?
        .flatten())
}

/// Valid openids as WeChat issues them (letters, digits, `-`, `_`).
pub fn check_openid(openid: &str) -> AppResult<&str> {
    let v = openid.trim();
    if v.is_empty() || v.len() > 128 || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(AppError::bad("wechatOpenId is not an openid"));
    }
    Ok(v)
}

/// Opens (or finds) the trade for `order` on `channel`. `channel` None: the provider's default.
pub async fn start_payment(
    state: &AppState,
    order: &Order,
    channel: Option<PayChannel>,
    openid: Option<&str>,
    client_ip: Option<&str>,
    trace: &TraceId,
) -> AppResult<PaymentStarted> {
    if order.status != OrderStatus::WaitPay {
        return Err(AppError::bad(format!(
            "order {} is {}: there is nothing to pay",
            order.order_no, order.status
        )));
    }
    let amount = order.online_cents();
    let provider = order.online_provider;
    let (Some(provider), true) = (provider, amount > 0) else {
        return Err(AppError::bad(format!("order {} is not paid online", order.order_no)));
    };
    let channel = channel.unwrap_or(provider.default_channel());
    if channel.provider() != provider {
        return Err(AppError::bad(format!(
            "order {} is paid with {provider}, not through {channel}",
            order.order_no
        )));
    }
    let expires_at = order
        .expires_at
        .ok_or_else(|| AppError::internal(format!("online order {} has no deadline", order.order_no)))?;
    check_payer_ip(channel, client_ip)?;
    let mut conn = state.pool.get().await?;
    let started = |instruction: Instruction| PaymentStarted {
        provider,
        channel,
        out_trade_no: order.order_no.clone(),
        amount_cents: amount,
        expires_at: order.expires_at,
        instruction,
    };
    if let Some(found) = stored(&mut conn, order.id, channel).await? {
        return Ok(started(found));
    }
    if expires_at <= Utc::now() {
        return Err(AppError::bad(format!("order {} has expired", order.order_no)));
    }
    let openid = match openid.map(check_openid).transpose()? {
        Some(given) => {
            diesel::update(members::table.find(order.member_id))
                .set(members::wechat_open_id.eq(given))
                .execute(&mut conn)
                .await?;
            Some(given.to_string())
        }
        None => stored_openid(&mut conn, order.member_id).await?,
    };
    if channel == PayChannel::WechatJsapi && openid.is_none() {
        return Err(AppError::bad(NO_OPENID));
    }
    drop(conn);
    let gateway = state
        .providers
        .gateway(provider)
        .ok_or_else(|| AppError::bad(format!("{provider} is not configured here")))?;
    let request = TradeRequest {
        channel,
        out_trade_no: &order.order_no,
        amount_cents: amount,
        description: &order.item_name,
        expires_at,
        openid: openid.as_deref(),
        client_ip,
        trace_id: trace.as_str(),
    };
    let instruction = match gateway.start_trade(&request).await {
        Ok(i) => i,
        Err(ProviderError::TradeTaken(_)) => {
            let mut conn = state.pool.get().await?;
            let opened: Vec<PayChannel> = payment_trades::table
                .filter(payment_trades::order_id.eq(order.id))
                .select(payment_trades::channel)
                .load(&mut conn)
                .await?;
            return Err(AppError::Conflict(format!(
                "{provider} keeps order {} to the cashier it was opened with ({}): pay there",
                order.order_no,
                if opened.is_empty() {
                    "another channel".to_string()
                } else {
                    opened.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
                }
            )));
        }
        Err(e) => return Err(unavailable(provider, &order.order_no, e)),
    };
    metrics::counter!("fitorder_trades_started_total", "channel" => channel.as_str()).increment(1);
    let mut conn = state.pool.get().await?;
    let value = serde_json::to_value(&instruction).map_err(AppError::internal)?;
    diesel::insert_into(payment_trades::table)
        .values((
            payment_trades::order_id.eq(order.id),
            payment_trades::provider.eq(provider),
            payment_trades::channel.eq(channel),
            payment_trades::out_trade_no.eq(&order.order_no),
            payment_trades::amount_cents.eq(amount),
            payment_trades::expires_at.eq(expires_at),
            payment_trades::instruction.eq(&value),
            payment_trades::trace_id.eq(trace.as_str()),
        ))
        .on_conflict((payment_trades::order_id, payment_trades::channel))
        .do_nothing()
        .execute(&mut conn)
        .await?;
    // A concurrent request may have stored its trade first: everyone answers with that one.
    let kept = stored(&mut conn, order.id, channel).await?.unwrap_or(instruction);
    Ok(started(kept))
}

async fn stored(conn: &mut crate::db::DbConn, order_id: i64, channel: PayChannel) -> AppResult<Option<Instruction>> {
    let found: Option<serde_json::Value> = payment_trades::table
        .filter(payment_trades::order_id.eq(order_id))
        .filter(payment_trades::channel.eq(channel))
        .select(payment_trades::instruction)
        .get_result(conn)
        .await
        .optional()?;
    found
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| AppError::internal(format!("stored trade of order {order_id}: {e}")))
}

/// The member sees that the provider could not be reached; the log says why.
fn unavailable(provider: Provider, order_no: &str, e: ProviderError) -> AppError {
    match e {
        ProviderError::Unsupported(m) => AppError::bad(m),
        e @ ProviderError::UnsignedError(_) => {
            tracing::warn!(%provider, order_no, error = %e, "starting the payment failed: an unsigned error answer");
            metrics::counter!("fitorder_provider_failures_total", "provider" => provider.as_str(), "call" => "prepay")
                .increment(1);
            AppError::ProviderUnavailable(format!(
                "{provider} refused to start the payment; {e}. Check the merchant configuration it names; the \
                 order is kept, try startPayment again"
            ))
        }
        e => {
            tracing::warn!(%provider, order_no, error = %e, "starting the payment failed");
            metrics::counter!("fitorder_provider_failures_total", "provider" => provider.as_str(), "call" => "prepay")
                .increment(1);
            AppError::ProviderUnavailable(format!(
                "{provider} could not be reached to start the payment; the order is kept, try startPayment again"
            ))
        }
    }
}
