//! Queries: the admin console's views, the member app's own data, the ops screen's lists.

use async_graphql::{Context, InputObject, Object, ID};
use chrono::{DateTime, Utc};
use diesel::dsl::sql;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::sql_types::Bool;
use diesel_async::RunQueryDsl;

use super::connection::{self, decode_cursor, page_size, Connection};
use super::loaders::{load_member, prefetch_order_page, PageRelations};
use super::outbox::{CompensationKind, CompensationStatus};
use super::types::*;
use super::{conn, parse_id, state, viewer};
use crate::auth::Role;
use crate::db::models;
use crate::db::schema::*;
use crate::domain;
use crate::error::{AppError, AppResult};
use crate::graphql::error::GqlResult;

pub struct Query;

#[derive(InputObject, Default)]
pub struct OrderFilter {
    pub status: Option<Vec<OrderStatus>>,
    pub store_id: Option<ID>,
    pub member_id: Option<ID>,
    pub is_expired: Option<bool>,
    pub created_from: Option<DateTime<Utc>>,
    pub created_to: Option<DateTime<Utc>>,
    pub order_no: Option<String>,
}

#[derive(InputObject, Default)]
pub struct MembershipFilter {
    pub member_id: Option<ID>,
    pub store_id: Option<ID>,
    pub status: Option<Vec<MembershipStatus>>,
}

#[derive(InputObject, Default)]
pub struct TicketFilter {
    pub status: Option<Vec<TicketStatus>>,
    pub kind: Option<Vec<TicketKind>>,
    pub store_id: Option<ID>,
    pub order_no: Option<String>,
}

#[derive(InputObject, Default)]
pub struct CompensationFilter {
    pub status: Option<Vec<CompensationStatus>>,
    pub kind: Option<Vec<CompensationKind>>,
    pub order_no: Option<String>,
}

/// One page of a connection: the total under the filter, then `first + 1` rows after the cursor,
/// newest first (the extra row tells whether there is a next page). The total is counted only
/// when the document selects `totalCount` (0 in its place otherwise, never read). `@rows` hands
/// the rows and the total to an expression of the caller's instead of building the connection.
macro_rules! page {
    ($ctx:ident, $c:ident, $make:ident, $table:ident, $model:ident, $node:ident, $first:ident, $after:ident) => {{
        page!(@rows $ctx, $c, $make, $table, $model, $first, $after, |rows, total| Ok(connection::build(rows, $first, $after, total, |r| r.id, $node)))
    }};
    (@rows $ctx:ident, $c:ident, $make:ident, $table:ident, $model:ident, $first:ident, $after:ident, |$rows:ident, $total:ident| $then:expr) => {{
        let $total: i64 = if $ctx.look_ahead().field("totalCount").exists() {
            $make()?.count().get_result(&mut $c).await?
        } else {
            0
        };
        let mut page = $make()?;
        if let Some(id) = $after {
            page = page.filter($table::id.lt(id));
        }
        let rows: Vec<models::$model> = page
            .order($table::id.desc())
            .limit($first + 1)
            .select(models::$model::as_select())
            .load(&mut $c)
            .await?;
        let $rows = rows;
        $then
    }};
}

/// Runs (reconciliation, periodic tasks) and their statistics cover the whole chain: a
/// store-limited admin is refused them, as `runReconciliation` refuses them.
fn require_chain_wide(v: &crate::auth::Viewer) -> AppResult<()> {
    if v.store_scope().is_some() {
        return Err(AppError::Forbidden(
            "store-limited staff may not read the chain-wide runs".into(),
        ));
    }
    Ok(())
}

#[Object]
impl Query {
    async fn me(&self, ctx: &Context<'_>) -> GqlResult<ViewerNode> {
        viewer(ctx)?;
        Ok(ViewerNode)
    }

    /// What a store sells now: its plans and class packs not retired, and coach slots that have
    /// not started (nor been canceled).
    async fn catalog(&self, ctx: &Context<'_>, store_id: ID) -> GqlResult<CatalogNode> {
        viewer(ctx)?;
        let store = parse_id(&store_id, "storeId")?;
        let mut c = conn(ctx).await?;
        crate::catalog::require_store(&mut c, store).await?;
        let plans: Vec<models::MembershipPlan> = membership_plans::table
            .filter(membership_plans::store_id.eq(store))
            .filter(membership_plans::retired_at.is_null())
            .order(membership_plans::id)
            .select(models::MembershipPlan::as_select())
            .load(&mut c)
            .await?;
        let packs: Vec<models::ClassPack> = class_packs::table
            .filter(class_packs::store_id.eq(store))
            .filter(class_packs::retired_at.is_null())
            .order(class_packs::id)
            .select(models::ClassPack::as_select())
            .load(&mut c)
            .await?;
        let slots: Vec<models::CoachSlot> = coach_slots::table
            .filter(coach_slots::store_id.eq(store))
            .filter(coach_slots::starts_at.gt(Utc::now()))
            .filter(coach_slots::canceled_at.is_null())
            .order((coach_slots::starts_at, coach_slots::id))
            .select(models::CoachSlot::as_select())
            .load(&mut c)
            .await?;
        let rules = crate::prepaid::rules_of(&mut c, store).await?.rules;
        Ok(CatalogNode {
            membership_plans: plans.into_iter().map(MembershipPlanNode).collect(),
            class_packs: packs.into_iter().map(ClassPackNode).collect(),
            coach_slots: slots.into_iter().map(CoachSlotNode).collect(),
            terms: rules
                .terms_version
                .zip(rules.terms_text)
                .map(|(version, text)| TermsNode { version, text }),
        })
    }

    /// the business calendar from `from` through `to` (at most 366 days)
    async fn business_days(&self, ctx: &Context<'_>, from: Date, to: Date) -> GqlResult<Vec<BusinessDayNode>> {
        viewer(ctx)?;
        let mut c = conn(ctx).await?;
        Ok(crate::prepaid::calendar::days(&mut c, from.0, to.0)
            .await?
            .into_iter()
            .map(|d| BusinessDayNode {
                date: Date(d.date),
                working: d.working,
                source: d.source.as_str().to_string(),
                note: d.note,
            })
            .collect())
    }

    /// staff: a store's takings per business date and payment method, `from` through `to` (at most
    /// 366 days); only dates and methods with money in or out
    async fn sales_report(
        &self,
        ctx: &Context<'_>,
        store_id: ID,
        from: Date,
        to: Date,
    ) -> GqlResult<Vec<SalesDayNode>> {
        let v = viewer(ctx)?;
        let store = parse_id(&store_id, "storeId")?;
        let mut c = conn(ctx).await?;
        let tz = state(ctx).config.timezone;
        let days = crate::sales::report(&mut c, v, tz, store, from.0, to.0).await?;
        Ok(days.into_iter().map(SalesDayNode::from).collect())
    }

    /// staff: a store's prepaid money (预收资金台账) per date, `from` through `to` (at most 366 days)
    async fn prepaid_ledger(
        &self,
        ctx: &Context<'_>,
        store_id: ID,
        from: Date,
        to: Date,
    ) -> GqlResult<Vec<PrepaidDayNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let store = parse_id(&store_id, "storeId")?;
        v.require_store(store)?;
        let mut c = conn(ctx).await?;
        crate::catalog::require_store(&mut c, store).await?;
        let tz = state(ctx).config.timezone;
        Ok(crate::prepaid::ledger::ledger(&mut c, store, from.0, to.0, tz)
            .await?
            .into_iter()
            .map(PrepaidDayNode::from)
            .collect())
    }

    /// One order; another member's order (or another store's, for store-limited staff) is null.
    async fn order(&self, ctx: &Context<'_>, order_no: String) -> GqlResult<Option<OrderNode>> {
        let v = viewer(ctx)?;
        let mut c = conn(ctx).await?;
        let order = crate::orders::find_order(&mut c, &order_no).await?;
        Ok(order.filter(|o| crate::orders::viewer_sees_order(v, o)).map(OrderNode))
    }

    /// one card: its holder, staff of its store
    async fn membership(&self, ctx: &Context<'_>, id: ID) -> GqlResult<Option<MembershipNode>> {
        let v = viewer(ctx)?;
        let Ok(id) = id.parse::<i64>() else {
            return Ok(None);
        };
        let mut c = conn(ctx).await?;
        let m = crate::memberships::find(&mut c, id).await?;
        Ok(m.filter(|m| v.sees_owned(m.member_id, m.store_id)).map(MembershipNode))
    }

    #[graphql(complexity = "connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn orders(
        &self,
        ctx: &Context<'_>,
        filter: Option<OrderFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<Connection<OrderNode>> {
        let v = viewer(ctx)?;
        let first = page_size(first)?;
        let after = after.as_deref().map(decode_cursor).transpose()?;
        let f = filter.unwrap_or_default();
        let make = || -> AppResult<orders::BoxedQuery<'static, Pg>> {
            let mut p = v.owned_rows(orders::table.into_boxed(), orders::member_id, orders::store_id);
            if let Some(statuses) = &f.status {
                let s: Vec<domain::OrderStatus> = domain_words(statuses);
                p = p.filter(orders::status.eq_any(s));
            }
            if let Some(id) = &f.store_id {
                p = p.filter(orders::store_id.eq(parse_id(id, "storeId")?));
            }
            if let Some(id) = &f.member_id {
                p = p.filter(orders::member_id.eq(parse_id(id, "memberId")?));
            }
            if let Some(expired) = f.is_expired {
                // The words from the vocabulary, not typed out again.
                let clause = format!(
                    "((status = '{}' AND expires_at IS NOT NULL AND expires_at <= now()) \
                      OR (cancel_reason IS NOT NULL AND cancel_reason = '{}'))",
                    domain::OrderStatus::WaitPay.as_str(),
                    domain::TIMEOUT_REASON
                );
                p = if expired {
                    p.filter(sql::<Bool>(&clause))
                } else {
                    p.filter(sql::<Bool>(&format!("NOT {clause}")))
                };
            }
            if let Some(t) = f.created_from {
                p = p.filter(orders::created_at.ge(t));
            }
            if let Some(t) = f.created_to {
                p = p.filter(orders::created_at.lt(t));
            }
            if let Some(no) = &f.order_no {
                p = p.filter(orders::order_no.eq(no.clone()));
            }
            Ok(p)
        };
        let mut c = conn(ctx).await?;
        let node = ctx.look_ahead().field("edges").field("node");
        let rel = PageRelations {
            member: node.field("member").exists(),
            store: node.field("store").exists(),
            compensation: node.field("compensation").exists(),
            // Members read no tickets (the field answers an empty list without a load).
            tickets: v.role != Role::Member && node.field("tickets").exists(),
        };
        page!(@rows ctx, c, make, orders, Order, first, after, |rows, total| {
            // The page's relations now, one statement each, before its fields resolve.
            let shown = &rows[..rows.len().min(first as usize)];
            prefetch_order_page(ctx, &mut c, shown, rel).await?;
            Ok(connection::build(rows, first, after, total, |r| r.id, OrderNode))
        })
    }

    /// A member: members may read only themselves, store-limited staff only their stores'.
    async fn member(&self, ctx: &Context<'_>, id: ID) -> GqlResult<Option<MemberNode>> {
        let v = viewer(ctx)?;
        let id = parse_id(&id, "id")?;
        match load_member(ctx, id).await {
            Ok(m) if v.sees_owned(m.0.id, m.0.store_id) => Ok(Some(m)),
            Ok(_) | Err(AppError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The front desk finds a member (staff): by the whole phone number or its last four
    /// digits, any part of the name, the store; store-limited admins among their stores only.
    /// Phones show as `Member.phone` shows them to the caller (masked for ops).
    #[graphql(complexity = "connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn members(
        &self,
        ctx: &Context<'_>,
        filter: Option<MemberFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<Connection<MemberNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let first = page_size(first)?;
        let after = after.as_deref().map(decode_cursor).transpose()?;
        let f = filter.unwrap_or_default();
        let store = f.store_id.as_ref().map(|s| parse_id(s, "storeId")).transpose()?;
        let search = crate::catalog::MemberSearch::parse(f.phone.as_deref(), f.name.as_deref(), store)?;
        let make = || -> AppResult<members::BoxedQuery<'static, Pg>> {
            Ok(crate::catalog::find_members(&search, v.store_scope()))
        };
        let mut c = conn(ctx).await?;
        page!(ctx, c, make, members, Member, MemberNode, first, after)
    }

    #[graphql(complexity = "connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn memberships(
        &self,
        ctx: &Context<'_>,
        filter: Option<MembershipFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<Connection<MembershipNode>> {
        let v = viewer(ctx)?;
        let first = page_size(first)?;
        let after = after.as_deref().map(decode_cursor).transpose()?;
        let f = filter.unwrap_or_default();
        let make = || -> AppResult<memberships::BoxedQuery<'static, Pg>> {
            let mut p = v.owned_rows(
                memberships::table.into_boxed(),
                memberships::member_id,
                memberships::store_id,
            );
            if let Some(id) = &f.member_id {
                p = p.filter(memberships::member_id.eq(parse_id(id, "memberId")?));
            }
            if let Some(id) = &f.store_id {
                p = p.filter(memberships::store_id.eq(parse_id(id, "storeId")?));
            }
            if let Some(st) = &f.status {
                let s: Vec<domain::MembershipStatus> = domain_words(st);
                p = p.filter(memberships::status.eq_any(s));
            }
            Ok(p)
        };
        let mut c = conn(ctx).await?;
        page!(ctx, c, make, memberships, Membership, MembershipNode, first, after)
    }

    async fn exception_ticket(&self, ctx: &Context<'_>, id: ID) -> GqlResult<Option<ExceptionTicketNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let id = parse_id(&id, "id")?;
        let mut c = conn(ctx).await?;
        let t: Option<models::ExceptionTicket> = exception_tickets::table
            .find(id)
            .select(models::ExceptionTicket::as_select())
            .get_result(&mut c)
            .await
            .optional()?;
        Ok(t.filter(|t| v.sees_store_of(t.store_id)).map(ExceptionTicketNode))
    }

    #[graphql(complexity = "connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn exception_tickets(
        &self,
        ctx: &Context<'_>,
        filter: Option<TicketFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<Connection<ExceptionTicketNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let first = page_size(first)?;
        let after = after.as_deref().map(decode_cursor).transpose()?;
        let f = filter.unwrap_or_default();
        let make = || -> AppResult<exception_tickets::BoxedQuery<'static, Pg>> {
            let mut p = v.store_rows(
                exception_tickets::table.into_boxed(),
                exception_tickets::store_id.assume_not_null(),
            );
            if let Some(st) = &f.status {
                let s: Vec<domain::TicketStatus> = domain_words(st);
                p = p.filter(exception_tickets::status.eq_any(s));
            }
            if let Some(k) = &f.kind {
                let s: Vec<domain::TicketKind> = domain_words(k);
                p = p.filter(exception_tickets::kind.eq_any(s));
            }
            if let Some(id) = &f.store_id {
                p = p.filter(
                    exception_tickets::store_id
                        .eq(parse_id(id, "storeId")?)
                        .assume_not_null(),
                );
            }
            if let Some(no) = &f.order_no {
                p = p.filter(exception_tickets::order_no.eq(no.clone()).assume_not_null());
            }
            Ok(p)
        };
        let mut c = conn(ctx).await?;
        page!(
            ctx,
            c,
            make,
            exception_tickets,
            ExceptionTicket,
            ExceptionTicketNode,
            first,
            after
        )
    }

    #[graphql(complexity = "connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn compensation_events(
        &self,
        ctx: &Context<'_>,
        filter: Option<CompensationFilter>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<Connection<CompensationEventNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let first = page_size(first)?;
        let after = after.as_deref().map(decode_cursor).transpose()?;
        let f = filter.unwrap_or_default();
        let make = || -> AppResult<compensation_events::BoxedQuery<'static, Pg>> {
            // An order's effects only: alert deliveries are no order's.
            let mut p = compensation_events::table
                .filter(compensation_events::kind.eq_any(CompensationKind::SHOWN))
                .into_boxed();
            // An event's store is its order's.
            if let Some(stores) = v.store_scope() {
                let seen = orders::table.filter(orders::store_id.eq_any(stores.to_vec()));
                p = p.filter(compensation_events::order_id.eq_any(seen.select(orders::id.nullable())));
            }
            if let Some(st) = &f.status {
                let s: Vec<crate::domain::CompensationStatus> = st.iter().map(|&s| s.into()).collect();
                p = p.filter(compensation_events::status.eq_any(s));
            }
            if let Some(k) = &f.kind {
                let s: Vec<crate::domain::CompensationKind> = k.iter().map(|&k| k.into()).collect();
                p = p.filter(compensation_events::kind.eq_any(s));
            }
            if let Some(no) = &f.order_no {
                p = p.filter(
                    compensation_events::order_id.eq_any(
                        orders::table
                            .filter(orders::order_no.eq(no.clone()))
                            .select(orders::id.nullable()),
                    ),
                );
            }
            Ok(p)
        };
        let mut c = conn(ctx).await?;
        page!(
            ctx,
            c,
            make,
            compensation_events,
            CompensationEvent,
            CompensationEventNode,
            first,
            after
        )
    }

    #[graphql(complexity = "connection::page_size(first).unwrap_or(20) as usize * child_complexity + 2")]
    async fn reconciliation_runs(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> GqlResult<Connection<ReconciliationRunNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        require_chain_wide(v)?;
        let first = page_size(first)?;
        let after = after.as_deref().map(decode_cursor).transpose()?;
        let make = || -> AppResult<reconciliation_runs::BoxedQuery<'static, Pg>> {
            Ok(reconciliation_runs::table.into_boxed())
        };
        let mut c = conn(ctx).await?;
        page!(
            ctx,
            c,
            make,
            reconciliation_runs,
            ReconciliationRun,
            ReconciliationRunNode,
            first,
            after
        )
    }

    /// Runs of the periodic tasks (order:expire, alert:check, reconcile:daily, data:cleanup),
    /// newest first (admin and ops).
    async fn task_runs(
        &self,
        ctx: &Context<'_>,
        task: Option<String>,
        first: Option<i32>,
    ) -> GqlResult<Vec<TaskRunNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        require_chain_wide(v)?;
        let first = page_size(first)?;
        let mut c = conn(ctx).await?;
        let mut q = task_runs::table.into_boxed();
        if let Some(t) = task {
            q = q.filter(task_runs::task.eq(t));
        }
        let rows: Vec<models::TaskRun> = q
            .order(task_runs::id.desc())
            .limit(first)
            .select(models::TaskRun::as_select())
            .load(&mut c)
            .await?;
        Ok(rows.into_iter().map(TaskRunNode).collect())
    }

    /// Per reconciliation finding category in `[from, to)`: how many differences the runs
    /// healed by themselves (settled, refunded as paid-after-cancel, confirmed by asking the
    /// provider) and how many became tickets for a person.
    async fn reconciliation_healing(
        &self,
        ctx: &Context<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        #[graphql(desc = "one store's findings (store-limited staff see only their stores' anyway)")] store_id: Option<
            ID,
        >,
    ) -> GqlResult<Vec<ReconciliationHealing>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        // Scoped, not refused: a store-limited admin counts only their stores' findings.
        if to < from {
            return Err(AppError::bad("to must not be before from").into());
        }
        let stores = match store_id.as_ref().map(|s| parse_id(s, "storeId")).transpose()? {
            Some(s) => {
                v.require_store(s)?;
                Some(vec![s])
            }
            None => v.store_scope().map(<[i64]>::to_vec),
        };
        let mut c = conn(ctx).await?;
        let rows = crate::reconciliation::healing(&mut c, from, to, stores).await?;
        Ok(rows
            .into_iter()
            .map(|(category, healed, ticketed)| ReconciliationHealing {
                category: category.to_string(),
                healed: super::count(healed),
                ticketed: super::count(ticketed),
            })
            .collect())
    }

    /// The stores the caller may see, by id (staff; store-limited admins their own).
    async fn stores(&self, ctx: &Context<'_>) -> GqlResult<Vec<StoreNode>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        let q = v.store_rows(stores::table.order(stores::id).into_boxed(), stores::id);
        let mut c = conn(ctx).await?;
        let rows: Vec<models::Store> = q.select(models::Store::as_select()).load(&mut c).await?;
        Ok(rows.into_iter().map(StoreNode).collect())
    }

    /// Counts per anomaly category in `[from, to)`, computed from the recorded rows.
    async fn anomaly_stats(
        &self,
        ctx: &Context<'_>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        store_id: Option<ID>,
    ) -> GqlResult<Vec<AnomalyStat>> {
        let v = viewer(ctx)?;
        v.require(&[Role::Admin, Role::Ops])?;
        if to < from {
            return Err(AppError::bad("to must not be before from").into());
        }
        let store = store_id.as_ref().map(|s| parse_id(s, "storeId")).transpose()?;
        if let Some(s) = store {
            v.require_store(s)?;
        }
        let mut c = conn(ctx).await?;
        let counts = crate::anomalies::count(&mut c, from, to, store, v.store_scope().map(<[i64]>::to_vec)).await?;
        Ok(domain::AnomalyCategory::ALL
            .into_iter()
            .map(|cat| AnomalyStat {
                category: cat.into(),
                count: counts.get(&cat).copied().map(super::count).unwrap_or(0),
            })
            .collect())
    }
}

/// How many findings of one kind the reconciliation healed by itself, and how many needed a person.
#[derive(async_graphql::SimpleObject)]
pub struct ReconciliationHealing {
    /// The ticket kind (`PROVIDER_PAID_LOCAL_UNPAID`, `LOCAL_PAID_PROVIDER_MISSING`, …).
    pub category: String,
    pub healed: i32,
    pub ticketed: i32,
}
