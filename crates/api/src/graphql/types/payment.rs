//! Payments: callbacks as received, and what a member's client needs to pay.

use async_graphql::{Context, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};

use super::{is_member, OrderNode, PayChannel, PaymentProvider};
use crate::db::models;
use crate::error::AppResult;
use crate::graphql::error::{GqlResult, IntoGqlResult};

pub struct PaymentCallbackNode(pub models::PaymentCallback);

#[Object(name = "PaymentCallback")]
impl PaymentCallbackNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn provider(&self) -> PaymentProvider {
        self.0.provider.into()
    }
    async fn received_at(&self) -> DateTime<Utc> {
        self.0.received_at
    }
    async fn verified(&self) -> bool {
        self.0.verified
    }
    /// APPLIED, DUPLICATE, REJECTED_TRANSITION, PAID_AFTER_CANCEL, AMOUNT_MISMATCH, BAD_SIGNATURE, ...
    async fn outcome(&self) -> &str {
        self.0.outcome.as_str()
    }
    /// the payload as received (decrypted where the provider encrypts it); empty for members
    /// (it holds the provider's identifiers of payer and merchant)
    async fn body(&self, ctx: &Context<'_>) -> &str {
        if is_member(ctx) {
            return "";
        }
        &self.0.body
    }
    async fn event_type(&self) -> Option<&str> {
        self.0.event_type.as_deref()
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
}

/// The arguments of wx.requestPayment, signed with the merchant key (RSA over appId, timeStamp, nonceStr, package)
#[derive(SimpleObject, Clone, Debug)]
pub struct WechatJsapiParams {
    pub app_id: String,
    pub time_stamp: String,
    pub nonce_str: String,
    pub package: String,
    pub sign_type: String,
    pub pay_sign: String,
}

/// The fields of the WeChat app SDK's PayReq, signed with the merchant key
#[derive(SimpleObject, Clone, Debug)]
pub struct WechatAppParams {
    pub app_id: String,
    pub partner_id: String,
    pub prepay_id: String,
    pub package_value: String,
    pub nonce_str: String,
    pub time_stamp: String,
    pub sign: String,
}

/// What the member's client needs to pay the online part. The provider refuses payment after expiresAt.
#[derive(SimpleObject, Clone, Debug)]
pub struct PaymentInstruction {
    pub provider: PaymentProvider,
    pub out_trade_no: String,
    pub amount_cents: i32,
    pub expires_at: Option<DateTime<Utc>>,
    pub channel: PayChannel,
    /// WECHAT_JSAPI
    pub wechat_jsapi: Option<WechatJsapiParams>,
    /// WECHAT_APP
    pub wechat_app: Option<WechatAppParams>,
    /// WECHAT_NATIVE and ALIPAY_QR: the text to show as a QR code
    pub qr_code: Option<String>,
    /// WECHAT_H5 and ALIPAY_WAP: the page to open
    pub pay_url: Option<String>,
    /// ALIPAY_APP: the signed order string to hand to the Alipay SDK
    pub alipay_order_string: Option<String>,
}

impl TryFrom<crate::payments::trades::PaymentStarted> for PaymentInstruction {
    type Error = crate::error::AppError;
    fn try_from(p: crate::payments::trades::PaymentStarted) -> AppResult<Self> {
        let i = p.instruction;
        Ok(PaymentInstruction {
            provider: p.provider.into(),
            out_trade_no: p.out_trade_no,
            amount_cents: super::super::int(p.amount_cents)?,
            expires_at: p.expires_at,
            channel: p.channel.into(),
            wechat_jsapi: i.wechat_jsapi.map(|j| WechatJsapiParams {
                app_id: j.app_id,
                time_stamp: j.time_stamp,
                nonce_str: j.nonce_str,
                package: j.package,
                sign_type: j.sign_type,
                pay_sign: j.pay_sign,
            }),
            wechat_app: i.wechat_app.map(|a| WechatAppParams {
                app_id: a.app_id,
                partner_id: a.partner_id,
                prepay_id: a.prepay_id,
                package_value: a.package_value,
                nonce_str: a.nonce_str,
                time_stamp: a.time_stamp,
                sign: a.sign,
            }),
            qr_code: i.qr_code,
            pay_url: i.pay_url,
            alipay_order_string: i.alipay_order_string,
        })
    }
}

pub struct PlaceOrderPayload {
    pub order: OrderNode,
    /// None: nothing is paid online; an error: the provider could not start the payment.
    pub payment: Result<Option<PaymentInstruction>, crate::error::AppError>,
}

#[Object]
impl PlaceOrderPayload {
    async fn order(&self) -> &OrderNode {
        &self.order
    }

    /// null unless part is paid online
    async fn payment(&self) -> GqlResult<Option<PaymentInstruction>> {
        self.payment.clone().gql()
    }
}
