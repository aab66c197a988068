//! The demo's stories: on the first start of `cargo run --release`, a few orders that end where
//! staff must look, so that a newcomer's workbench, its timelines and the ops screen are not
//! empty. Each is made through the paths the real thing takes — orders placed and canceled by
//! the capabilities, the providers' signed notifications posted to our own notify paths and
//! checked there, a bill in WeChat Pay's format reconciled — and none is written into a table
//! by hand:
//!
//! 1. **paid after cancel** (Alipay): Zhang Wei's class pack is canceled at the desk, then
//!    Alipay's notification of its payment arrives: a `PAID_AFTER_CANCEL` ticket, the money
//!    sent back by the outbox (the sandbox confirms the refund);
//! 2. **a bill difference** (WeChat Pay): Wang Fang's monthly card is paid, and the day's bill
//!    (as staff would hand it in; kept in `<statement dir>/demo/`) says the payment was ¥9 less and holds
//!    a payment fitorder never heard of: `AMOUNT_MISMATCH` and `PROVIDER_PAID_LOCAL_UNPAID`.
//!
//! A dead grant is not among them: door and AI access are simulated (always delivered) while
//! `FITORDER_DOOR_ACCESS_URL` and `FITORDER_AI_ACCESS_URL` are unset, as in development.

use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::RunQueryDsl;

use crate::app::AppState;
use crate::auth::{Role, Viewer};
use crate::bill_writers::write_wechat_bill;
use crate::db::schema::{class_packs, membership_plans};
use crate::devkeys::DevKeys;
use crate::domain::money::format_yuan;
use crate::domain::{Actor, Ctx, PaymentMethod, Provider};
use crate::orders::{PlaceOrder, PlacedItem};
use crate::providers::bills::{BillKind, BillRow};
use crate::seed::Seeded;
use crate::trace::TraceId;

/// What the stories left for staff, for the start banner.
pub struct Told {
    pub tickets: usize,
}

/// Tells the stories against the server at `config.public_url`, once it answers. Only for a
/// database the demo data was just made in (`seeded.created`), with the sandbox's keys.
pub async fn tell(state: AppState, keys: &DevKeys, seeded: &Seeded) -> anyhow::Result<Told> {
    let base = state.config.public_url.trim_end_matches('/').to_string();
    let http = reqwest::Client::new();
    wait_until_listening(&http, &base).await?;
    let ctx = Ctx {
        actor: Actor::system("demo"),
        trace: TraceId::new(),
    };
    let staff = Viewer {
        role: Role::Admin,
        subject: "demo".into(),
        member_id: None,
        stores: None,
        session: None,
    };
    let store = seeded.store_ids[0];
    let (wang_fang, zhang_wei) = (seeded.member_ids[1], seeded.member_ids[2]);
    let mut conn = state.pool.get().await?;

    // 1. Paid after cancel, at Alipay.
    let pack: i64 = class_packs::table
        .filter(class_packs::store_id.eq(store))
        .filter(class_packs::name.eq("AI strength · 10 sessions"))
        .select(class_packs::id)
        .first(&mut conn)
        .await?;
    let order = place(
        &mut conn,
        &state,
        &staff,
        &ctx,
        store,
        zhang_wei,
        PlacedItem::ClassPack(pack),
        PaymentMethod::Alipay,
        "demo-paid-after-cancel",
    )
    .await?;
    crate::orders::cancel_order(&mut conn, None, &order.order_no, "canceled at the desk", &ctx)
        .await
        .map_err(|e| anyhow::anyhow!(e.message()))?;
    let form = keys.alipay().payment(
        &order.order_no,
        &format!("2026{}", Utc::now().format("%m%d%H%M%S%6f")),
        "TRADE_SUCCESS",
        &format_yuan(order.amount_cents),
    );
    let sent = http
        .post(format!("{base}{}", crate::providers::alipay::NOTIFY_PATH))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await?;
    anyhow::ensure!(
        sent.status().is_success(),
        "Alipay's notification was refused: HTTP {}",
        sent.status()
    );

    // 2. A bill difference, at WeChat Pay.
    let card: i64 = membership_plans::table
        .filter(membership_plans::store_id.eq(store))
        .filter(membership_plans::name.eq("Monthly card"))
        .select(membership_plans::id)
        .first(&mut conn)
        .await?;
    let paid = place(
        &mut conn,
        &state,
        &staff,
        &ctx,
        store,
        wang_fang,
        PlacedItem::MembershipPlan(card),
        PaymentMethod::WechatPay,
        "demo-bill-difference",
    )
    .await?;
    let txn = format!("4200{}", Utc::now().format("%Y%m%d%H%M%S%6f"));
    let w = keys.wechat();
    let n = w.notification(
        "TRANSACTION.SUCCESS",
        &w.transaction(&paid.order_no, &txn, paid.amount_cents),
        Utc::now().timestamp(),
    );
    let mut req = http
        .post(format!("{base}{}", crate::providers::wechat::NOTIFY_PATH))
        .header("content-type", "application/json");
    for (k, v) in &n.headers {
        req = req.header(*k, v);
    }
    let sent = req.body(n.body).send().await?;
    anyhow::ensure!(
        sent.status().is_success(),
        "WeChat Pay's notification was refused: HTTP {}",
        sent.status()
    );
    drop(conn);
    let now = Utc::now().with_timezone(&chrono_tz::Asia::Shanghai);
    let row = |out_trade_no: &str, txn: &str, amount_cents: i64| BillRow {
        line: 0,
        kind: BillKind::Payment,
        out_trade_no: out_trade_no.into(),
        provider_txn_id: txn.into(),
        amount_cents,
        refund_no: None,
        provider_refund_id: None,
        trade_time: Some(now.naive_local()),
    };
    let rows = [
        row(&paid.order_no, &txn, paid.amount_cents - 900),
        row(
            "DEMO-UNKNOWN-ORDER",
            &format!("4201{}", now.format("%Y%m%d%H%M%S")),
            19_900,
        ),
    ];
    // Beside the statements, not among them (the daily run reads `<provider>-<date>` files there).
    let dir = state.config.statement_dir.join("demo");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("wechatpay-{}.csv", now.date_naive()));
    write_wechat_bill(
        std::io::BufWriter::new(std::fs::File::create(&file)?),
        &rows,
        false,
        false,
    )?;
    let run = crate::reconciliation::run(&state, Provider::WechatPay, now.date_naive(), Some(file), &ctx.trace)
        .await
        .map_err(|e| anyhow::anyhow!(e.message()))?;
    let mut conn = state.pool.get().await?;
    let tickets: i64 = crate::db::schema::exception_tickets::table
        .count()
        .get_result(&mut conn)
        .await?;
    tracing::info!(
        run = run.id,
        tickets,
        "demo stories told: a paid-after-cancel and a bill difference"
    );
    Ok(Told {
        tickets: tickets as usize,
    })
}

#[allow(clippy::too_many_arguments)]
async fn place(
    conn: &mut diesel_async::AsyncPgConnection,
    state: &AppState,
    staff: &Viewer,
    ctx: &Ctx,
    store: i64,
    member: i64,
    item: PlacedItem,
    method: PaymentMethod,
    key: &str,
) -> anyhow::Result<crate::db::models::Order> {
    let req = PlaceOrder {
        idempotency_key: key.into(),
        store_id: store,
        item,
        payment_method: method,
        wallet_amount_cents: None,
        member_id: Some(member),
        online_provider: None,
        accepted_terms_version: None,
    };
    crate::orders::place_order(conn, &state.config, staff, req, ctx)
        .await
        .map_err(|e| anyhow::anyhow!(e.message()))
}

/// The server answers `/healthz` (it starts listening right after the demo data is made).
async fn wait_until_listening(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    for _ in 0..100 {
        if http.get(format!("{base}/healthz")).send().await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the server did not answer at {base} within 10 s")
}
