//! The object types of the schema. Nodes wrap database rows; related objects come through the
//! request's DataLoader so that a page of 100 orders costs a handful of statements.

use async_graphql::{Context, Enum, Object, SimpleObject, ID};
use chrono::{DateTime, NaiveDate, Utc};

use super::loaders::*;
use super::outbox::{CompensationKind, CompensationStatus};
use super::{int, request, viewer};
use crate::auth::Role;
use crate::db::models;
use crate::domain::OrderStatus;
use crate::error::{AppError, AppResult};

/// Enums stored as their GraphQL names in TEXT columns.
macro_rules! text_enum {
    ($name:ident { $($variant:ident = $text:literal),* $(,)? }) => {
        #[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
        pub enum $name { $(#[graphql(name = $text)] $variant),* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            pub fn as_str(self) -> &'static str { match self { $($name::$variant => $text),* } }
            pub fn parse(s: &str) -> Option<$name> { $name::ALL.iter().copied().find(|v| v.as_str() == s) }
        }
    };
}

text_enum!(OrderKind { Membership = "MEMBERSHIP", ClassPack = "CLASS_PACK", PrivateSession = "PRIVATE_SESSION" });
text_enum!(PaymentMethod { WechatPay = "WECHAT_PAY", Alipay = "ALIPAY", Wallet = "WALLET", Offline = "OFFLINE", Mixed = "MIXED" });
text_enum!(PaymentProvider { WechatPay = "WECHAT_PAY", Alipay = "ALIPAY" });
text_enum!(MembershipStatus { Active = "ACTIVE", Expired = "EXPIRED", Revoked = "REVOKED" });
text_enum!(TicketKind {
    ProviderPaidLocalUnpaid = "PROVIDER_PAID_LOCAL_UNPAID",
    LocalPaidProviderMissing = "LOCAL_PAID_PROVIDER_MISSING",
    AmountMismatch = "AMOUNT_MISMATCH",
    RefundMismatch = "REFUND_MISMATCH",
    PaidAfterCancel = "PAID_AFTER_CANCEL",
    CompensationDead = "COMPENSATION_DEAD",
    UnknownOrder = "UNKNOWN_ORDER",
    RejectedTransition = "REJECTED_TRANSITION",
});
text_enum!(TicketStatus { Open = "OPEN", InProgress = "IN_PROGRESS", Resolved = "RESOLVED", Dismissed = "DISMISSED" });
text_enum!(TicketAction {
    Refund = "REFUND",
    CreditSessions = "CREDIT_SESSIONS",
    ReplayCompensation = "REPLAY_COMPENSATION",
    MarkPaid = "MARK_PAID",
    NoAction = "NO_ACTION",
});
text_enum!(ReconciliationStatus { Running = "RUNNING", Succeeded = "SUCCEEDED", Failed = "FAILED", Waiting = "WAITING" });
text_enum!(AnomalyCategory {
    DuplicateCallback = "DUPLICATE_CALLBACK",
    BadSignature = "BAD_SIGNATURE",
    IllegalTransition = "ILLEGAL_TRANSITION",
    PaidAfterCancel = "PAID_AFTER_CANCEL",
    AmountMismatch = "AMOUNT_MISMATCH",
    OrderExpired = "ORDER_EXPIRED",
    DuplicateCheckIn = "DUPLICATE_CHECK_IN",
    CompensationRetry = "COMPENSATION_RETRY",
    CompensationDead = "COMPENSATION_DEAD",
    ReconciliationFinding = "RECONCILIATION_FINDING",
});

fn parse_or_internal<T>(v: Option<T>, what: &str, raw: &str) -> AppResult<T> {
    v.ok_or_else(|| AppError::internal(format!("unknown {what} {raw:?} in the database")))
}

/// Ops screens see phone numbers masked; staff and the member themself see them whole.
pub fn mask_phone(phone: &str) -> String {
    let n = phone.chars().count();
    if n <= 7 {
        return "*".repeat(n);
    }
    let head: String = phone.chars().take(3).collect();
    let tail: String = phone.chars().skip(n - 4).collect();
    format!("{head}{}{tail}", "*".repeat(n - 7))
}

pub struct StoreNode(pub models::Store);

#[Object(name = "Store")]
impl StoreNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn code(&self) -> &str {
        &self.0.code
    }
}

#[derive(SimpleObject)]
#[graphql(name = "Wallet")]
pub struct WalletNode {
    pub balance_cents: i32,
    pub frozen_cents: i32,
}

pub struct MemberNode(pub models::Member);

#[Object(name = "Member")]
impl MemberNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn phone(&self, ctx: &Context<'_>) -> String {
        match request(ctx).viewer.as_ref().map(|v| v.role) {
            Some(Role::Ops) => mask_phone(&self.0.phone),
            _ => self.0.phone.clone(),
        }
    }
    async fn store(&self, ctx: &Context<'_>) -> AppResult<StoreNode> {
        load_store(ctx, self.0.store_id).await
    }
    async fn wallet(&self) -> AppResult<WalletNode> {
        Ok(WalletNode {
            balance_cents: int(self.0.balance_cents)?,
            frozen_cents: int(self.0.frozen_cents)?,
        })
    }
    /// Unused session credits over all paid orders
    async fn session_credits(&self, ctx: &Context<'_>) -> AppResult<i32> {
        Ok(loader(ctx)
            .load_one(MemberCredits(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or(0))
    }
    async fn memberships(&self, ctx: &Context<'_>) -> AppResult<Vec<MembershipNode>> {
        let v = request(ctx).viewer.as_ref();
        Ok(loader(ctx)
            .load_one(MemberMemberships(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .filter(|m| v.is_none_or(|v| v.sees_store(m.store_id)))
            .map(MembershipNode)
            .collect())
    }
}

fn is_member(ctx: &Context<'_>) -> bool {
    request(ctx).viewer.as_ref().is_none_or(|v| v.role == Role::Member)
}

/// A member reached through another object (an order, a membership): a store-limited admin
/// sees only members of their stores; anyone else is refused with FORBIDDEN.
async fn scoped_member(ctx: &Context<'_>, id: i64) -> AppResult<MemberNode> {
    let m = load_member(ctx, id).await?;
    match request(ctx).viewer.as_ref() {
        Some(v) if !v.sees_store(m.0.store_id) => Err(AppError::Forbidden(format!(
            "member {id} belongs to a store outside your stores"
        ))),
        _ => Ok(m),
    }
}

/// Who is asking: the role, the token's subject and, for members, their account.
pub struct ViewerNode;

#[Object(name = "Viewer")]
impl ViewerNode {
    async fn role(&self, ctx: &Context<'_>) -> AppResult<&'static str> {
        Ok(viewer(ctx)?.role.as_str())
    }
    async fn subject(&self, ctx: &Context<'_>) -> AppResult<String> {
        Ok(viewer(ctx)?.subject.clone())
    }
    async fn member(&self, ctx: &Context<'_>) -> AppResult<Option<MemberNode>> {
        match viewer(ctx)?.member_id {
            Some(id) => load_member(ctx, id).await.map(Some),
            None => Ok(None),
        }
    }
}

pub struct MembershipPlanNode(pub models::MembershipPlan);

#[Object(name = "MembershipPlan")]
impl MembershipPlanNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn duration_days(&self) -> i32 {
        self.0.duration_days
    }
    async fn price_cents(&self) -> AppResult<i32> {
        int(self.0.price_cents)
    }
}

pub struct ClassPackNode(pub models::ClassPack);

#[Object(name = "ClassPack")]
impl ClassPackNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn name(&self) -> &str {
        &self.0.name
    }
    async fn sessions(&self) -> i32 {
        self.0.sessions
    }
    async fn price_cents(&self) -> AppResult<i32> {
        int(self.0.price_cents)
    }
    /// null: unlimited
    async fn remaining_stock(&self) -> Option<i32> {
        self.0.stock
    }
}

pub struct CoachSlotNode(pub models::CoachSlot);

#[Object(name = "CoachSlot")]
impl CoachSlotNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn coach_name(&self) -> &str {
        &self.0.coach_name
    }
    async fn starts_at(&self) -> DateTime<Utc> {
        self.0.starts_at
    }
    async fn ends_at(&self) -> DateTime<Utc> {
        self.0.ends_at
    }
    async fn capacity(&self) -> i32 {
        self.0.capacity
    }
    async fn remaining(&self) -> i32 {
        self.0.remaining
    }
    async fn price_cents(&self) -> AppResult<i32> {
        int(self.0.price_cents)
    }
}

#[derive(SimpleObject)]
#[graphql(name = "Catalog")]
pub struct CatalogNode {
    pub membership_plans: Vec<MembershipPlanNode>,
    pub class_packs: Vec<ClassPackNode>,
    pub coach_slots: Vec<CoachSlotNode>,
}

pub struct MembershipNode(pub models::Membership);

#[Object(name = "Membership")]
impl MembershipNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn status(&self) -> AppResult<MembershipStatus> {
        parse_or_internal(
            MembershipStatus::parse(&self.0.status),
            "membership status",
            &self.0.status,
        )
    }
    async fn valid_from(&self) -> DateTime<Utc> {
        self.0.valid_from
    }
    async fn valid_to(&self) -> DateTime<Utc> {
        self.0.valid_to
    }
    async fn member(&self, ctx: &Context<'_>) -> AppResult<MemberNode> {
        scoped_member(ctx, self.0.member_id).await
    }
    async fn plan(&self, ctx: &Context<'_>) -> AppResult<MembershipPlanNode> {
        loader(ctx)
            .load_one(PlanId(self.0.plan_id))
            .await
            .map_err(|e| e.into_app())?
            .map(MembershipPlanNode)
            .ok_or_else(|| AppError::NotFound("plan".into()))
    }
    async fn order(&self, ctx: &Context<'_>) -> AppResult<OrderNode> {
        load_order(ctx, self.0.order_id).await
    }
}

#[derive(SimpleObject, Clone, Debug)]
pub struct TimelineEntry {
    pub at: DateTime<Utc>,
    /// STATUS_CHANGE, CALLBACK, COMPENSATION_ATTEMPT, CHECK_IN, TICKET, ...
    pub kind: String,
    pub actor: String,
    pub from_status: Option<OrderStatus>,
    pub to_status: Option<OrderStatus>,
    pub summary: String,
    pub trace_id: String,
}

pub struct PaymentCallbackNode(pub models::PaymentCallback);

#[Object(name = "PaymentCallback")]
impl PaymentCallbackNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn provider(&self) -> AppResult<PaymentProvider> {
        parse_or_internal(PaymentProvider::parse(&self.0.provider), "provider", &self.0.provider)
    }
    async fn received_at(&self) -> DateTime<Utc> {
        self.0.received_at
    }
    async fn verified(&self) -> bool {
        self.0.verified
    }
    /// APPLIED, DUPLICATE, REJECTED_TRANSITION, PAID_AFTER_CANCEL, AMOUNT_MISMATCH, BAD_SIGNATURE, ...
    async fn outcome(&self) -> &str {
        &self.0.outcome
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

#[derive(SimpleObject, Clone, Debug)]
#[graphql(name = "CompensationAttempt")]
pub struct CompensationAttemptNode {
    pub at: DateTime<Utc>,
    pub ok: bool,
    pub error: Option<String>,
    pub duration_ms: i32,
}

pub struct CompensationEventNode(pub models::CompensationEvent);

#[Object(name = "CompensationEvent")]
impl CompensationEventNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn order_no(&self) -> String {
        self.0.payload["orderNo"].as_str().unwrap_or_default().to_string()
    }
    async fn kind(&self) -> AppResult<CompensationKind> {
        parse_or_internal(
            crate::domain::CompensationKind::parse(&self.0.kind),
            "compensation kind",
            &self.0.kind,
        )
        .map(Into::into)
    }
    async fn status(&self) -> AppResult<CompensationStatus> {
        parse_or_internal(
            crate::domain::CompensationStatus::parse(&self.0.status),
            "compensation status",
            &self.0.status,
        )
        .map(Into::into)
    }
    async fn attempts(&self) -> i32 {
        self.0.attempts
    }
    async fn max_attempts(&self) -> i32 {
        self.0.max_attempts
    }
    async fn next_attempt_at(&self) -> Option<DateTime<Utc>> {
        match self.0.status.as_str() {
            "PENDING" | "RETRYING" => self.0.next_attempt_at,
            _ => None,
        }
    }
    /// the downstream's last answer (staff only: it can hold another system's internals)
    async fn last_error(&self, ctx: &Context<'_>) -> Option<&str> {
        if is_member(ctx) {
            return None;
        }
        self.0.last_error.as_deref()
    }
    async fn updated_at(&self) -> DateTime<Utc> {
        self.0.updated_at
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    /// The downstream's idempotency key, the same on every attempt.
    async fn idempotency_key(&self) -> &str {
        &self.0.idempotency_key
    }
    async fn attempt_log(&self, ctx: &Context<'_>) -> AppResult<Vec<CompensationAttemptNode>> {
        let member = is_member(ctx);
        Ok(loader(ctx)
            .load_one(EventAttempts(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(|a| CompensationAttemptNode {
                at: a.at,
                ok: a.ok,
                error: if member { None } else { a.error },
                duration_ms: a.duration_ms,
            })
            .collect())
    }
}

pub struct ExceptionTicketNode(pub models::ExceptionTicket);

#[Object(name = "ExceptionTicket")]
impl ExceptionTicketNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn kind(&self) -> AppResult<TicketKind> {
        parse_or_internal(TicketKind::parse(&self.0.kind), "ticket kind", &self.0.kind)
    }
    async fn status(&self) -> AppResult<TicketStatus> {
        parse_or_internal(TicketStatus::parse(&self.0.status), "ticket status", &self.0.status)
    }
    async fn provider(&self) -> Option<PaymentProvider> {
        self.0.provider.as_deref().and_then(PaymentProvider::parse)
    }
    async fn order_no(&self) -> Option<&str> {
        self.0.order_no.as_deref()
    }
    async fn provider_txn_id(&self) -> Option<&str> {
        self.0.provider_txn_id.as_deref()
    }
    async fn local_amount_cents(&self) -> AppResult<Option<i32>> {
        self.0.local_amount_cents.map(int).transpose()
    }
    async fn provider_amount_cents(&self) -> AppResult<Option<i32>> {
        self.0.provider_amount_cents.map(int).transpose()
    }
    /// JSON text with what was found
    async fn detail(&self) -> String {
        self.0.detail.to_string()
    }
    async fn opened_at(&self) -> DateTime<Utc> {
        self.0.opened_at
    }
    async fn resolved_at(&self) -> Option<DateTime<Utc>> {
        self.0.resolved_at
    }
    async fn resolution(&self) -> Option<TicketAction> {
        self.0.resolution.as_deref().and_then(TicketAction::parse)
    }
    async fn note(&self) -> Option<&str> {
        self.0.note.as_deref()
    }
    async fn resolved_by(&self) -> Option<&str> {
        self.0.resolved_by.as_deref()
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    async fn order(&self, ctx: &Context<'_>) -> AppResult<Option<OrderNode>> {
        match self.0.order_id {
            Some(id) => load_order(ctx, id).await.map(Some),
            None => Ok(None),
        }
    }
}

pub struct OrderNode(pub models::Order);

#[Object(name = "Order")]
impl OrderNode {
    async fn order_no(&self) -> &str {
        &self.0.order_no
    }
    async fn kind(&self) -> AppResult<OrderKind> {
        parse_or_internal(OrderKind::parse(&self.0.kind), "order kind", &self.0.kind)
    }
    async fn status(&self) -> OrderStatus {
        self.0.status()
    }
    async fn member(&self, ctx: &Context<'_>) -> AppResult<MemberNode> {
        scoped_member(ctx, self.0.member_id).await
    }
    async fn store(&self, ctx: &Context<'_>) -> AppResult<StoreNode> {
        load_store(ctx, self.0.store_id).await
    }
    async fn item_name(&self) -> &str {
        &self.0.item_name
    }
    async fn amount_cents(&self) -> AppResult<i32> {
        int(self.0.amount_cents)
    }
    /// the part paid from the wallet (MIXED and WALLET)
    async fn wallet_amount_cents(&self) -> AppResult<i32> {
        int(self.0.wallet_amount_cents)
    }
    async fn payment_method(&self) -> AppResult<PaymentMethod> {
        parse_or_internal(
            PaymentMethod::parse(&self.0.payment_method),
            "payment method",
            &self.0.payment_method,
        )
    }
    /// The provider that takes the online part (WECHAT_PAY, ALIPAY), if any.
    async fn online_provider(&self) -> Option<PaymentProvider> {
        self.0.online_provider.as_deref().and_then(PaymentProvider::parse)
    }
    async fn sessions_total(&self) -> i32 {
        self.0.sessions_total
    }
    async fn sessions_used(&self) -> i32 {
        self.0.sessions_used
    }
    async fn expires_at(&self) -> Option<DateTime<Utc>> {
        self.0.expires_at
    }
    async fn is_expired(&self) -> bool {
        self.0.is_expired(Utc::now())
    }
    async fn created_at(&self) -> DateTime<Utc> {
        self.0.created_at
    }
    async fn paid_at(&self) -> Option<DateTime<Utc>> {
        self.0.paid_at
    }
    async fn canceled_at(&self) -> Option<DateTime<Utc>> {
        self.0.canceled_at
    }
    /// TIMEOUT for expired orders
    async fn cancel_reason(&self) -> Option<&str> {
        self.0.cancel_reason.as_deref()
    }
    async fn refunded_at(&self) -> Option<DateTime<Utc>> {
        self.0.refunded_at
    }
    async fn refund_amount_cents(&self) -> AppResult<Option<i32>> {
        self.0.refund_amount_cents.map(int).transpose()
    }
    async fn provider_txn_id(&self) -> Option<&str> {
        self.0.provider_txn_id.as_deref()
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    /// statuses the state machine allows from here
    async fn allowed_transitions(&self) -> Vec<OrderStatus> {
        self.0.status().allowed_next()
    }
    /// Status changes, callbacks, check-ins, compensation attempts and tickets, oldest first.
    async fn timeline(&self, ctx: &Context<'_>) -> AppResult<Vec<TimelineEntry>> {
        let entries = loader(ctx)
            .load_one(OrderTimeline(self.0.id))
            .await
            .map_err(LoadError::into_app)?
            .unwrap_or_default();
        if !is_member(ctx) {
            return Ok(entries);
        }
        // Members: no tickets (staff's working material), no downstream error texts, no
        // worker names.
        Ok(entries
            .into_iter()
            .filter(|e| e.kind != "TICKET")
            .map(|mut e| {
                if e.kind == "COMPENSATION_ATTEMPT" {
                    if let Some((head, _)) = e.summary.split_once(": ") {
                        e.summary = head.to_string();
                    }
                    e.actor = "system".into();
                }
                e
            })
            .collect())
    }
    async fn callbacks(&self, ctx: &Context<'_>) -> AppResult<Vec<PaymentCallbackNode>> {
        Ok(loader(ctx)
            .load_one(OrderCallbacks(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(PaymentCallbackNode)
            .collect())
    }
    async fn compensation(&self, ctx: &Context<'_>) -> AppResult<Vec<CompensationEventNode>> {
        Ok(loader(ctx)
            .load_one(OrderCompensation(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(CompensationEventNode)
            .collect())
    }
    async fn tickets(&self, ctx: &Context<'_>) -> AppResult<Vec<ExceptionTicketNode>> {
        if request(ctx).viewer.as_ref().is_some_and(|v| v.role == Role::Member) {
            // Tickets are staff's working material, not the member's.
            return Ok(vec![]);
        }
        Ok(loader(ctx)
            .load_one(OrderTickets(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(ExceptionTicketNode)
            .collect())
    }
    async fn membership(&self, ctx: &Context<'_>) -> AppResult<Option<MembershipNode>> {
        Ok(loader(ctx)
            .load_one(OrderMembership(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .map(MembershipNode))
    }
}

pub struct ReconciliationRunNode(pub models::ReconciliationRun);

#[Object(name = "ReconciliationRun")]
impl ReconciliationRunNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn provider(&self) -> AppResult<PaymentProvider> {
        parse_or_internal(PaymentProvider::parse(&self.0.provider), "provider", &self.0.provider)
    }
    async fn bill_date(&self) -> Date {
        Date(self.0.bill_date)
    }
    async fn status(&self) -> AppResult<ReconciliationStatus> {
        parse_or_internal(
            ReconciliationStatus::parse(&self.0.status),
            "run status",
            &self.0.status,
        )
    }
    async fn started_at(&self) -> DateTime<Utc> {
        self.0.started_at
    }
    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at
    }
    async fn provider_rows(&self) -> i32 {
        self.0.provider_rows
    }
    async fn local_rows(&self) -> i32 {
        self.0.local_rows
    }
    async fn matched(&self) -> i32 {
        self.0.matched
    }
    async fn tickets_opened(&self) -> i32 {
        self.0.tickets_opened
    }
    async fn error(&self) -> Option<String> {
        self.0.error.as_deref().map(crate::error::public_text)
    }
}

#[derive(SimpleObject, Clone, Debug)]
pub struct AnomalyStat {
    pub category: AnomalyCategory,
    pub count: i32,
}

/// Calendar date, YYYY-MM-DD
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Date(pub NaiveDate);

#[async_graphql::Scalar(name = "Date")]
impl async_graphql::ScalarType for Date {
    fn parse(value: async_graphql::Value) -> async_graphql::InputValueResult<Self> {
        match &value {
            async_graphql::Value::String(s) => NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .map(Date)
                .map_err(|_| async_graphql::InputValueError::custom("expected a date YYYY-MM-DD")),
            _ => Err(async_graphql::InputValueError::expected_type(value)),
        }
    }
    fn to_value(&self) -> async_graphql::Value {
        async_graphql::Value::String(self.0.format("%Y-%m-%d").to_string())
    }
}

/// Which cashier the provider opens for the member. Without one: WECHAT_NATIVE for WECHAT_PAY, ALIPAY_QR for ALIPAY.
#[derive(Enum, Copy, Clone, Debug, PartialEq, Eq)]
#[graphql(remote = "crate::domain::payment::PayChannel")]
pub enum PayChannel {
    /// WeChat mini program or official account page: wx.requestPayment / WeixinJSBridge (JSAPI prepay)
    #[graphql(name = "WECHAT_JSAPI")]
    WechatJsapi,
    /// a QR code the member scans, e.g. at the front desk (Native prepay, code_url)
    #[graphql(name = "WECHAT_NATIVE")]
    WechatNative,
    /// the WeChat SDK inside a native app (APP prepay)
    #[graphql(name = "WECHAT_APP")]
    WechatApp,
    /// a mobile browser outside WeChat (H5 prepay, h5_url)
    #[graphql(name = "WECHAT_H5")]
    WechatH5,
    /// the Alipay SDK inside a native app (alipay.trade.app.pay order string)
    #[graphql(name = "ALIPAY_APP")]
    AlipayApp,
    /// a mobile browser (alipay.trade.wap.pay page)
    #[graphql(name = "ALIPAY_WAP")]
    AlipayWap,
    /// a QR code the member scans (alipay.trade.precreate qr_code)
    #[graphql(name = "ALIPAY_QR")]
    AlipayQr,
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
            provider: match p.provider {
                crate::domain::payment::Provider::WechatPay => PaymentProvider::WechatPay,
                crate::domain::payment::Provider::Alipay => PaymentProvider::Alipay,
            },
            out_trade_no: p.out_trade_no,
            amount_cents: super::int(p.amount_cents)?,
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
    async fn payment(&self) -> crate::error::AppResult<Option<PaymentInstruction>> {
        self.payment.clone()
    }
}

#[derive(SimpleObject)]
pub struct CheckInPayload {
    pub order: OrderNode,
    pub duplicate: bool,
    pub remaining_sessions: i32,
}

#[derive(SimpleObject, Clone, Debug)]
pub struct OrderStatusChange {
    pub order_no: String,
    pub from_status: Option<OrderStatus>,
    pub to_status: OrderStatus,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub trace_id: String,
}

/// One run of a periodic task (one tick, claimed by one instance).
pub struct TaskRunNode(pub models::TaskRun);

#[Object(name = "TaskRun")]
impl TaskRunNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn task(&self) -> &str {
        &self.0.task
    }
    async fn tick(&self) -> DateTime<Utc> {
        self.0.tick
    }
    /// RUNNING, SUCCEEDED or FAILED
    async fn status(&self) -> &str {
        &self.0.status
    }
    async fn instance(&self) -> &str {
        &self.0.instance
    }
    async fn started_at(&self) -> DateTime<Utc> {
        self.0.started_at
    }
    async fn finished_at(&self) -> Option<DateTime<Utc>> {
        self.0.finished_at
    }
    async fn rows_touched(&self) -> i32 {
        super::count(self.0.rows_touched)
    }
    async fn detail(&self) -> Option<String> {
        self.0.detail.as_deref().map(crate::error::public_text)
    }
}
