//! DataLoaders: one per request, batching the lookups of a whole response into one statement
//! per kind of related object.

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, Loader};
use async_graphql::Context;
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use super::types::{MemberNode, OrderNode, StoreNode};
use super::Reads;
use crate::db::models::*;
use crate::db::schema::*;
use crate::db::DbPool;
use crate::domain::OrderStatus;
use crate::error::AppError;

pub struct DbLoader {
    /// The request's reads: the primary, or the replica its `Reads` chose.
    reads: Arc<Reads>,
    /// What a page already loaded for its rows' fields (see [`Prefetched`]).
    prefetched: std::sync::Mutex<Prefetched>,
}

impl DbLoader {
    /// A loader reading the primary.
    pub fn new(pool: DbPool) -> DataLoader<DbLoader> {
        DbLoader::reading(Arc::new(Reads::primary(pool)))
    }

    /// A loader reading where the request's `reads` reads.
    pub fn reading(reads: Arc<Reads>) -> DataLoader<DbLoader> {
        // A slightly longer gathering window than the default 1 ms, so that a page of 100
        // orders resolving its nested fields still lands in one batch per kind.
        DataLoader::new(
            DbLoader {
                reads,
                prefetched: Default::default(),
            },
            tokio::spawn,
        )
        .delay(std::time::Duration::from_millis(3))
    }

    fn prefetched(&self) -> std::sync::MutexGuard<'_, Prefetched> {
        self.prefetched.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The relations of a page of orders, loaded by the `orders` query right after the page (the
/// page's ids in one statement per relation the document selects) instead of through a
/// DataLoader's gathering window. Only a query's page and a sign-in's member fill it (what it
/// holds was read after the request's one write, if any, and nothing changes it under the
/// request), and a field finds its rows here before it asks the loader.
#[derive(Default)]
pub struct Prefetched {
    members: HashMap<i64, Member>,
    stores: HashMap<i64, Store>,
    /// By order id; an order of the page without rows has an empty list.
    compensation: HashMap<i64, Vec<CompensationEvent>>,
    tickets: HashMap<i64, Vec<ExceptionTicket>>,
}

/// What of an order page's relations a document selects (`edges { node { … } }`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PageRelations {
    pub member: bool,
    pub store: bool,
    pub compensation: bool,
    pub tickets: bool,
}

impl PageRelations {
    pub fn any(&self) -> bool {
        self.member || self.store || self.compensation || self.tickets
    }
}

/// The compensation events of orders, for lists: every column but the payload, of which only
/// `orderNo` (all a `CompensationEvent` answers of it) is read.
const ORDER_COMPENSATION_SQL: &str = include_str!("order_compensation.sql");

async fn compensation_of(
    conn: &mut diesel_async::AsyncPgConnection,
    ids: &[i64],
) -> Result<Vec<CompensationEvent>, LoadError> {
    use diesel::sql_types::{Array, BigInt};
    Ok(crate::db::sql::StaticQuery::new(ORDER_COMPENSATION_SQL)
        .bind::<Array<BigInt>, _>(ids)
        .load(conn)
        .await?)
}

/// Loads the relations `rel` names of the orders `page` into the request's loader, one
/// statement per relation, on the connection the page was read on.
pub async fn prefetch_order_page(
    ctx: &Context<'_>,
    conn: &mut diesel_async::AsyncPgConnection,
    page: &[Order],
    rel: PageRelations,
) -> Result<(), AppError> {
    if page.is_empty() || !rel.any() {
        return Ok(());
    }
    let ids: Vec<i64> = page.iter().map(|o| o.id).collect();
    let mut got = Prefetched::default();
    if rel.member {
        let mut wanted: Vec<i64> = page.iter().map(|o| o.member_id).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let rows: Vec<Member> = members::table
            .filter(members::id.eq_any(wanted))
            .select(Member::as_select())
            .load(conn)
            .await?;
        got.members = rows.into_iter().map(|r| (r.id, r)).collect();
    }
    if rel.store {
        let mut wanted: Vec<i64> = page.iter().map(|o| o.store_id).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let rows: Vec<Store> = stores::table
            .filter(stores::id.eq_any(wanted))
            .select(Store::as_select())
            .load(conn)
            .await?;
        got.stores = rows.into_iter().map(|r| (r.id, r)).collect();
    }
    if rel.compensation {
        got.compensation = ids.iter().map(|id| (*id, vec![])).collect();
        for r in compensation_of(conn, &ids).await.map_err(LoadError::into_app)? {
            got.compensation
                .entry(r.order_id.unwrap_or_default())
                .or_default()
                .push(r);
        }
    }
    if rel.tickets {
        got.tickets = ids.iter().map(|id| (*id, vec![])).collect();
        let rows: Vec<ExceptionTicket> = exception_tickets::table
            .filter(exception_tickets::order_id.eq_any(&ids))
            .order(exception_tickets::id.asc())
            .select(ExceptionTicket::as_select())
            .load(conn)
            .await?;
        for r in rows {
            if let Some(order_id) = r.order_id {
                got.tickets.entry(order_id).or_default().push(r);
            }
        }
    }
    let mut held = loader(ctx).loader().prefetched();
    held.members.extend(got.members);
    held.stores.extend(got.stores);
    held.compensation.extend(got.compensation);
    held.tickets.extend(got.tickets);
    Ok(())
}

/// The compensation events of order `id` if its page loaded them (taken: an order is resolved
/// once per place in the response; another place asks the loader).
pub fn prefetched_compensation(ctx: &Context<'_>, id: i64) -> Option<Vec<CompensationEvent>> {
    loader(ctx).loader().prefetched().compensation.remove(&id)
}

/// The tickets of order `id` if its page loaded them (taken, as the compensation events).
pub fn prefetched_tickets(ctx: &Context<'_>, id: i64) -> Option<Vec<ExceptionTicket>> {
    loader(ctx).loader().prefetched().tickets.remove(&id)
}

/// A batch that could not be loaded, as the error it was (a busy pool stays UNAVAILABLE).
#[derive(Clone, Debug)]
pub struct LoadError(pub AppError);

impl LoadError {
    pub fn into_app(self) -> AppError {
        self.0
    }
}

impl From<AppError> for LoadError {
    fn from(e: AppError) -> Self {
        LoadError(e)
    }
}

impl From<diesel::result::Error> for LoadError {
    fn from(e: diesel::result::Error) -> Self {
        LoadError(e.into())
    }
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for LoadError {
    fn from(e: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        LoadError(e.into())
    }
}

pub fn loader<'a>(ctx: &Context<'a>) -> &'a DataLoader<DbLoader> {
    ctx.data_unchecked::<DataLoader<DbLoader>>()
}

macro_rules! key {
    ($($name:ident),*) => { $(#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)] pub struct $name(pub i64);)* };
}
key!(
    StoreId,
    MemberId,
    PlanId,
    OrderId,
    OrderCompensation,
    OrderTickets,
    OrderCallbacks,
    OrderMembership,
    MemberCredits,
    MemberMemberships,
    EventAttempts,
    OrderTimeline,
    OrderSaleTerms,
    StoreRules,
    CardFreezes,
    CardHistory
);

/// The prepaid rules of the stores of a response: one statement.
impl Loader<StoreRules> for DbLoader {
    type Value = crate::prepaid::StoreRules;
    type Error = LoadError;
    async fn load(&self, keys: &[StoreRules]) -> Result<HashMap<StoreRules, Self::Value>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let all = crate::prepaid::rules_of_stores(&mut conn, &ids).await?;
        Ok(all.into_iter().map(|(id, v)| (StoreRules(id), v)).collect())
    }
}

/// What the prepaid orders of a response kept of their stores' rules: one statement a page.
impl Loader<OrderSaleTerms> for DbLoader {
    type Value = crate::orders::SaleTerms;
    type Error = LoadError;
    async fn load(&self, keys: &[OrderSaleTerms]) -> Result<HashMap<OrderSaleTerms, Self::Value>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let all = crate::orders::sale_terms(&mut conn, &ids).await?;
        Ok(all.into_iter().map(|(id, v)| (OrderSaleTerms(id), v)).collect())
    }
}

/// The timelines of every order of a response: six statements for the whole page.
impl Loader<OrderTimeline> for DbLoader {
    type Value = Vec<crate::timeline::Entry>;
    type Error = LoadError;
    async fn load(&self, keys: &[OrderTimeline]) -> Result<HashMap<OrderTimeline, Self::Value>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let all = crate::timeline::for_orders(&mut conn, &ids).await?;
        Ok(all.into_iter().map(|(id, v)| (OrderTimeline(id), v)).collect())
    }
}

/// Loads rows by primary key into a map keyed by the loader's key type.
macro_rules! by_id {
    ($key:ident, $table:ident, $row:ty) => {
        impl Loader<$key> for DbLoader {
            type Value = $row;
            type Error = LoadError;
            async fn load(&self, keys: &[$key]) -> Result<HashMap<$key, $row>, LoadError> {
                let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
                let mut conn = self.reads.conn().await?;
                let rows: Vec<$row> = $table::table
                    .filter($table::id.eq_any(ids))
                    .select(<$row>::as_select())
                    .load(&mut conn)
                    .await?;
                Ok(rows.into_iter().map(|r| ($key(r.id), r)).collect())
            }
        }
    };
}
by_id!(StoreId, stores, Store);
by_id!(MemberId, members, Member);
by_id!(PlanId, membership_plans, MembershipPlan);
by_id!(OrderId, orders, Order);

/// Loads the rows belonging to each order (or event), oldest first.
macro_rules! many_by {
    ($key:ident, $table:ident, $col:ident, $row:ty, $conv:expr) => {
        impl Loader<$key> for DbLoader {
            type Value = Vec<$row>;
            type Error = LoadError;
            async fn load(&self, keys: &[$key]) -> Result<HashMap<$key, Vec<$row>>, LoadError> {
                let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
                let mut conn = self.reads.conn().await?;
                let rows: Vec<$row> = $table::table
                    .filter($table::$col.eq_any(ids))
                    .order($table::id.asc())
                    .select(<$row>::as_select())
                    .load(&mut conn)
                    .await?;
                let mut map: HashMap<$key, Vec<$row>> = HashMap::new();
                for r in rows {
                    let conv: fn(&$row) -> i64 = $conv;
                    map.entry($key(conv(&r))).or_default().push(r);
                }
                Ok(map)
            }
        }
    };
}
impl Loader<OrderCompensation> for DbLoader {
    type Value = Vec<CompensationEvent>;
    type Error = LoadError;
    async fn load(
        &self,
        keys: &[OrderCompensation],
    ) -> Result<HashMap<OrderCompensation, Vec<CompensationEvent>>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let mut map: HashMap<OrderCompensation, Vec<CompensationEvent>> = HashMap::new();
        for r in compensation_of(&mut conn, &ids).await? {
            map.entry(OrderCompensation(r.order_id.unwrap_or_default()))
                .or_default()
                .push(r);
        }
        Ok(map)
    }
}

many_by!(
    EventAttempts,
    compensation_attempts,
    event_id,
    CompensationAttempt,
    |r| r.event_id
);
many_by!(MemberMemberships, memberships, member_id, Membership, |r| r.member_id);
many_by!(CardFreezes, membership_freezes, membership_id, MembershipFreeze, |r| r
    .membership_id);
many_by!(CardHistory, membership_events, membership_id, MembershipEvent, |r| r
    .membership_id);

impl Loader<OrderTickets> for DbLoader {
    type Value = Vec<ExceptionTicket>;
    type Error = LoadError;
    async fn load(&self, keys: &[OrderTickets]) -> Result<HashMap<OrderTickets, Vec<ExceptionTicket>>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let rows: Vec<ExceptionTicket> = exception_tickets::table
            .filter(exception_tickets::order_id.eq_any(ids))
            .order(exception_tickets::id.asc())
            .select(ExceptionTicket::as_select())
            .load(&mut conn)
            .await?;
        let mut map: HashMap<OrderTickets, Vec<ExceptionTicket>> = HashMap::new();
        for r in rows {
            if let Some(order_id) = r.order_id {
                map.entry(OrderTickets(order_id)).or_default().push(r);
            }
        }
        Ok(map)
    }
}

impl Loader<OrderCallbacks> for DbLoader {
    type Value = Vec<PaymentCallback>;
    type Error = LoadError;
    async fn load(&self, keys: &[OrderCallbacks]) -> Result<HashMap<OrderCallbacks, Vec<PaymentCallback>>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let rows: Vec<PaymentCallback> = payment_callbacks::table
            .filter(payment_callbacks::order_id.eq_any(ids))
            .order(payment_callbacks::id.asc())
            .select(PaymentCallback::as_select())
            .load(&mut conn)
            .await?;
        let mut map: HashMap<OrderCallbacks, Vec<PaymentCallback>> = HashMap::new();
        for r in rows {
            if let Some(order_id) = r.order_id {
                map.entry(OrderCallbacks(order_id)).or_default().push(r);
            }
        }
        Ok(map)
    }
}

impl Loader<OrderMembership> for DbLoader {
    type Value = Membership;
    type Error = LoadError;
    async fn load(&self, keys: &[OrderMembership]) -> Result<HashMap<OrderMembership, Membership>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let rows: Vec<Membership> = memberships::table
            .filter(memberships::order_id.eq_any(ids))
            .select(Membership::as_select())
            .load(&mut conn)
            .await?;
        Ok(rows.into_iter().map(|r| (OrderMembership(r.order_id), r)).collect())
    }
}

/// A member's credits: the unused sessions of their live (PAID or CONSUMING) orders.
impl Loader<MemberCredits> for DbLoader {
    type Value = i32;
    type Error = LoadError;
    async fn load(&self, keys: &[MemberCredits]) -> Result<HashMap<MemberCredits, i32>, LoadError> {
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        let mut conn = self.reads.conn().await?;
        let rows: Vec<(i64, Option<i64>)> = orders::table
            .filter(orders::member_id.eq_any(ids))
            .filter(orders::status.eq_any([OrderStatus::Paid, OrderStatus::Consuming]))
            .group_by(orders::member_id)
            .select((
                orders::member_id,
                diesel::dsl::sum(orders::sessions_total - orders::sessions_used),
            ))
            .load(&mut conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(m, s)| (MemberCredits(m), s.unwrap_or(0) as i32))
            .collect())
    }
}

pub async fn load_store(ctx: &Context<'_>, id: i64) -> Result<StoreNode, AppError> {
    if let Some(s) = loader(ctx).loader().prefetched().stores.get(&id) {
        return Ok(StoreNode(s.clone()));
    }
    loader(ctx)
        .load_one(StoreId(id))
        .await
        .map_err(LoadError::into_app)?
        .map(StoreNode)
        .ok_or_else(|| AppError::NotFound(format!("store {id}")))
}

pub async fn load_member(ctx: &Context<'_>, id: i64) -> Result<MemberNode, AppError> {
    if let Some(m) = loader(ctx).loader().prefetched().members.get(&id) {
        return Ok(MemberNode(m.clone()));
    }
    loader(ctx)
        .load_one(MemberId(id))
        .await
        .map_err(LoadError::into_app)?
        .map(MemberNode)
        .ok_or_else(|| AppError::NotFound(format!("member {id}")))
}

/// The member a sign-in or a refresh answers for, read now, with their store when the document
/// selects it (`member { store { … } }`): one row each, asked for once, so two DataLoader
/// gathering windows one after the other (3 ms each) would be all of the wait.
pub async fn load_member_now(ctx: &Context<'_>, id: i64, with_store: bool) -> Result<MemberNode, AppError> {
    let mut conn = super::conn(ctx).await?;
    let member: Member = members::table
        .find(id)
        .select(Member::as_select())
        .first(&mut *conn)
        .await
        .optional()?
        .ok_or_else(|| AppError::NotFound(format!("member {id}")))?;
    if with_store {
        let store: Option<Store> = stores::table
            .find(member.store_id)
            .select(Store::as_select())
            .first(&mut *conn)
            .await
            .optional()?;
        if let Some(store) = store {
            loader(ctx).loader().prefetched().stores.insert(store.id, store);
        }
    }
    Ok(MemberNode(member))
}

pub async fn load_order(ctx: &Context<'_>, id: i64) -> Result<OrderNode, AppError> {
    loader(ctx)
        .load_one(OrderId(id))
        .await
        .map_err(LoadError::into_app)?
        .map(OrderNode)
        .ok_or_else(|| AppError::NotFound(format!("order {id}")))
}
