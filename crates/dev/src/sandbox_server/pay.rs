//! A person pays at the cashier: the trade becomes paid and its notification goes out.

use super::*;

/// Why the cashier could not take a payment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayError {
    #[error("the sandbox has no such trade")]
    UnknownTrade,
    #[error("the trade is {0}: it cannot be paid")]
    NotPayable(String),
    #[error("the trade expired at {0}: it cannot be paid any more")]
    Expired(String),
}

/// A close arrived for a trade [`SandboxProvider::pay_during_close`] named: the member pays
/// it first. Returns whether the payment notification is to be sent after the close's answer.
pub fn paid_before_close(inner: &Inner, provider: &'static str, no: &str) -> Option<bool> {
    let mut s = inner.lock();
    let notify = s.pay_on_close.remove(&(provider, no.to_string()))?;
    let t = s.trades.get_mut(&(provider, no.to_string()))?;
    if !matches!(t.state.as_str(), "NOTPAY" | "USERPAYING" | "WAIT_BUYER_PAY") {
        return None;
    }
    if provider == ALIPAY {
        t.exists_at_provider = true;
        t.txn_id.get_or_insert_with(alipay_trade_no);
        t.state = "TRADE_SUCCESS".into();
    } else {
        t.state = "SUCCESS".into();
        t.txn_id = Some(format!("42000{}", digits(23)));
    }
    t.paid_at = Some(Utc::now());
    Some(notify)
}

/// Sends the payment notification of a trade paid during its close (after the close's answer).
pub fn notify_paid_later(inner: Arc<Inner>, provider: &'static str, no: String) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = pay_trade(&inner, provider, &no).await;
    });
}

/// The Pay button: marks the trade paid (or finds it paid already) and sends the payment
/// notification.
pub async fn pay_trade(inner: &Inner, provider: &'static str, no: &str) -> Result<SandboxNotification, PayError> {
    let now = Utc::now();
    let trade = {
        let mut s = inner.lock();
        let t = s
            .trades
            .get_mut(&(provider, no.to_string()))
            .ok_or(PayError::UnknownTrade)?;
        if provider == ALIPAY && !t.exists_at_provider {
            t.exists_at_provider = true;
            t.txn_id.get_or_insert_with(alipay_trade_no);
        }
        let paid_already = matches!(t.state.as_str(), "SUCCESS" | "REFUND" | "TRADE_SUCCESS");
        if !paid_already {
            if !matches!(t.state.as_str(), "NOTPAY" | "USERPAYING" | "WAIT_BUYER_PAY") {
                return Err(PayError::NotPayable(t.state.clone()));
            }
            if now > t.time_expire {
                return Err(PayError::Expired(t.time_expire_text.clone()));
            }
            if provider == WECHAT_PAY {
                t.state = "SUCCESS".into();
                t.txn_id = Some(format!("42000{}", digits(23)));
            } else {
                t.state = "TRADE_SUCCESS".into();
            }
            t.paid_at = Some(now);
        }
        t.clone()
    };
    Ok(if provider == WECHAT_PAY {
        // A resent notification says what the first one said, even after a refund.
        let mut paid = trade.clone();
        paid.state = "SUCCESS".into();
        let resource = wechat::transaction_resource(&inner.keys, &paid);
        inner
            .notify_wechat(&trade.out_trade_no, &trade.notify_url, "TRANSACTION.SUCCESS", &resource)
            .await
    } else {
        let yuan = yuan(trade.amount_cents);
        let paid = shanghai(trade.paid_at.unwrap_or(now));
        let created = shanghai(trade.created_at);
        inner
            .notify_alipay(
                &trade.out_trade_no,
                &trade.notify_url,
                "TRADE_SUCCESS",
                &[
                    ("out_trade_no", &trade.out_trade_no),
                    ("trade_no", trade.txn_id.as_deref().unwrap_or_default()),
                    ("trade_status", "TRADE_SUCCESS"),
                    ("total_amount", &yuan),
                    ("receipt_amount", &yuan),
                    ("buyer_pay_amount", &yuan),
                    ("invoice_amount", &yuan),
                    ("buyer_id", alipay::BUYER_ID),
                    ("seller_id", alipay::SELLER_ID),
                    ("subject", &trade.description),
                    ("gmt_create", &created),
                    ("gmt_payment", &paid),
                ],
            )
            .await
    })
}
