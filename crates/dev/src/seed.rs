//! Demo data: two studios, a few members with money in their wallets, and things to buy.
//! Idempotent: a database that has the demo studio already is left alone.

use chrono::{Duration, Timelike, Utc};
use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::catalog;
use crate::db::schema::{members, stores};
use crate::domain::Actor;
use crate::domain::Ctx;
use crate::error::AppResult;
use crate::trace::TraceId;

pub struct Seeded {
    pub store_ids: Vec<i64>,
    pub member_ids: Vec<i64>,
    pub created: bool,
}

pub async fn seed(conn: &mut AsyncPgConnection) -> AppResult<Seeded> {
    let existing: Option<i64> = stores::table
        .filter(stores::code.eq("SH-JINGAN"))
        .select(stores::id)
        .get_result(conn)
        .await
        .optional()?;
    if let Some(store) = existing {
        let store_ids: Vec<i64> = stores::table
            .filter(stores::code.eq_any(["SH-JINGAN", "HZ-XIHU"]))
            .order(stores::id)
            .select(stores::id)
            .load(conn)
            .await?;
        let member_ids: Vec<i64> = members::table
            .filter(members::store_id.eq(store))
            .order(members::id)
            .select(members::id)
            .load(conn)
            .await?;
        return Ok(Seeded {
            store_ids,
            member_ids,
            created: false,
        });
    }
    let ctx = Ctx {
        actor: Actor::system("seed"),
        trace: TraceId::new(),
    };
    let sh = catalog::create_store(conn, "GogoAI Fitness · Jing'an", "SH-JINGAN", None).await?;
    let hz = catalog::create_store(conn, "GogoAI Fitness · West Lake", "HZ-XIHU", None).await?;
    let mut member_ids = Vec::new();
    for (name, phone, money) in [
        ("Li Na", "13800138001", 200_000),
        ("Wang Fang", "13800138002", 50_000),
        ("Zhang Wei", "13800138003", 0),
    ] {
        let m = catalog::create_member(conn, sh.id, name, phone).await?;
        if money > 0 {
            crate::wallet::top_up(
                conn,
                m.id,
                money,
                &format!("seed-{}", m.id),
                chrono_tz::Asia::Shanghai,
                &ctx,
            )
            .await?;
        }
        member_ids.push(m.id);
    }
    catalog::create_member(conn, hz.id, "Chen Jie", "13900139001").await?;
    for store in [sh.id, hz.id] {
        catalog::create_membership_plan(conn, store, "Monthly card", 30, 39_900, Default::default()).await?;
        catalog::create_membership_plan(conn, store, "Annual card", 365, 299_900, Default::default()).await?;
        catalog::create_class_pack(conn, store, "AI strength · 10 sessions", 10, 99_900, None).await?;
        catalog::create_class_pack(conn, store, "Launch offer · 5 sessions", 5, 19_900, Some(20)).await?;
        let tomorrow = (Utc::now() + Duration::days(1))
            .with_minute(0)
            .and_then(|t| t.with_second(0))
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or_else(Utc::now);
        for (i, coach) in ["Coach Liu", "Coach Zhao", "Coach Sun"].iter().enumerate() {
            let start = tomorrow + Duration::hours(i as i64 * 2);
            catalog::create_coach_slot(conn, store, coach, start, start + Duration::hours(1), 2, 30_000).await?;
        }
    }
    Ok(Seeded {
        store_ids: vec![sh.id, hz.id],
        member_ids,
        created: true,
    })
}
