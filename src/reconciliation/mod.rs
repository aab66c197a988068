//! Reconciliation: every morning, the providers' bills against the books.
//!
//! A run streams the bill (bounded memory) into the `bill_rows` staging table with COPY, and
//! only when the whole file parsed and its summary lines agree does it match — in SQL, set-based
//! — against the local payments and refunds. Each difference opens a ticket keyed by what it is,
//! so re-running a day opens nothing new. Runs of one provider and day never overlap (a unique
//! index on running runs).

pub mod bills;

use std::io::BufReader;
use std::path::{Path, PathBuf};

use chrono::{NaiveDate, TimeZone, Utc};
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use futures_util::SinkExt;

use crate::app::AppState;
use crate::db::models::ReconciliationRun;
use crate::db::schema::{bill_rows, reconciliation_runs as rr};
use crate::domain::schedule::Schedule;
use crate::error::{AppError, AppResult};
use crate::tasks::Task;
use crate::trace::TraceId;
use bills::{BillKind, BillRow, Provider};

/// Days back the daily run catches up when it missed some (a process down over a weekend).
pub const CATCH_UP_DAYS: i64 = 7;

/// `WECHAT_PAY` / `ALIPAY` as the files and the CLI name them.
pub fn file_prefix(provider: &str) -> &'static str {
    match provider {
        "ALIPAY" => "alipay",
        _ => "wechatpay",
    }
}

pub fn provider_from_cli(name: &str) -> Option<&'static str> {
    match name.to_ascii_lowercase().as_str() {
        "wechatpay" | "wechat" | "wechat_pay" => Some("WECHAT_PAY"),
        "alipay" => Some("ALIPAY"),
        _ => None,
    }
}

/// Where the bill of `provider` for `date` is found.
pub fn statement_path(dir: &Path, provider: &str, date: NaiveDate) -> PathBuf {
    dir.join(format!("{}-{}.csv", file_prefix(provider), date.format("%Y-%m-%d")))
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Reconciles `provider`'s bill for business day `date`; `file` overrides the statement dir.
/// A run that could not read its bill is recorded FAILED with the line and the reason.
pub async fn run(
    state: &AppState,
    provider: &str,
    date: NaiveDate,
    file: Option<PathBuf>,
    trace: &TraceId,
) -> AppResult<ReconciliationRun> {
    let mut conn = state.pool.get().await?;
    let started: ReconciliationRun = diesel::insert_into(rr::table)
        .values((
            rr::provider.eq(provider),
            rr::bill_date.eq(date),
            rr::status.eq("RUNNING"),
            rr::trace_id.eq(trace.as_str()),
        ))
        .returning(ReconciliationRun::as_returning())
        .get_result(&mut conn)
        .await
        .map_err(|e| match e {
            diesel::result::Error::DatabaseError(diesel::result::DatabaseErrorKind::UniqueViolation, _) => {
                AppError::Conflict(format!("a {provider} reconciliation of {date} is already running"))
            }
            other => other.into(),
        })?;
    drop(conn);
    let run_id = started.id;
    let path = file.unwrap_or_else(|| statement_path(&state.config.statement_dir, provider, date));
    let outcome = match load_bill(state, run_id, provider, &path).await {
        Ok(summary) => match_and_ticket(state, run_id, provider, date, trace)
            .await
            .map(|m| (summary, m)),
        Err(e) => Err(e),
    };
    let mut conn = state.pool.get().await?;
    diesel::delete(bill_rows::table.filter(bill_rows::run_id.eq(run_id)))
        .execute(&mut conn)
        .await?;
    let finished = match outcome {
        Ok((summary, m)) => {
            metrics::counter!("fitorder_reconciliation_findings_total", "provider" => provider.to_string())
                .increment(m.tickets as u64);
            diesel::update(rr::table.find(run_id))
                .set((
                    rr::status.eq("SUCCEEDED"),
                    rr::finished_at.eq(Utc::now()),
                    rr::provider_rows.eq(summary.rows as i32),
                    rr::local_rows.eq(m.local_rows as i32),
                    rr::matched.eq(m.matched as i32),
                    rr::tickets_opened.eq(m.tickets as i32),
                ))
                .returning(ReconciliationRun::as_returning())
                .get_result(&mut conn)
                .await?
        }
        Err(e) => {
            let why = e.message();
            tracing::error!(provider, %date, error = %why, "reconciliation failed");
            diesel::update(rr::table.find(run_id))
                .set((
                    rr::status.eq("FAILED"),
                    rr::finished_at.eq(Utc::now()),
                    rr::error.eq(why),
                ))
                .returning(ReconciliationRun::as_returning())
                .get_result(&mut conn)
                .await?
        }
    };
    Ok(finished)
}

/// Streams the bill into `bill_rows` with COPY. The parser runs on a blocking thread and hands
/// rows over in chunks; an error (with its line) stops everything.
async fn load_bill(state: &AppState, run_id: i64, provider: &str, path: &Path) -> AppResult<bills::BillSummary> {
    let file = std::fs::File::open(path).map_err(|e| AppError::bad(format!("bill {}: {e}", path.display())))?;
    let kind = if provider == "ALIPAY" {
        Provider::Alipay
    } else {
        Provider::WechatPay
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let parser = tokio::task::spawn_blocking(move || {
        let mut chunk = String::with_capacity(128 * 1024);
        let result = bills::parse(kind, BufReader::with_capacity(256 * 1024, file), |row| {
            copy_line(&mut chunk, run_id, &row);
            if chunk.len() >= 120 * 1024 {
                let full = std::mem::replace(&mut chunk, String::with_capacity(128 * 1024));
                tx.blocking_send(bytes::Bytes::from(full))
                    .map_err(|_| "the database stopped reading".to_string())?;
            }
            Ok(())
        });
        if result.is_ok() && !chunk.is_empty() {
            let _ = tx.blocking_send(bytes::Bytes::from(chunk));
        }
        result
    });
    let (client, connection) = tokio_postgres::connect(&state.db_url, tokio_postgres::NoTls)
        .await
        .map_err(|e| AppError::internal(format!("connecting for COPY: {e}")))?;
    let driver = tokio::spawn(connection);
    let copied = async {
        let sink = client
            .copy_in::<_, bytes::Bytes>(
                "COPY bill_rows (run_id, line, kind, out_trade_no, provider_txn_id, amount_cents, refund_no, provider_refund_id) FROM STDIN",
            )
            .await?;
        futures_util::pin_mut!(sink);
        while let Some(chunk) = rx.recv().await {
            sink.send(chunk).await?;
        }
        sink.finish().await
    }
    .await;
    drop(client);
    driver.abort();
    let summary = parser
        .await
        .map_err(|e| AppError::internal(format!("bill parser crashed: {e}")))?
        .map_err(|e| AppError::bad(format!("bill {}: {e}", path.display())))?;
    copied.map_err(|e| AppError::internal(format!("loading the bill: {e}")))?;
    Ok(summary)
}

/// One row in COPY's text format (tab-separated, `\N` for NULL, backslash escapes).
fn copy_line(out: &mut String, run_id: i64, r: &BillRow) {
    use std::fmt::Write;
    fn esc(out: &mut String, v: &str) {
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c => out.push(c),
            }
        }
    }
    let kind = match r.kind {
        BillKind::Payment => "PAYMENT",
        BillKind::Refund => "REFUND",
        BillKind::Other => "OTHER",
    };
    let _ = write!(out, "{run_id}\t{}\t{kind}\t", r.line);
    esc(out, &r.out_trade_no);
    out.push('\t');
    esc(out, &r.provider_txn_id);
    let _ = write!(out, "\t{}\t", r.amount_cents);
    match &r.refund_no {
        Some(v) => esc(out, v),
        None => out.push_str("\\N"),
    }
    out.push('\t');
    match &r.provider_refund_id {
        Some(v) => esc(out, v),
        None => out.push_str("\\N"),
    }
    out.push('\n');
}

struct Matched {
    local_rows: i64,
    matched: i64,
    tickets: i64,
}

/// The matching, in SQL: each statement inserts the tickets of one kind of finding and returns
/// how many were new. Ticket kinds that the callbacks already opened for the same provider
/// transaction (paid after cancel, unknown order, ...) are the same difference and are not
/// opened twice.
async fn match_and_ticket(
    state: &AppState,
    run_id: i64,
    provider: &str,
    date: NaiveDate,
    trace: &TraceId,
) -> AppResult<Matched> {
    let tz = state.config.timezone;
    let t0 = tz
        .from_local_datetime(&date.and_hms_opt(0, 0, 0).expect("midnight exists"))
        .earliest()
        .map(|t| t.with_timezone(&Utc))
        .ok_or_else(|| AppError::internal("no midnight on that day"))?;
    let t1 = t0 + chrono::Duration::days(1);
    let mut conn = state.pool.get().await?;
    // The staging rows were just COPYed: without statistics the planner would join a million
    // rows as if they were a handful.
    diesel::sql_query("ANALYZE bill_rows").execute(&mut conn).await?;
    let findings = [
        // The provider collected money the books do not have as an applied payment.
        "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                        local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
         SELECT 'PROVIDER_PAID_LOCAL_UNPAID', $2, o.id, b.out_trade_no, o.store_id, b.provider_txn_id,
                CASE WHEN o.id IS NULL THEN NULL ELSE o.amount_cents - o.wallet_amount_cents END, b.amount_cents,
                jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line,
                                   'orderStatus', o.status),
                'RECON:' || $2 || ':PROVIDER_PAID_LOCAL_UNPAID:' || b.out_trade_no || ':' || b.provider_txn_id, $4
           FROM bill_rows b
           LEFT JOIN orders o ON o.order_no = b.out_trade_no
          WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
            AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.provider_txn_id = b.provider_txn_id AND p.method = $2)
            AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.provider_txn_id = b.provider_txn_id
                             AND t.kind IN ('PAID_AFTER_CANCEL', 'UNKNOWN_ORDER', 'REJECTED_TRANSITION', 'AMOUNT_MISMATCH'))
         ON CONFLICT (finding_key) DO NOTHING RETURNING id",
        // Both have the payment, for different amounts.
        "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                        local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
         SELECT 'AMOUNT_MISMATCH', $2, o.id, o.order_no, o.store_id, p.provider_txn_id, p.online_cents, b.amount_cents,
                jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line),
                'RECON:' || $2 || ':AMOUNT_MISMATCH:' || o.order_no || ':' || p.provider_txn_id, $4
           FROM bill_rows b
           JOIN payments p ON p.provider_txn_id = b.provider_txn_id AND p.method = $2
           JOIN orders o ON o.id = p.order_id
          WHERE b.run_id = $1 AND b.kind = 'PAYMENT' AND p.online_cents <> b.amount_cents
         ON CONFLICT (finding_key) DO NOTHING RETURNING id",
        // Paid here on that day, absent from the provider's bill.
        "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                        local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
         SELECT 'LOCAL_PAID_PROVIDER_MISSING', $2, o.id, o.order_no, o.store_id, p.provider_txn_id, p.online_cents, NULL,
                jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'paidAt', p.paid_at),
                'RECON:' || $2 || ':LOCAL_PAID_PROVIDER_MISSING:' || o.order_no || ':' || coalesce(p.provider_txn_id, ''), $4
           FROM payments p
           JOIN orders o ON o.id = p.order_id
          WHERE p.method = $2 AND p.online_cents > 0 AND p.paid_at >= $5 AND p.paid_at < $6
            AND NOT EXISTS (SELECT 1 FROM bill_rows b WHERE b.run_id = $1 AND b.kind = 'PAYMENT'
                             AND b.provider_txn_id = p.provider_txn_id)
         ON CONFLICT (finding_key) DO NOTHING RETURNING id",
        // A refund in the bill that the books do not know, or for another amount. Its status in
        // the bill does not matter: WeChat books a refund when it is asked for and never updates
        // the row, so one we asked for may read PROCESSING for good. A refund whose callback
        // already opened a ticket (failed, unknown, more than asked) is that same difference.
        "INSERT INTO exception_tickets (kind, provider, order_id, order_no, store_id, provider_txn_id,
                                        local_amount_cents, provider_amount_cents, detail, finding_key, trace_id)
         SELECT 'REFUND_MISMATCH', $2, o.id, b.out_trade_no, o.store_id, coalesce(b.provider_refund_id, b.provider_txn_id),
                (e.payload->>'amountCents')::bigint, b.amount_cents,
                jsonb_build_object('source', 'reconciliation', 'billDate', $3::text, 'line', b.line,
                                   'refundNo', b.refund_no, 'known', e.id IS NOT NULL),
                'RECON:' || $2 || ':REFUND_MISMATCH:' || b.out_trade_no || ':' || coalesce(b.refund_no, b.provider_txn_id), $4
           FROM bill_rows b
           LEFT JOIN orders o ON o.order_no = b.out_trade_no
           LEFT JOIN compensation_events e ON e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = $2
                                          AND e.payload->>'refundNo' = b.refund_no AND e.payload->>'orderNo' = b.out_trade_no
          WHERE b.run_id = $1 AND b.kind = 'REFUND'
            AND (e.id IS NULL OR (e.payload->>'amountCents')::bigint <> b.amount_cents)
            AND NOT EXISTS (SELECT 1 FROM exception_tickets t WHERE t.kind = 'REFUND_MISMATCH'
                             AND t.order_no = b.out_trade_no AND t.detail->>'refundNo' = b.refund_no
                             AND t.detail->>'source' = 'callback')
         ON CONFLICT (finding_key) DO NOTHING RETURNING id",
    ];
    let mut tickets = 0;
    for sql in findings {
        let ids: Vec<Id> = diesel::sql_query(sql)
            .bind::<BigInt, _>(run_id)
            .bind::<Text, _>(provider)
            .bind::<Text, _>(date.to_string())
            .bind::<Text, _>(trace.as_str())
            .bind::<Timestamptz, _>(t0)
            .bind::<Timestamptz, _>(t1)
            .load(&mut conn)
            .await?;
        for id in &ids {
            crate::events::notify_sql(&format!("ticket:{}", id.id))
                .execute(&mut conn)
                .await?;
        }
        tickets += ids.len() as i64;
    }
    let counts: N = diesel::sql_query(
        "SELECT (SELECT count(*) FROM payments p WHERE p.method = $2 AND p.online_cents > 0 AND p.paid_at >= $3 AND p.paid_at < $4)
              + (SELECT count(*) FROM compensation_events e WHERE e.kind = 'PROVIDER_REFUND' AND e.payload->>'provider' = $2
                    AND e.created_at >= $3 AND e.created_at < $4) AS n",
    )
    .bind::<BigInt, _>(run_id)
    .bind::<Text, _>(provider)
    .bind::<Timestamptz, _>(t0)
    .bind::<Timestamptz, _>(t1)
    .get_result(&mut conn)
    .await?;
    let matched: N = diesel::sql_query(
        "SELECT (SELECT count(*) FROM bill_rows b JOIN payments p ON p.provider_txn_id = b.provider_txn_id AND p.method = $2
                  WHERE b.run_id = $1 AND b.kind = 'PAYMENT' AND p.online_cents = b.amount_cents)
              + (SELECT count(*) FROM bill_rows b JOIN compensation_events e ON e.kind = 'PROVIDER_REFUND'
                    AND e.payload->>'provider' = $2 AND e.payload->>'refundNo' = b.refund_no
                    AND e.payload->>'orderNo' = b.out_trade_no AND (e.payload->>'amountCents')::bigint = b.amount_cents
                  WHERE b.run_id = $1 AND b.kind = 'REFUND') AS n",
    )
    .bind::<BigInt, _>(run_id)
    .bind::<Text, _>(provider)
    .get_result(&mut conn)
    .await?;
    Ok(Matched {
        local_rows: counts.n,
        matched: matched.n,
        tickets,
    })
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The providers this instance reconciles: those whose callbacks are configured.
fn configured_providers(state: &AppState) -> Vec<&'static str> {
    let mut v = vec![];
    if state.keys.wechat.is_some() {
        v.push("WECHAT_PAY");
    }
    if state.keys.alipay.is_some() {
        v.push("ALIPAY");
    }
    v
}

/// The 02:00 run: yesterday for each configured provider, and any of the last
/// [`CATCH_UP_DAYS`] days that never succeeded and whose bill is there.
pub async fn daily(state: AppState) -> AppResult<i64> {
    let today = Utc::now().with_timezone(&state.config.timezone).date_naive();
    let mut runs = 0;
    for provider in configured_providers(&state) {
        let mut conn = state.pool.get().await?;
        let done: Vec<NaiveDate> = rr::table
            .filter(rr::provider.eq(provider))
            .filter(rr::status.eq("SUCCEEDED"))
            .filter(rr::bill_date.ge(today - chrono::Duration::days(CATCH_UP_DAYS)))
            .select(rr::bill_date)
            .load(&mut conn)
            .await?;
        drop(conn);
        for back in (1..=CATCH_UP_DAYS).rev() {
            let day = today - chrono::Duration::days(back);
            if done.contains(&day) {
                continue;
            }
            let exists = statement_path(&state.config.statement_dir, provider, day).exists();
            // Yesterday's bill must be there; older days are caught up only when it is.
            if back > 1 && !exists {
                continue;
            }
            let r = run(&state, provider, day, None, &TraceId::new()).await?;
            tracing::info!(provider, day = %day, status = %r.status, tickets = r.tickets_opened, "daily reconciliation");
            runs += 1;
        }
    }
    Ok(runs)
}

/// The scheduler's reconciliation task.
pub fn scheduled_tasks() -> Vec<Task> {
    vec![Task {
        name: "reconcile:daily",
        schedule: Schedule::DailyAt { hour: 2, minute: 0 },
        run: |s| Box::pin(daily(s)),
    }]
}
