//! The scheduler's part of the cards (the `membership:tick` task): scheduled freezes start at
//! the start of their first day, running ones end at the start of the day after their last,
//! and cards whose validity is over expire (a frozen card does not). Exactly once however many
//! processes run: each batch locks its cards with `FOR UPDATE SKIP LOCKED` (a card another
//! process or a request holds is left for later), the card before its freezes as every request
//! does, and [`super::change`] moves only a card still in the status it was seen in.

use std::collections::HashMap;

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

use super::{call_off, change, span, Change};
use crate::app::AppState;
use crate::db::models::{Membership, MembershipFreeze, Order};
use crate::db::schema::{membership_freezes, memberships, orders};
use crate::domain::membership::freeze_summary;
use crate::domain::{Actor, Effect, FreezeState, MembershipEventKind, MembershipStatus, TraceId};
use crate::error::AppResult;
use crate::outbox::{self, AccessAction};

/// Cards changed per transaction.
pub const BATCH: i64 = 2_000;

/// One run: every freeze due to start or end and every card due to expire, in batches.
/// Returns how many cards changed.
pub async fn run(state: AppState) -> AppResult<i64> {
    let trace = TraceId::new();
    let actor = Actor::system("memberships");
    let max_attempts = state.config.max_attempts;
    let mut total = 0i64;
    let mut conn = state.pool.get().await?;
    // Ends before starts: a freeze that follows another at once starts in the same run.
    for step in [Step::End, Step::Start, Step::Expire] {
        loop {
            let n = conn
                .transaction(async |conn| batch(conn, step, &actor, &trace, max_attempts).await)
                .await?;
            total += n.changed;
            if n.seen < BATCH || n.locked == 0 {
                break;
            }
        }
    }
    Ok(total)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Start,
    End,
    Expire,
}

pub struct Batch {
    /// Cards found due (fewer than [`BATCH`]: the last batch).
    pub seen: i64,
    /// Of those, the cards this run locked (none: another process or a request holds them).
    pub locked: i64,
    pub changed: i64,
}

/// One batch of one step, in the caller's transaction.
pub async fn batch(
    conn: &mut AsyncPgConnection,
    step: Step,
    actor: &Actor,
    trace: &TraceId,
    max_attempts: i32,
) -> AppResult<Batch> {
    let now = Utc::now();
    // The cards due, read without a lock; then their orders and the cards locked, in that
    // order (as a check-in, a refund and every request lock them), skipping what another
    // process or a request holds: never waiting, never deadlocking.
    let due: Vec<(i64, i64)> = match step {
        Step::Start => {
            let due = membership_freezes::table
                .filter(membership_freezes::state.eq(FreezeState::Scheduled))
                .filter(membership_freezes::starts_at.le(now))
                .select(membership_freezes::membership_id);
            memberships::table
                .filter(memberships::id.eq_any(due))
                .order(memberships::id)
                .limit(BATCH)
                .select((memberships::id, memberships::order_id))
                .load(conn)
                .await?
        }
        Step::End => {
            let due = membership_freezes::table
                .filter(membership_freezes::state.eq(FreezeState::Running))
                .filter(membership_freezes::ends_at.le(now))
                .select(membership_freezes::membership_id);
            memberships::table
                .filter(memberships::id.eq_any(due))
                .order(memberships::id)
                .limit(BATCH)
                .select((memberships::id, memberships::order_id))
                .load(conn)
                .await?
        }
        Step::Expire => {
            memberships::table
                .filter(memberships::status.eq(MembershipStatus::Active))
                .filter(memberships::valid_to.le(now))
                .order(memberships::valid_to)
                .limit(BATCH)
                .select((memberships::id, memberships::order_id))
                .load(conn)
                .await?
        }
    };
    let seen = due.len() as i64;
    if due.is_empty() {
        return Ok(Batch {
            seen,
            locked: 0,
            changed: 0,
        });
    }
    let order_ids: Vec<i64> = due.iter().map(|(_, o)| *o).collect();
    let held: Vec<i64> = orders::table
        .filter(orders::id.eq_any(&order_ids))
        .order(orders::id)
        .select(orders::id)
        .for_no_key_update()
        .skip_locked()
        .load(conn)
        .await?;
    let card_ids: Vec<i64> = due
        .iter()
        .filter(|(_, o)| held.binary_search(o).is_ok())
        .map(|(m, _)| *m)
        .collect();
    let cards: Vec<Membership> = memberships::table
        .filter(memberships::id.eq_any(&card_ids))
        .order(memberships::id)
        .select(Membership::as_select())
        .for_update()
        .skip_locked()
        .load(conn)
        .await?;
    let locked = cards.len() as i64;
    if cards.is_empty() {
        return Ok(Batch {
            seen,
            locked,
            changed: 0,
        });
    }
    let ids: Vec<i64> = cards.iter().map(|m| m.id).collect();
    // The cards' freezes of this step, the earliest first (one per card per batch).
    let freezes: Vec<MembershipFreeze> = match step {
        Step::Expire => Vec::new(),
        Step::Start => {
            membership_freezes::table
                .filter(membership_freezes::membership_id.eq_any(&ids))
                .filter(membership_freezes::state.eq(FreezeState::Scheduled))
                .filter(membership_freezes::starts_at.le(now))
                .order((membership_freezes::membership_id, membership_freezes::starts_at))
                .select(MembershipFreeze::as_select())
                .load(conn)
                .await?
        }
        Step::End => {
            membership_freezes::table
                .filter(membership_freezes::membership_id.eq_any(&ids))
                .filter(membership_freezes::state.eq(FreezeState::Running))
                .filter(membership_freezes::ends_at.le(now))
                .order((membership_freezes::membership_id, membership_freezes::starts_at))
                .select(MembershipFreeze::as_select())
                .load(conn)
                .await?
        }
    };
    let mut first: HashMap<i64, &MembershipFreeze> = HashMap::new();
    for f in &freezes {
        first.entry(f.membership_id).or_insert(f);
    }
    let mut changes = Vec::new();
    let mut dead_freezes = Vec::new();
    for m in &cards {
        match step {
            Step::Start => {
                let Some(f) = first.get(&m.id) else { continue };
                if m.status != MembershipStatus::Active {
                    // Revoked or over: it has nothing to freeze.
                    if m.status.is_final() {
                        dead_freezes.push(f.id);
                    }
                    continue;
                }
                let d = (f.until_date - f.from_date).num_days() as i32;
                changes.push(Change {
                    id: m.id,
                    from: MembershipStatus::Active,
                    to: MembershipStatus::Frozen,
                    shift_days: d,
                    frozen_delta: d,
                    to_member: None,
                    kind: MembershipEventKind::Frozen,
                    reason: Some(f.reason.clone()),
                    summary: freeze_summary(span(f), true),
                });
            }
            Step::End => {
                let Some(f) = first.get(&m.id) else { continue };
                if m.status != MembershipStatus::Frozen {
                    continue;
                }
                changes.push(Change {
                    id: m.id,
                    from: MembershipStatus::Frozen,
                    to: MembershipStatus::Active,
                    shift_days: 0,
                    frozen_delta: 0,
                    to_member: None,
                    kind: MembershipEventKind::Unfrozen,
                    reason: None,
                    summary: format!("freeze ended: frozen {} until {}", f.from_date, f.until_date),
                });
            }
            Step::Expire if m.status != MembershipStatus::Active || m.valid_to > now => {}
            Step::Expire => changes.push(Change {
                id: m.id,
                from: MembershipStatus::Active,
                to: MembershipStatus::Expired,
                shift_days: 0,
                frozen_delta: 0,
                to_member: None,
                kind: MembershipEventKind::Expired,
                reason: None,
                summary: format!("expired: valid until {}", m.valid_to.format("%Y-%m-%d %H:%M UTC")),
            }),
        }
    }
    call_off(conn, &dead_freezes).await?;
    let changed = change(conn, &changes, actor, trace).await?;
    if changed.is_empty() {
        return Ok(Batch {
            seen,
            locked,
            changed: 0,
        });
    }
    // The freezes of the cards that changed move with them.
    let moved: Vec<i64> = changed.iter().filter_map(|id| first.get(id).map(|f| f.id)).collect();
    match step {
        Step::Start => {
            diesel::update(membership_freezes::table.filter(membership_freezes::id.eq_any(&moved)))
                .set(membership_freezes::state.eq(FreezeState::Running))
                .execute(conn)
                .await?;
        }
        Step::End => {
            diesel::update(membership_freezes::table.filter(membership_freezes::id.eq_any(&moved)))
                .set(membership_freezes::state.eq(FreezeState::Done))
                .execute(conn)
                .await?;
        }
        Step::Expire => {}
    }
    // Access follows the cards: revoked while frozen or once over, granted again after.
    let by_id: HashMap<i64, &Membership> = cards.iter().map(|m| (m.id, m)).collect();
    let order_ids: Vec<i64> = changed
        .iter()
        .filter_map(|id| by_id.get(id))
        .map(|m| m.order_id)
        .collect();
    let orders_of: HashMap<i64, Order> = orders::table
        .filter(orders::id.eq_any(&order_ids))
        .select(Order::as_select())
        .load(conn)
        .await?
        .into_iter()
        .map(|o| (o.id, o))
        .collect();
    let mut of = Vec::new();
    let mut effects: Vec<Effect> = Vec::new();
    for id in &changed {
        let (Some(m), Some(o)) = (by_id.get(id), by_id.get(id).and_then(|m| orders_of.get(&m.order_id))) else {
            continue;
        };
        let (action, cause) = match step {
            Step::Start => (AccessAction::Revoke, format!("FREEZE-{}", first[id].id)),
            Step::End => (AccessAction::Grant, format!("FREEZE-{}", first[id].id)),
            Step::Expire => (AccessAction::Revoke, "EXPIRED".to_string()),
        };
        for e in outbox::card_access(o, m.member_id, action, cause) {
            of.push(Some(o.id));
            effects.push(e);
        }
    }
    outbox::enqueue_of(conn, &of, &effects, trace, max_attempts).await?;
    Ok(Batch {
        seen,
        locked,
        changed: changed.len() as i64,
    })
}
