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
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use futures_util::SinkExt;

use crate::app::AppState;
use crate::db::models::ReconciliationRun;
use crate::db::schema::{bill_rows, reconciliation_runs as rr};
use crate::db::sql::StaticQuery;
use crate::domain::{ReconciliationStatus, TicketKind};
use crate::error::{AppError, AppResult, OnViolation, Violation};
use crate::trace::TraceId;
use bills::{BillKind, BillRow, Provider};

/// Days back the daily run catches up when it missed some (a process down over a weekend).
pub const CATCH_UP_DAYS: i64 = 7;

/// Where the bill of `provider` for `date` is found (`wechatpay-2024-05-01.csv`).
pub fn statement_path(dir: &Path, provider: Provider, date: NaiveDate) -> PathBuf {
    dir.join(format!("{}-{}.csv", provider.short_name(), date.format("%Y-%m-%d")))
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
    provider: Provider,
    date: NaiveDate,
    file: Option<PathBuf>,
    trace: &TraceId,
) -> AppResult<ReconciliationRun> {
    let mut conn = state.pool.get().await?;
    let started: ReconciliationRun = diesel::insert_into(rr::table)
        .values((
            rr::provider.eq(provider),
            rr::bill_date.eq(date),
            rr::status.eq(ReconciliationStatus::Running),
            rr::trace_id.eq(trace.as_str()),
        ))
        .returning(ReconciliationRun::as_returning())
        .get_result(&mut conn)
        .await
        .on_violation(|v| match v {
            Violation::Unique("reconciliation_one_running") => Some(AppError::Conflict(format!(
                "a {provider} reconciliation of {date} is already running"
            ))),
            _ => None,
        })?;
    drop(conn);
    let run_id = started.id;
    let mut note = None;
    let path = match file {
        Some(path) => Ok(Some(path)),
        None => match bill_file(state, provider, date, trace).await {
            Ok(Fetched::Ready(path)) => Ok(Some(path)),
            Ok(Fetched::NotMade(why)) => return waiting(state, run_id, provider, date, &why).await,
            Ok(Fetched::NoBill(why)) => {
                note = Some(why);
                Ok(None)
            }
            Err(e) => Err(e),
        },
    };
    let outcome = match path {
        Ok(Some(path)) => match load_bill(state, run_id, provider, &path).await {
            Ok(summary) => match_and_ticket(state, run_id, provider, date, trace)
                .await
                .map(|m| (summary, m)),
            Err(e) => Err(e),
        },
        // No bill because nothing happened: an empty bill. Without a local payment that day
        // the run is empty; every local payment is asked of the provider (and is no finding
        // when it confirms it).
        Ok(None) => match_and_ticket(state, run_id, provider, date, trace)
            .await
            .map(|m| (bills::BillSummary::default(), m)),
        Err(e) => Err(e),
    };
    let note = note.map(|why| {
        let name = statement_path(Path::new(""), provider, date);
        format!(
            "the provider has no bill {} of that day ({why}): reconciled as an empty bill, each local payment asked of the provider",
            name.display()
        )
    });
    let mut conn = state.pool.get().await?;
    diesel::delete(bill_rows::table.filter(bill_rows::run_id.eq(run_id)))
        .execute(&mut conn)
        .await?;
    let finished = match outcome {
        Ok((summary, m)) => {
            metrics::counter!("fitorder_reconciliation_findings_total", "provider" => provider.as_str())
                .increment(m.tickets as u64);
            diesel::update(rr::table.find(run_id))
                .set((
                    rr::status.eq(ReconciliationStatus::Succeeded),
                    rr::finished_at.eq(Utc::now()),
                    rr::provider_rows.eq(summary.rows as i32),
                    rr::local_rows.eq(m.local_rows as i32),
                    rr::matched.eq(m.matched as i32),
                    rr::tickets_opened.eq(m.tickets as i32),
                    rr::error.eq(note),
                ))
                .returning(ReconciliationRun::as_returning())
                .get_result(&mut conn)
                .await?
        }
        Err(e) => {
            let why = e.message();
            tracing::error!(%provider, %date, error = %why, "reconciliation failed");
            diesel::update(rr::table.find(run_id))
                .set((
                    rr::status.eq(ReconciliationStatus::Failed),
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

/// Where a run's bill came from.
enum Fetched {
    /// The bill, under the contract's name in the statement dir.
    Ready(PathBuf),
    /// The provider has not made it yet (its words).
    NotMade(String),
    /// The provider has no bill of that day because nothing happened (its words).
    NoBill(String),
}

/// The bill of `provider` for `date`: the file in the statement dir when it is there (put by
/// staff, or fetched before), else fetched through the provider's gateway and unpacked into
/// that name. Errors say what staff can do.
async fn bill_file(state: &AppState, provider: Provider, date: NaiveDate, trace: &TraceId) -> AppResult<Fetched> {
    let dir = &state.config.statement_dir;
    let path = statement_path(dir, provider, date);
    if path.exists() {
        return Ok(Fetched::Ready(path));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(gateway) = state.providers.gateway(provider) else {
        return Err(AppError::bad(format!(
            "no bill {name} in the statement directory, and {provider} is not configured to fetch it: \
             download the bill from the merchant platform into the statement directory as {name}, then run the \
             reconciliation again"
        )));
    };
    std::fs::create_dir_all(dir).map_err(|e| {
        AppError::internal(format!(
            "the statement directory cannot be created ({}): check FITORDER_STATEMENT_DIR",
            e.kind()
        ))
    })?;
    let fetched = gateway.fetch_bill(date, dir, trace.as_str()).await.map_err(|e| {
        use crate::payments::provider::ProviderError as E;
        let what = match &e {
            E::Unreachable(_) => {
                "the provider did not answer; it is asked again at the next run (or run the \
                                  reconciliation again once it answers)"
            }
            E::Unsigned(_) => {
                "the bill answer is not signed by the provider's key: check the configured platform \
                               public key / certificate; nothing was reconciled"
            }
            E::Refused(_) | E::TradeTaken(_) => {
                "check the merchant account's bill permission and the provider \
                                                 configuration, or download the bill from the merchant platform"
            }
            E::Unsupported(_) => "this provider cannot be fetched: download the bill from the merchant platform",
            E::UnsignedError(_) => {
                "the provider refused the request with the error above (it did not sign it, so nothing was \
                 taken from it): check the merchant configuration it names (keys, serial, app id)"
            }
        };
        AppError::bad(format!(
            "fetching the {provider} bill of {date} failed: {e}. {what} (into {name})"
        ))
    })?;
    let (archive, format) = match fetched {
        crate::payments::provider::BillDownload::NotReady(why) => return Ok(Fetched::NotMade(why)),
        crate::payments::provider::BillDownload::NoBill(why) => return Ok(Fetched::NoBill(why)),
        crate::payments::provider::BillDownload::Downloaded { archive, format } => (archive, format),
    };
    let dest = path.clone();
    let unpacked = tokio::task::spawn_blocking({
        let archive = archive.clone();
        move || -> Result<bills::Unpacked, bills::ArchiveError> {
            let file = std::fs::File::open(&archive)?;
            match format {
                crate::payments::provider::BillArchive::WechatGzip { sha1 } => {
                    bills::unpack_wechat_gz(std::io::BufReader::new(file), &dest, &sha1)
                }
                crate::payments::provider::BillArchive::AlipayZip => bills::unpack_alipay_zip(file, &dest),
            }
        }
    })
    .await
    .map_err(|e| AppError::internal(format!("unpacking the bill crashed: {e}")))?;
    let _ = std::fs::remove_file(&archive);
    let done = unpacked.map_err(|e| {
        let what = match &e {
            bills::ArchiveError::Sha1Mismatch { .. } => {
                "the download is damaged or not the bill the provider signed; nothing was reconciled — run the \
                 reconciliation again to download it anew, and ask the provider if it repeats"
            }
            bills::ArchiveError::Io(_) => "check the statement directory's free space and permissions, then run again",
            _ => {
                "the download is not a bill archive; run the reconciliation again, or download the bill from the \
                  merchant platform"
            }
        };
        AppError::bad(format!(
            "the fetched {provider} bill of {date} was refused: {e}. {what} (into {name})"
        ))
    })?;
    tracing::info!(%provider, %date, bytes = done.bytes, sha1 = %done.sha1, "bill fetched");
    Ok(Fetched::Ready(path))
}

/// The text a WAITING run carries.
pub const WAITING_NOTE: &str = "asked again every 30 minutes until 18:00";

/// Records the run as WAITING: the provider has not made the bill yet. In development mode a
/// day without a sandbox payment has nothing to reconcile: that is said (INFO) and the run is
/// done.
async fn waiting(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    why: &str,
) -> AppResult<ReconciliationRun> {
    let nothing =
        state.config.dev_mode && (why.starts_with("NO_STATEMENT_EXIST") || why.starts_with("isp.bill_not_exist"));
    let (status, text) = if nothing {
        tracing::info!(%provider, %date, "development: the sandbox took no payment that day, nothing to reconcile");
        (
            ReconciliationStatus::Succeeded,
            format!("nothing to reconcile: the sandbox took no payment that day ({why})"),
        )
    } else {
        tracing::info!(%provider, %date, why, "the provider has not made the bill yet: WAITING");
        let name = statement_path(Path::new(""), provider, date);
        (
            ReconciliationStatus::Waiting,
            format!(
                "the provider has not made the bill {} yet ({why}); {WAITING_NOTE}",
                name.display()
            ),
        )
    };
    let mut conn = state.pool.get().await?;
    Ok(diesel::update(rr::table.find(run_id))
        .set((
            rr::status.eq(status),
            rr::finished_at.eq(Utc::now()),
            rr::provider_rows.eq(0),
            rr::local_rows.eq(0),
            rr::matched.eq(0),
            rr::tickets_opened.eq(0),
            rr::error.eq(text),
        ))
        .returning(ReconciliationRun::as_returning())
        .get_result(&mut conn)
        .await?)
}

/// Streams the bill into `bill_rows` with COPY. The parser runs on a blocking thread and hands
/// rows over in chunks; an error (with its line) stops everything.
async fn load_bill(state: &AppState, run_id: i64, provider: Provider, path: &Path) -> AppResult<bills::BillSummary> {
    let file = std::fs::File::open(path).map_err(|e| AppError::bad(format!("bill {}: {e}", path.display())))?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let parser = tokio::task::spawn_blocking(move || {
        let mut chunk = String::with_capacity(128 * 1024);
        let result = bills::parse(provider, BufReader::with_capacity(256 * 1024, file), |row| {
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
    provider: Provider,
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
    conn.batch_execute("ANALYZE bill_rows").await?;
    drop(conn);
    let confirmed = heal(state, run_id, provider, date, t0, t1, trace).await?;
    let mut conn = state.pool.get().await?;
    let findings = [
        include_str!("sql/provider_paid_local_unpaid.sql"),
        include_str!("sql/amount_mismatch.sql"),
        include_str!("sql/local_paid_provider_missing.sql"),
        include_str!("sql/refund_mismatch.sql"),
    ];
    let mut tickets = 0;
    for sql in findings {
        let ids: Vec<Id> = StaticQuery::new(sql)
            .bind::<BigInt, _>(run_id) // $1
            .bind::<Text, _>(provider) // $2
            .bind::<Text, _>(date.to_string()) // $3
            .bind::<Text, _>(trace.as_str()) // $4
            .bind::<Timestamptz, _>(t0) // $5
            .bind::<Timestamptz, _>(t1) // $6
            .bind::<diesel::sql_types::Array<Text>, _>(&confirmed) // $7
            .load(&mut conn)
            .await?;
        for id in &ids {
            crate::events::announce(crate::events::Announced::Ticket, id.id)
                .execute(&mut conn)
                .await?;
        }
        tickets += ids.len() as i64;
    }
    let counts: N = StaticQuery::new(include_str!("sql/local_rows.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<Timestamptz, _>(t0)
        .bind::<Timestamptz, _>(t1)
        .get_result(&mut conn)
        .await?;
    let matched: N = StaticQuery::new(include_str!("sql/matched.sql"))
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
struct TextRow {
    #[diesel(sql_type = Text)]
    v: String,
}

#[derive(diesel::QueryableByName)]
struct Unbooked {
    #[diesel(sql_type = Text)]
    order_no: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    provider_txn_id: Option<String>,
    #[diesel(sql_type = BigInt)]
    amount_cents: i64,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    line: i32,
}

/// At most this many local payments missing from one bill are asked of the provider; the rest
/// become tickets.
const MAX_QUERIES: i64 = 500;

/// At most this many bill payments are settled by one run (memory stays bounded whatever the
/// bill holds); the rest become tickets, and a re-run settles the next ones.
const MAX_HEALS: i64 = 5_000;

/// Settles what is safe before the findings are ticketed, under the run's trace id:
/// - a bill payment for an order still `WAIT_PAY`, for its online amount, is applied as its
///   callback would have been (a recorded evidence row, then `payments::apply`, which moves the
///   order through the state machine and audits it);
/// - a bill payment for a canceled order goes the same way, where it is refunded as a
///   paid-after-cancel;
/// - a local payment missing from the bill is asked of the provider; a signed answer saying it
///   was paid, with the same transaction and amount, is no finding.
///
/// Returns the transaction ids confirmed that way (the missing-payment finding skips them).
/// Each healed item is a `reconciliation_heals` row.
async fn heal(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    t0: chrono::DateTime<Utc>,
    t1: chrono::DateTime<Utc>,
    trace: &TraceId,
) -> AppResult<Vec<String>> {
    use crate::payments::{self, Notice, Outcome, Received};
    use futures_util::StreamExt;
    let mut conn = state.pool.get().await?;
    let unbooked: Vec<Unbooked> = StaticQuery::new(include_str!("sql/unbooked_payments.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<BigInt, _>(MAX_HEALS)
        .load(&mut conn)
        .await?;
    drop(conn);
    for u in unbooked {
        let txn = u.provider_txn_id.clone().unwrap_or_default();
        let body = serde_json::json!({"source": "reconciliation", "billDate": date.to_string(), "line": u.line,
                                      "out_trade_no": u.order_no, "transaction_id": txn, "amount": u.amount_cents})
        .to_string();
        let mut conn = state.pool.get().await?;
        let callback_id = payments::record(
            &mut conn,
            Received {
                provider,
                verified: true,
                event_type: Some("BILL"),
                body: &body,
                headers: serde_json::json!({}),
                error: None,
            },
            Outcome::Received,
            trace,
        )
        .await?;
        drop(conn);
        let notice = Notice::Paid {
            out_trade_no: u.order_no.clone(),
            txn_id: txn.clone(),
            amount_cents: u.amount_cents,
        };
        let action = match payments::apply(state, provider, callback_id, notice, trace).await {
            Ok(Outcome::Applied) => "SETTLED",
            Ok(Outcome::PaidAfterCancel) => "REFUNDED_PAID_AFTER_CANCEL",
            Ok(other) => {
                tracing::warn!(order_no = %u.order_no, outcome = other.as_str(), "bill payment not healed");
                continue;
            }
            Err(e) => {
                tracing::warn!(order_no = %u.order_no, error = %e.message(), "bill payment not healed");
                continue;
            }
        };
        tracing::info!(order_no = %u.order_no, action, "reconciliation healed a bill payment");
        record_heal(
            state,
            run_id,
            provider,
            date,
            TicketKind::ProviderPaidLocalUnpaid,
            action,
            &u.order_no,
            Some(&txn),
            trace,
        )
        .await?;
    }

    // Local payments the bill lacks: asked of the provider.
    if !state.providers.configured(provider) {
        return Ok(vec![]);
    }
    let mut conn = state.pool.get().await?;
    let missing: Vec<Unbooked> = StaticQuery::new(include_str!("sql/missing_from_bill.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<Timestamptz, _>(t0)
        .bind::<Timestamptz, _>(t1)
        .bind::<BigInt, _>(MAX_QUERIES)
        .load(&mut conn)
        .await?;
    drop(conn);
    let answers: Vec<(Unbooked, bool)> = futures_util::stream::iter(missing)
        .map(|m| async move {
            let ok = match state.providers.query(provider, &m.order_no, trace.as_str()).await {
                Ok(crate::payments::provider::TradeState::Paid { txn_id, amount_cents }) => {
                    m.provider_txn_id.as_deref() == Some(txn_id.as_str()) && amount_cents == m.amount_cents
                }
                Ok(_) => false,
                Err(e) => {
                    tracing::warn!(order_no = %m.order_no, error = %e, "asking the provider about a payment missing from the bill");
                    false
                }
            };
            (m, ok)
        })
        .buffer_unordered(8)
        .collect()
        .await;
    // Confirmed by an earlier run of this day: no finding either.
    let mut confirmed: Vec<String> = StaticQuery::new(include_str!("sql/confirmed_by_query.sql"))
        .bind::<Text, _>(provider)
        .bind::<diesel::sql_types::Date, _>(date)
        .load::<TextRow>(&mut state.pool.get().await?)
        .await?
        .into_iter()
        .map(|r| r.v)
        .collect();
    for (m, ok) in answers {
        if ok {
            record_heal(
                state,
                run_id,
                provider,
                date,
                TicketKind::LocalPaidProviderMissing,
                "CONFIRMED_BY_QUERY",
                &m.order_no,
                m.provider_txn_id.as_deref(),
                trace,
            )
            .await?;
            confirmed.push(m.provider_txn_id.unwrap_or_default());
        }
    }
    Ok(confirmed)
}

#[allow(clippy::too_many_arguments)]
async fn record_heal(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    date: NaiveDate,
    category: TicketKind,
    action: &str,
    order_no: &str,
    txn: Option<&str>,
    trace: &TraceId,
) -> AppResult<()> {
    let mut conn = state.pool.get().await?;
    StaticQuery::new(include_str!("sql/record_heal.sql"))
        .bind::<BigInt, _>(run_id)
        .bind::<Text, _>(provider)
        .bind::<diesel::sql_types::Date, _>(date)
        .bind::<Text, _>(category)
        .bind::<Text, _>(action)
        .bind::<Text, _>(order_no)
        .bind::<diesel::sql_types::Nullable<Text>, _>(txn)
        .bind::<Text, _>(trace.as_str())
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// Per finding category in `[from, to)`: how many a reconciliation healed by itself, and how
/// many became tickets for a person; of `stores` only when given.
pub async fn healing(
    conn: &mut diesel_async::AsyncPgConnection,
    from: chrono::DateTime<Utc>,
    to: chrono::DateTime<Utc>,
    stores: Option<Vec<i64>>,
) -> AppResult<Vec<(TicketKind, i64, i64)>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        category: TicketKind,
        #[diesel(sql_type = BigInt)]
        healed: i64,
        #[diesel(sql_type = BigInt)]
        ticketed: i64,
    }
    let rows: Vec<Row> = StaticQuery::new(include_str!("sql/healing.sql"))
        .bind::<Timestamptz, _>(from)
        .bind::<Timestamptz, _>(to)
        .bind::<diesel::sql_types::Nullable<diesel::sql_types::Array<BigInt>>, _>(stores)
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| (r.category, r.healed, r.ticketed)).collect())
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// The providers this instance reconciles: those whose callbacks are configured.
pub fn configured_providers(state: &AppState) -> Vec<Provider> {
    Provider::ALL
        .into_iter()
        .filter(|p| state.keys.configured(*p))
        .collect()
}

pub use crate::domain::schedule::BILL_WAIT_UNTIL as WAIT_UNTIL;

/// How often a WAITING bill is asked for again.
pub const WAIT_RETRY_SECS: i64 = 30 * 60;

/// The run at `FITORDER_RECONCILE_AT`: yesterday for each configured provider, and the missed
/// days of the last [`CATCH_UP_DAYS`] (never run since this provider's first run, or whose
/// bill was put in the statement dir since). Days still WAITING are left to [`retry_waiting`].
pub async fn daily(state: AppState) -> AppResult<i64> {
    let today = Utc::now().with_timezone(&state.config.timezone).date_naive();
    let mut runs = 0;
    for provider in configured_providers(&state) {
        let mut conn = state.pool.get().await?;
        let tried: Vec<(NaiveDate, ReconciliationStatus)> = rr::table
            .filter(rr::provider.eq(provider))
            .filter(rr::bill_date.ge(today - chrono::Duration::days(CATCH_UP_DAYS)))
            .select((rr::bill_date, rr::status))
            .load(&mut conn)
            .await?;
        let first: Option<NaiveDate> = rr::table
            .filter(rr::provider.eq(provider))
            .select(diesel::dsl::min(rr::bill_date))
            .first(&mut conn)
            .await?;
        drop(conn);
        for back in (1..=CATCH_UP_DAYS).rev() {
            let day = today - chrono::Duration::days(back);
            let of_day: Vec<ReconciliationStatus> = tried.iter().filter(|(d, _)| *d == day).map(|(_, s)| *s).collect();
            use ReconciliationStatus::{Running, Succeeded, Waiting};
            if of_day.iter().any(|s| matches!(s, Succeeded | Waiting | Running)) {
                continue;
            }
            let exists = statement_path(&state.config.statement_dir, provider, day).exists();
            let missed = of_day.is_empty() && first.is_some_and(|f| f < day);
            // Yesterday's bill is always asked for; older days when they were missed.
            if back > 1 && !exists && !missed {
                continue;
            }
            let r = run(&state, provider, day, None, &TraceId::new()).await?;
            tracing::info!(%provider, day = %day, status = %r.status, tickets = r.tickets_opened, "daily reconciliation");
            runs += 1;
        }
    }
    Ok(runs)
}

#[derive(diesel::QueryableByName)]
struct Waiting {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    provider: Provider,
    #[diesel(sql_type = diesel::sql_types::Date)]
    bill_date: NaiveDate,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    error: Option<String>,
}

/// Every 30 minutes: the days whose latest run is WAITING are asked for again; from
/// [`WAIT_UNTIL`] on (or once the next day began) they are FAILED, with an alert.
pub async fn retry_waiting(state: AppState) -> AppResult<i64> {
    retry_waiting_at(&state, Utc::now()).await
}

/// [`retry_waiting`] as of `now`.
pub async fn retry_waiting_at(state: &AppState, now: chrono::DateTime<Utc>) -> AppResult<i64> {
    let local = now.with_timezone(&state.config.timezone);
    let mut conn = state.pool.get().await?;
    let waiting: Vec<Waiting> = StaticQuery::new(include_str!("sql/waiting_days.sql"))
        .load(&mut conn)
        .await?;
    drop(conn);
    let mut n = 0;
    for w in waiting {
        let late = local.time() >= WAIT_UNTIL || w.bill_date + chrono::Duration::days(1) < local.date_naive();
        if !late {
            let r = run(state, w.provider, w.bill_date, None, &TraceId::new()).await?;
            tracing::info!(provider = %w.provider, day = %w.bill_date, status = %r.status, "waiting bill asked again");
            n += 1;
            continue;
        }
        let name = statement_path(Path::new(""), w.provider, w.bill_date);
        let why = format!(
            "the provider had not made the bill by {} ({}): download it from the merchant platform into the \
             statement directory as {}, then run the reconciliation again",
            WAIT_UNTIL.format("%H:%M"),
            w.error
                .as_deref()
                .unwrap_or_default()
                .trim_end_matches(WAITING_NOTE)
                .trim_end_matches("; "),
            name.display()
        );
        tracing::error!(provider = %w.provider, day = %w.bill_date, "bill not made by the cut-off: FAILED");
        let mut conn = state.pool.get().await?;
        let updated = diesel::update(
            rr::table
                .find(w.id)
                .filter(rr::status.eq(ReconciliationStatus::Waiting)),
        )
        .set((
            rr::status.eq(ReconciliationStatus::Failed),
            rr::finished_at.eq(Utc::now()),
            rr::error.eq(why),
        ))
        .execute(&mut conn)
        .await?;
        if updated == 1 {
            crate::alerts::reconciliation_run(&mut conn, w.id).await?;
            n += 1;
        }
    }
    Ok(n)
}
