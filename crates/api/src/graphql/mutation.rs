//! Mutations: the member app's orders and check-ins, the admin console's catalog, money and
//! refunds, the ops screen's replays.

use async_graphql::{Context, InputObject, Object, OneofObject, ID};
use chrono::{DateTime, Utc};

use super::types::*;
use super::{actor_ctx, conn, parse_id, request, state, viewer};
use crate::auth::Role;
use crate::catalog;
use crate::db::DbConn;
use crate::domain;
use crate::error::{AppError, AppResult};
use crate::graphql::error::{GqlResult, IntoGqlResult};
use crate::orders::{self, PlaceOrder, PlacedItem};
use crate::payments::{self, trades};

pub struct Mutation;

/// Exactly one field is set.
#[derive(OneofObject)]
#[allow(clippy::enum_variant_names)] // the names are the contract's
pub enum OrderItemInput {
    MembershipPlanId(ID),
    ClassPackId(ID),
    CoachSlotId(ID),
}

#[derive(InputObject)]
pub struct PlaceOrderInput {
    /// client-made key: the same key returns the same order instead of a second one
    pub idempotency_key: String,
    pub store_id: ID,
    pub item: OrderItemInput,
    pub payment_method: PaymentMethod,
    /// MIXED only: the part taken (frozen) from the wallet
    pub wallet_amount_cents: Option<i32>,
    /// admins placing an order for a member
    pub member_id: Option<ID>,
    /// MIXED only: who takes the online part (default WECHAT_PAY; `channel` decides when given)
    pub online_provider: Option<PaymentProvider>,
    /// online part: the cashier to open (it also picks the provider of a MIXED order)
    pub channel: Option<PayChannel>,
    /// WECHAT_JSAPI: the member's openid under WECHATPAY_APP_ID; remembered on the member once given
    pub wechat_open_id: Option<String>,
    /// the version of the store's terms the member accepted (required when the store asks for terms)
    pub accepted_terms_version: Option<String>,
}

#[derive(InputObject)]
pub struct CheckInInput {
    pub order_no: String,
    /// the venue's consumption serial number
    pub consume_txn_no: String,
    #[graphql(default = 1)]
    pub sessions: Option<i32>,
}

#[derive(InputObject)]
pub struct CreateStoreInput {
    pub name: String,
    pub code: String,
    /// default: code
    pub operator_code: Option<String>,
}

#[derive(InputObject)]
pub struct UpdateStoreInput {
    pub name: Option<String>,
    pub operator_code: Option<String>,
}

#[derive(InputObject)]
pub struct CreateMemberInput {
    pub store_id: ID,
    pub name: String,
    pub phone: String,
}

#[derive(InputObject)]
pub struct CreateMembershipPlanInput {
    pub store_id: ID,
    pub name: String,
    pub duration_days: i32,
    pub price_cents: i32,
    /// default 30
    pub max_freeze_days: Option<i32>,
    /// default 3
    pub max_freezes: Option<i32>,
}

#[derive(InputObject)]
pub struct CreateClassPackInput {
    pub store_id: ID,
    pub name: String,
    pub sessions: i32,
    pub price_cents: i32,
    /// null: unlimited
    pub stock: Option<i32>,
}

#[derive(InputObject)]
pub struct CreateCoachSlotInput {
    pub store_id: ID,
    pub coach_name: String,
    pub starts_at: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub capacity: i32,
    pub price_cents: i32,
}

/// The change's result, with a refused status change counted (`anomalyStats`).
async fn noted<T>(ctx: &Context<'_>, c: &mut DbConn, order_no: &str, r: AppResult<T>) -> AppResult<T> {
    crate::anomalies::note_refused(c, order_no, &request(ctx).trace, r).await
}

/// Longest ticket note (refused above, not cut).
const MAX_NOTE_CHARS: usize = 2000;

fn require_admin<'a>(ctx: &Context<'a>) -> AppResult<&'a crate::auth::Viewer> {
    let v = viewer(ctx)?;
    v.require(&[Role::Admin])?;
    Ok(v)
}

/// An admin of the whole chain (not limited to stores): stores' operators, prepaid rules, the
/// business calendar.
fn require_chain_admin<'a>(ctx: &Context<'a>, what: &str) -> AppResult<&'a crate::auth::Viewer> {
    let v = require_admin(ctx)?;
    if v.store_scope().is_some() {
        return Err(AppError::Forbidden(format!("store-limited staff may not {what}")));
    }
    Ok(v)
}

#[Object]
impl Mutation {
    async fn place_order(&self, ctx: &Context<'_>, input: PlaceOrderInput) -> GqlResult<PlaceOrderPayload> {
        let v = viewer(ctx)?;
        orders::check_place_rate(&state(ctx).placing, v)?;
        let actx = actor_ctx(ctx)?;
        let item = match &input.item {
            OrderItemInput::MembershipPlanId(id) => PlacedItem::MembershipPlan(parse_id(id, "membershipPlanId")?),
            OrderItemInput::ClassPackId(id) => PlacedItem::ClassPack(parse_id(id, "classPackId")?),
            OrderItemInput::CoachSlotId(id) => PlacedItem::CoachSlot(parse_id(id, "coachSlotId")?),
        };
        let method = domain::PaymentMethod::from(input.payment_method);
        let channel = input.channel.map(domain::PayChannel::from);
        let legacy = input.online_provider.map(domain::Provider::from);
        let provider = trades::online_provider(method, channel, legacy)?;
        let openid = input.wechat_open_id.as_deref().map(trades::check_openid).transpose()?;
        let member_id = input.member_id.as_ref().map(|m| parse_id(m, "memberId")).transpose()?;
        let req = PlaceOrder {
            idempotency_key: input.idempotency_key,
            store_id: parse_id(&input.store_id, "storeId")?,
            item,
            payment_method: method,
            wallet_amount_cents: input.wallet_amount_cents.map(i64::from),
            member_id,
            online_provider: provider,
            accepted_terms_version: input.accepted_terms_version,
        };
        let st = state(ctx);
        let mut c = conn(ctx).await?;
        if let (Some(p), Some(payer)) = (provider, member_id.or(v.member_id)) {
            trades::check_payable(st, &mut c, p, channel.unwrap_or(p.default_channel()), payer, openid).await?;
            trades::check_payer_ip(channel.unwrap_or(p.default_channel()), request(ctx).payer_ip.as_deref())?;
        }
        let order = orders::place_order(&mut c, &st.config, v, req, &actx).await?;
        drop(c);
        let payment = if order.status == domain::OrderStatus::WaitPay && order.online_cents() > 0 {
            let r = request(ctx);
            trades::start_payment(st, &order, channel, openid, r.payer_ip.as_deref(), &r.trace)
                .await
                .and_then(|p| Ok(Some(p.try_into()?)))
        } else {
            Ok(None)
        };
        Ok(PlaceOrderPayload {
            payment,
            order: OrderNode(order),
        })
    }

    /// fresh payment instructions for one's own WAIT_PAY order: another channel, or the first ones lapsed
    async fn start_payment(
        &self,
        ctx: &Context<'_>,
        order_no: String,
        channel: PayChannel,
        wechat_open_id: Option<String>,
    ) -> GqlResult<PaymentInstruction> {
        let v = viewer(ctx)?;
        v.require(&[Role::Member, Role::Admin])?;
        let order = {
            let mut c = conn(ctx).await?;
            orders::find_order(&mut c, &order_no)
                .await?
                .filter(|o| orders::viewer_sees_order(v, o))
                .ok_or_else(|| AppError::NotFound(format!("order {order_no}")))?
        };
        let openid = wechat_open_id.as_deref().map(trades::check_openid).transpose()?;
        let r = request(ctx);
        let started = trades::start_payment(
            state(ctx),
            &order,
            Some(channel.into()),
            openid,
            r.payer_ip.as_deref(),
            &r.trace,
        )
        .await?;
        Ok(started.try_into()?)
    }

    /// Cancels a waiting order: members their own, staff any of their stores'.
    async fn cancel_order(&self, ctx: &Context<'_>, order_no: String, reason: Option<String>) -> GqlResult<OrderNode> {
        let v = viewer(ctx)?;
        v.require(&[Role::Member, Role::Admin])?;
        let actx = actor_ctx(ctx)?;
        let reason = reason
            .map(|r| r.trim().chars().take(500).collect::<String>())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| format!("canceled by {}", v.role.as_str()));
        if reason == domain::TIMEOUT_REASON {
            return Err(AppError::bad(format!(
                "{} is the reason of expired orders only",
                domain::TIMEOUT_REASON
            ))
            .into());
        }
        // The trade is closed at the provider first; found paid meanwhile, the order is PAID.
        let r = payments::closing::cancel_order(state(ctx), v, &order_no, &reason, &actx).await;
        let mut c = conn(ctx).await?;
        noted(ctx, &mut c, &order_no, r).await.map(OrderNode).gql()
    }

    async fn check_in(&self, ctx: &Context<'_>, input: CheckInInput) -> GqlResult<CheckInPayload> {
        let v = viewer(ctx)?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        let r = orders::check_in(
            &mut c,
            v,
            &input.order_no,
            &input.consume_txn_no,
            input.sessions.unwrap_or(1),
            &actx,
        )
        .await;
        let out = noted(ctx, &mut c, &input.order_no, r).await?;
        Ok(CheckInPayload {
            order: OrderNode(out.order),
            duplicate: out.duplicate,
            remaining_sessions: out.remaining_sessions,
        })
    }

    async fn create_store(&self, ctx: &Context<'_>, input: CreateStoreInput) -> GqlResult<StoreNode> {
        let v = require_admin(ctx)?;
        if v.store_scope().is_some() {
            return Err(AppError::Forbidden("store-limited staff may not open stores".into()).into());
        }
        let mut c = conn(ctx).await?;
        Ok(StoreNode(
            catalog::create_store(&mut c, &input.name, &input.code, input.operator_code.as_deref()).await?,
        ))
    }

    /// chain-wide admins: a store's name and business operator
    async fn update_store(&self, ctx: &Context<'_>, id: ID, input: UpdateStoreInput) -> GqlResult<StoreNode> {
        require_chain_admin(ctx, "change stores")?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        Ok(StoreNode(
            catalog::update_store(&mut c, id, input.name.as_deref(), input.operator_code.as_deref()).await?,
        ))
    }

    /// chain-wide admins: the prepaid rules a store sells under
    async fn set_prepaid_rules(
        &self,
        ctx: &Context<'_>,
        store_id: ID,
        input: PrepaidRulesInput,
    ) -> GqlResult<StoreNode> {
        require_chain_admin(ctx, "set prepaid rules")?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&store_id, "storeId")?;
        let mut c = conn(ctx).await?;
        crate::prepaid::set_rules(&mut c, id, &input.into(), &actx).await?;
        Ok(StoreNode(catalog::require_store(&mut c, id).await?))
    }

    /// chain-wide admins: working days and holidays; answers how many dates were set
    async fn set_business_days(&self, ctx: &Context<'_>, days: Vec<BusinessDayInput>) -> GqlResult<i32> {
        require_chain_admin(ctx, "set the business calendar")?;
        let actx = actor_ctx(ctx)?;
        let days = days
            .into_iter()
            .map(|d| crate::prepaid::calendar::SetDay {
                date: d.date.0,
                working: d.working,
                note: d.note,
            })
            .collect();
        let mut c = conn(ctx).await?;
        crate::prepaid::calendar::set_days(&mut c, days, &actx).await.gql()
    }

    /// the member for their own order, or staff: the whole amount back within the cooling-off period
    async fn request_cooling_off_refund(&self, ctx: &Context<'_>, order_no: String) -> GqlResult<OrderNode> {
        let v = viewer(ctx)?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        let r = orders::request_cooling_off_refund(&mut c, &state(ctx).config, v, &order_no, &actx).await;
        noted(ctx, &mut c, &order_no, r).await.map(OrderNode).gql()
    }

    /// the member for their own card, or staff
    async fn freeze_membership(
        &self,
        ctx: &Context<'_>,
        id: ID,
        from: Date,
        days: i32,
        reason: String,
    ) -> GqlResult<MembershipNode> {
        let v = viewer(ctx)?;
        let id = parse_id(&id, "id")?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        Ok(MembershipNode(
            crate::memberships::freeze(&mut c, &state(ctx).config, v, id, from.0, days, &reason, &actx).await?,
        ))
    }

    /// ends a running or scheduled freeze now
    async fn unfreeze_membership(&self, ctx: &Context<'_>, id: ID) -> GqlResult<MembershipNode> {
        let v = viewer(ctx)?;
        let id = parse_id(&id, "id")?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        Ok(MembershipNode(
            crate::memberships::unfreeze(&mut c, &state(ctx).config, v, id, &actx).await?,
        ))
    }

    /// staff: the card and its remaining validity to another member; the fee from the old holder's wallet
    async fn transfer_membership(
        &self,
        ctx: &Context<'_>,
        id: ID,
        to_member_id: ID,
        #[graphql(default = 0)] fee_cents: Option<i32>,
        reason: String,
    ) -> GqlResult<MembershipNode> {
        let v = require_admin(ctx)?;
        let id = parse_id(&id, "id")?;
        let to = parse_id(&to_member_id, "toMemberId")?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        Ok(MembershipNode(
            crate::memberships::transfer(
                &mut c,
                &state(ctx).config,
                v,
                id,
                to,
                i64::from(fee_cents.unwrap_or(0)),
                &reason,
                &actx,
            )
            .await?,
        ))
    }

    async fn create_member(&self, ctx: &Context<'_>, input: CreateMemberInput) -> GqlResult<MemberNode> {
        let v = require_admin(ctx)?;
        let store = parse_id(&input.store_id, "storeId")?;
        v.require_store(store)?;
        let mut c = conn(ctx).await?;
        Ok(MemberNode(
            catalog::create_member(&mut c, store, &input.name, &input.phone).await?,
        ))
    }

    async fn create_membership_plan(
        &self,
        ctx: &Context<'_>,
        input: CreateMembershipPlanInput,
    ) -> GqlResult<MembershipPlanNode> {
        let v = require_admin(ctx)?;
        let store = parse_id(&input.store_id, "storeId")?;
        v.require_store(store)?;
        let mut c = conn(ctx).await?;
        Ok(MembershipPlanNode(
            catalog::create_membership_plan(
                &mut c,
                store,
                &input.name,
                input.duration_days,
                input.price_cents,
                catalog::FreezeLimits {
                    max_freeze_days: input.max_freeze_days,
                    max_freezes: input.max_freezes,
                },
            )
            .await?,
        ))
    }

    async fn create_class_pack(&self, ctx: &Context<'_>, input: CreateClassPackInput) -> GqlResult<ClassPackNode> {
        let v = require_admin(ctx)?;
        let store = parse_id(&input.store_id, "storeId")?;
        v.require_store(store)?;
        let mut c = conn(ctx).await?;
        Ok(ClassPackNode(
            catalog::create_class_pack(
                &mut c,
                store,
                &input.name,
                input.sessions,
                input.price_cents,
                input.stock,
            )
            .await?,
        ))
    }

    /// admins: a plan's name, price, freezing limits, for orders placed from now on
    async fn update_membership_plan(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateMembershipPlanInput,
    ) -> GqlResult<MembershipPlanNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let change = catalog::PlanChange {
            name: input.name,
            price_cents: input.price_cents,
            max_freeze_days: input.max_freeze_days,
            max_freezes: input.max_freezes,
        };
        let mut c = conn(ctx).await?;
        catalog::update_membership_plan(&mut c, v, id, change, &actx)
            .await
            .map(MembershipPlanNode)
            .gql()
    }

    /// admins: the plan is sold no more (kept on the orders that bought it)
    async fn retire_membership_plan(&self, ctx: &Context<'_>, id: ID) -> GqlResult<MembershipPlanNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        catalog::retire_membership_plan(&mut c, v, id, &actx)
            .await
            .map(MembershipPlanNode)
            .gql()
    }

    /// admins: a class pack's name, price, stock, for orders placed from now on
    async fn update_class_pack(
        &self,
        ctx: &Context<'_>,
        id: ID,
        input: UpdateClassPackInput,
    ) -> GqlResult<ClassPackNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let stock = match (input.stock, input.unlimited_stock) {
            (Some(_), Some(true)) => {
                return Err(AppError::bad("stock and unlimitedStock: true exclude each other").into());
            }
            (Some(n), _) => Some(catalog::StockChange::Units(n)),
            (None, Some(true)) => Some(catalog::StockChange::Unlimited),
            (None, _) => None,
        };
        let change = catalog::PackChange {
            name: input.name,
            price_cents: input.price_cents,
            stock,
        };
        let mut c = conn(ctx).await?;
        catalog::update_class_pack(&mut c, v, id, change, &actx)
            .await
            .map(ClassPackNode)
            .gql()
    }

    /// admins: the class pack is sold no more (kept on the orders that bought it)
    async fn retire_class_pack(&self, ctx: &Context<'_>, id: ID) -> GqlResult<ClassPackNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        catalog::retire_class_pack(&mut c, v, id, &actx)
            .await
            .map(ClassPackNode)
            .gql()
    }

    async fn create_coach_slot(&self, ctx: &Context<'_>, input: CreateCoachSlotInput) -> GqlResult<CoachSlotNode> {
        let v = require_admin(ctx)?;
        let store = parse_id(&input.store_id, "storeId")?;
        v.require_store(store)?;
        let mut c = conn(ctx).await?;
        Ok(CoachSlotNode(
            catalog::create_coach_slot(
                &mut c,
                store,
                &input.coach_name,
                input.starts_at,
                input.ends_at,
                input.capacity,
                input.price_cents,
            )
            .await?,
        ))
    }

    /// staff: a coach's session is off; every order booked on it is canceled or refunded whole
    async fn cancel_coach_slot(&self, ctx: &Context<'_>, id: ID, reason: String) -> GqlResult<CancelCoachSlotPayload> {
        let v = require_admin(ctx)?;
        let slot = parse_id(&id, "id")?;
        let actx = actor_ctx(ctx)?;
        let canceled = crate::slot_cancel::cancel(state(ctx), v, slot, &reason, &actx).await?;
        Ok(canceled.into())
    }

    /// Adds money to a member's wallet; the reference makes it idempotent.
    async fn top_up_wallet(
        &self,
        ctx: &Context<'_>,
        member_id: ID,
        amount_cents: i32,
        reference: String,
    ) -> GqlResult<MemberNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&member_id, "memberId")?;
        let mut c = conn(ctx).await?;
        let member = super::loaders::load_member(ctx, id).await?;
        v.require_store(member.0.store_id)?;
        Ok(MemberNode(
            crate::wallet::top_up(&mut c, id, amount_cents, &reference, state(ctx).config.timezone, &actx).await?,
        ))
    }

    async fn confirm_offline_payment(
        &self,
        ctx: &Context<'_>,
        order_no: String,
        reference: String,
    ) -> GqlResult<OrderNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        let r = orders::confirm_offline_payment(&mut c, &state(ctx).config, v, &order_no, &reference, &actx).await;
        noted(ctx, &mut c, &order_no, r).await.map(OrderNode).gql()
    }

    async fn refund_order(
        &self,
        ctx: &Context<'_>,
        order_no: String,
        reason: String,
        amount_cents: Option<i32>,
    ) -> GqlResult<OrderNode> {
        let v = require_admin(ctx)?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        let r = orders::refund_order(
            &mut c,
            &state(ctx).config,
            v,
            &order_no,
            &reason,
            amount_cents.map(i64::from),
            &actx,
        )
        .await;
        noted(ctx, &mut c, &order_no, r).await.map(OrderNode).gql()
    }

    /// Sends a DEAD event back to the queue (admin and ops).
    async fn replay_compensation(&self, ctx: &Context<'_>, id: ID) -> GqlResult<CompensationEventNode> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        let more = state(ctx).config.max_attempts;
        Ok(CompensationEventNode(
            crate::compensation::replay_seen_by(&mut c, v, id, &actx, more).await?,
        ))
    }

    /// Replays DEAD events, or those of one order, oldest first and at most 500 per call;
    /// returns how many it replayed (call again until it answers 0).
    async fn replay_dead_compensations(&self, ctx: &Context<'_>, order_no: Option<String>) -> GqlResult<i32> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let actx = actor_ctx(ctx)?;
        let mut c = conn(ctx).await?;
        let order_id = match &order_no {
            Some(no) => {
                let o = orders::find_order(&mut c, no)
                    .await?
                    .filter(|o| orders::viewer_sees_order(v, o))
                    .ok_or_else(|| AppError::NotFound(format!("order {no}")))?;
                Some(o.id)
            }
            None => None,
        };
        let more = state(ctx).config.max_attempts;
        crate::compensation::replay_dead(&mut c, order_id, v.store_scope(), &actx, more)
            .await
            .gql()
    }

    /// Closes a ticket with an action (admin and ops; actions that move money or orders still
    /// ask the state machine for the caller's role).
    async fn resolve_ticket(
        &self,
        ctx: &Context<'_>,
        id: ID,
        action: TicketAction,
        note: Option<String>,
        #[graphql(desc = "REFUND of the order's own payment: this amount instead of the unused share")]
        amount_cents: Option<i32>,
    ) -> GqlResult<ExceptionTicketNode> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        if note.as_ref().is_some_and(|n| n.chars().count() > MAX_NOTE_CHARS) {
            return Err(AppError::bad(format!("note must be at most {MAX_NOTE_CHARS} characters")).into());
        }
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        let t = crate::ticket_resolution::resolve(
            &mut c,
            &state(ctx).config,
            v,
            id,
            action.into(),
            note.as_deref(),
            amount_cents.map(i64::from),
            &actx,
        )
        .await?;
        Ok(ExceptionTicketNode(t))
    }

    /// Takes a ticket: OPEN -> IN_PROGRESS.
    async fn start_ticket(&self, ctx: &Context<'_>, id: ID) -> GqlResult<ExceptionTicketNode> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let actx = actor_ctx(ctx)?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        Ok(ExceptionTicketNode(crate::tickets::start(&mut c, id, v, &actx).await?))
    }

    /// sign-in (no token needed): a WeChat mini-program wx.login code; a first sign-in also needs phoneCode (getPhoneNumber) and, for a new member, storeId
    async fn sign_in_with_wechat(
        &self,
        ctx: &Context<'_>,
        code: String,
        phone_code: Option<String>,
        store_id: Option<ID>,
    ) -> GqlResult<SessionNode> {
        let store = store_id.as_ref().map(|s| parse_id(s, "storeId")).transpose()?;
        let r = request(ctx);
        crate::sessions::sign_in_with_wechat(state(ctx), r.client_addr, &code, phone_code.as_deref(), store)
            .await
            .map(SessionNode)
            .gql()
    }

    /// a new access token and a new refresh token for a refresh token (no token needed); the old one is spent
    async fn refresh_session(&self, ctx: &Context<'_>, refresh_token: String) -> GqlResult<SessionNode> {
        crate::sessions::refresh(state(ctx), request(ctx).client_addr, &refresh_token)
            .await
            .map(SessionNode)
            .gql()
    }

    /// ends the session the refresh token belongs to
    async fn sign_out(&self, ctx: &Context<'_>, refresh_token: String) -> GqlResult<bool> {
        crate::sessions::sign_out(state(ctx), request(ctx).client_addr, &refresh_token)
            .await
            .gql()
    }

    /// Reconciles a provider's bill of one business day now (from FITORDER_STATEMENT_DIR).
    async fn run_reconciliation(
        &self,
        ctx: &Context<'_>,
        provider: PaymentProvider,
        date: Date,
    ) -> GqlResult<ReconciliationRunNode> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin])?;
        // A provider's bill covers every store of the chain.
        if v.store_scope().is_some() {
            return Err(
                AppError::Forbidden("store-limited staff may not run the chain-wide reconciliation".into()).into(),
            );
        }
        let trace = request(ctx).trace.clone();
        let run = crate::reconciliation::run(state(ctx), provider.into(), date.0, None, &trace).await?;
        Ok(ReconciliationRunNode(run))
    }
}
