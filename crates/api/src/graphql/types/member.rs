//! Members, their wallets and memberships, stores, and who is asking.

use async_graphql::{Context, Object, SimpleObject, ID};
use chrono::{DateTime, Utc};

use super::super::loaders::*;
use super::super::{int, request, viewer};
use super::{MembershipPlanNode, MembershipStatus, OrderNode};
use crate::auth::PhoneView;
use crate::db::models;
use crate::error::{AppError, AppResult};
use crate::graphql::error::{GqlResult, IntoGqlResult};

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
    /// the business operator's 统一社会信用代码: prepaid limits count per member and operator
    async fn operator_code(&self) -> &str {
        &self.0.operator_code
    }
    async fn prepaid_rules(&self, ctx: &Context<'_>) -> GqlResult<super::PrepaidRulesNode> {
        let store = loader(ctx)
            .load_one(StoreRules(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .ok_or_else(|| AppError::NotFound(format!("store {}", self.0.id)))?;
        Ok((&store.rules).into())
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
        match PhoneView::of(request(ctx).viewer.as_ref()) {
            PhoneView::Masked => mask_phone(&self.0.phone),
            PhoneView::Whole => self.0.phone.clone(),
        }
    }
    async fn store(&self, ctx: &Context<'_>) -> GqlResult<StoreNode> {
        load_store(ctx, self.0.store_id).await.gql()
    }
    async fn wallet(&self) -> GqlResult<WalletNode> {
        Ok(WalletNode {
            balance_cents: int(self.0.balance_cents)?,
            frozen_cents: int(self.0.frozen_cents)?,
        })
    }
    /// Unused session credits over all paid orders
    async fn session_credits(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        Ok(loader(ctx)
            .load_one(MemberCredits(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or(0))
    }
    /// unused prepaid money with the operator of the member's store (orders and wallet)
    async fn prepaid_balance_cents(&self, ctx: &Context<'_>) -> GqlResult<i32> {
        let mut c = super::super::conn(ctx).await?;
        let tz = super::super::state(ctx).config.timezone;
        int(crate::prepaid::member_balance(&mut c, self.0.id, self.0.store_id, tz).await?).gql()
    }
    /// every movement of the wallet, newest first in write order: staff of the member's store
    /// (ops too) and the member themself
    #[graphql(complexity = "super::super::connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn wallet_entries(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<super::super::connection::Connection<super::WalletEntryNode>> {
        use super::super::connection;
        let v = viewer(ctx)?;
        if !v.sees_owned(self.0.id, self.0.store_id) {
            return Err(AppError::Forbidden(format!("the wallet of member {} is not yours to read", self.0.id)).into());
        }
        let first = connection::page_size(first)?;
        let after = after.as_deref().map(connection::decode_cursor).transpose()?;
        let mut c = super::super::conn(ctx).await?;
        let total = if ctx.look_ahead().field("totalCount").exists() {
            crate::wallet::entry_count(&mut c, self.0.id).await?
        } else {
            0
        };
        let rows = crate::wallet::entries(&mut c, self.0.id, after, first + 1).await?;
        Ok(connection::build(
            rows,
            first,
            after,
            total,
            |r| r.id,
            super::WalletEntryNode,
        ))
    }
    async fn memberships(&self, ctx: &Context<'_>) -> GqlResult<Vec<MembershipNode>> {
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

/// A member reached through another object (an order, a membership): a store-limited admin
/// sees only members of their stores; anyone else is refused with FORBIDDEN.
pub(super) async fn scoped_member(ctx: &Context<'_>, id: i64) -> AppResult<MemberNode> {
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
    async fn role(&self, ctx: &Context<'_>) -> GqlResult<&'static str> {
        Ok(viewer(ctx)?.role.as_str())
    }
    async fn subject(&self, ctx: &Context<'_>) -> GqlResult<String> {
        Ok(viewer(ctx)?.subject.clone())
    }
    async fn member(&self, ctx: &Context<'_>) -> GqlResult<Option<MemberNode>> {
        match viewer(ctx)?.member_id {
            Some(id) => load_member(ctx, id).await.map(Some).gql(),
            None => Ok(None),
        }
    }
}

pub struct MembershipNode(pub models::Membership);

#[Object(name = "Membership")]
impl MembershipNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn status(&self) -> MembershipStatus {
        self.0.status.into()
    }
    async fn valid_from(&self) -> DateTime<Utc> {
        self.0.valid_from
    }
    async fn valid_to(&self) -> DateTime<Utc> {
        self.0.valid_to
    }
    async fn member(&self, ctx: &Context<'_>) -> GqlResult<MemberNode> {
        scoped_member(ctx, self.0.member_id).await.gql()
    }
    async fn plan(&self, ctx: &Context<'_>) -> GqlResult<MembershipPlanNode> {
        loader(ctx)
            .load_one(PlanId(self.0.plan_id))
            .await
            .map_err(|e| e.into_app())?
            .map(MembershipPlanNode)
            .ok_or_else(|| AppError::NotFound("plan".into()))
            .gql()
    }
    async fn order(&self, ctx: &Context<'_>) -> GqlResult<OrderNode> {
        load_order(ctx, self.0.order_id).await.gql()
    }
    /// days frozen so far, over all freezes
    async fn frozen_days(&self) -> i32 {
        self.0.frozen_days
    }
    async fn freezes(&self, ctx: &Context<'_>) -> GqlResult<Vec<MembershipFreezeNode>> {
        Ok(loader(ctx)
            .load_one(CardFreezes(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(MembershipFreezeNode)
            .collect())
    }
    async fn history(&self, ctx: &Context<'_>) -> GqlResult<Vec<MembershipEventNode>> {
        Ok(loader(ctx)
            .load_one(CardHistory(self.0.id))
            .await
            .map_err(|e| e.into_app())?
            .unwrap_or_default()
            .into_iter()
            .map(MembershipEventNode)
            .collect())
    }
}

pub struct MembershipFreezeNode(pub models::MembershipFreeze);

#[Object(name = "MembershipFreeze")]
impl MembershipFreezeNode {
    async fn id(&self) -> ID {
        ID(self.0.id.to_string())
    }
    async fn from(&self) -> super::Date {
        super::Date(self.0.from_date)
    }
    /// the first day no longer frozen
    async fn until(&self) -> super::Date {
        super::Date(self.0.until_date)
    }
    /// set when ended early
    async fn ended_at(&self) -> Option<DateTime<Utc>> {
        self.0.ended_at
    }
    async fn reason(&self) -> &str {
        &self.0.reason
    }
    async fn actor(&self) -> &str {
        &self.0.actor
    }
}

pub struct MembershipEventNode(pub models::MembershipEvent);

#[Object(name = "MembershipEvent")]
impl MembershipEventNode {
    async fn at(&self) -> DateTime<Utc> {
        self.0.at
    }
    async fn kind(&self) -> super::MembershipEventKind {
        self.0.kind.into()
    }
    async fn actor(&self) -> &str {
        &self.0.actor
    }
    async fn reason(&self) -> Option<&str> {
        self.0.reason.as_deref()
    }
    async fn summary(&self) -> &str {
        &self.0.summary
    }
    async fn trace_id(&self) -> &str {
        &self.0.trace_id
    }
    /// TRANSFERRED: the holders
    async fn from_member(&self, ctx: &Context<'_>) -> GqlResult<Option<MemberNode>> {
        match self.0.from_member_id {
            Some(id) => holder(ctx, id).await.gql(),
            None => Ok(None),
        }
    }
    async fn to_member(&self, ctx: &Context<'_>) -> GqlResult<Option<MemberNode>> {
        match self.0.to_member_id {
            Some(id) => holder(ctx, id).await.gql(),
            None => Ok(None),
        }
    }
}

/// A holder named by a card's history: the member themself (who may see the card's history,
/// as it is theirs now) sees only their own id; another holder is there for staff of their
/// stores. Someone the caller may not see is left out (null), not an error.
async fn holder(ctx: &Context<'_>, id: i64) -> AppResult<Option<MemberNode>> {
    let m = load_member(ctx, id).await?;
    Ok(match request(ctx).viewer.as_ref() {
        Some(v) if v.sees_owned(m.0.id, m.0.store_id) => Some(m),
        _ => None,
    })
}
