//! B4: `fitorder reconcile` of a WeChat Pay trade bill against as many local payments, against
//! COPY of the same bill's rows into a table plus one SQL join giving the same answer.
//!
//! The bill comes through the fetch path (issue 12), as it does in production: the bench's
//! sandbox provider serves it (`publish_bill`, packed before the clock starts) and `fitorder
//! reconcile` without `--file` asks for it (`GET /v3/bill/tradebill`, signed), downloads the
//! gzip, checks its SHA1, unpacks it into the statement directory, then loads and matches.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use chrono::{Duration as Days, FixedOffset, NaiveDate, TimeZone, Utc};
use fitorder::providers::bills::{BillKind, BillRow};
use futures_util::SinkExt;

use crate::env::{connect, run_measured, Bench, CpuSplit};
use crate::report::Row;
use crate::{seed, Sizes};

/// Every this many payments, one is billed for another amount (AMOUNT_MISMATCH) ...
const MISMATCH_EVERY: i64 = 200_000;
/// ... and one is missing from the bill (LOCAL_PAID_PROVIDER_MISSING), replaced in the bill by
/// a payment the books do not have (PROVIDER_PAID_LOCAL_UNPAID), so the bill keeps its size.
const MISSING_EVERY: i64 = 250_000;

fn txn(g: i64) -> String {
    format!("42{g:026}")
}

fn order_no(g: i64) -> String {
    format!("FB4{g:010}")
}

/// The seconds into the business day at which payment `g` was made.
fn second_of_day(g: i64) -> i64 {
    g % 86_000
}

/// The bill of `day`: one row per local payment, with the few differences above.
fn bill_rows(n: i64, day: NaiveDate) -> Vec<BillRow> {
    let midnight = day.and_hms_opt(0, 0, 0).expect("midnight");
    let mut rows = Vec::with_capacity(n as usize);
    for g in 1..=n {
        let missing = g % MISSING_EVERY == 11;
        let (out_trade_no, provider_txn_id) = if missing {
            (format!("FBX{g:010}"), format!("43{g:026}"))
        } else {
            (order_no(g), txn(g))
        };
        rows.push(BillRow {
            line: 0,
            kind: BillKind::Payment,
            out_trade_no,
            provider_txn_id,
            amount_cents: 99_900 + i64::from(g % MISMATCH_EVERY == 7),
            refund_no: None,
            provider_refund_id: None,
            trade_time: Some(midnight + Days::seconds(second_of_day(g))),
        });
    }
    rows
}

async fn seed_payments(db: &tokio_postgres::Client, n: i64, day: NaiveDate) -> Result<()> {
    seed::catalog(db, seed::MEMBERS).await?;
    seed::waiting_orders(db, "FB4", n, seed::MEMBERS, "now() + interval '1 day'").await?;
    // Paid during the business day (Asia/Shanghai, the default FITORDER_TIMEZONE).
    let paid_at =
        format!("('{day} 00:00:00'::timestamp AT TIME ZONE 'Asia/Shanghai') + ({{g}} % 86000) * interval '1 second'");
    seed::pay(db, "FB4", &paid_at).await
}

/// The baseline: COPY of the bill's data rows (as the file has them, CSV with the backtick
/// prefixes) into an unlogged table, then one full join against the day's payments computing
/// what reconciliation reports: matched, other amount, only in the bill, only in the books.
async fn baseline(url: &str, bill: &Path, rows: i64, day: NaiveDate) -> Result<(std::time::Duration, Vec<i64>)> {
    let db = connect(url).await?;
    let cols: Vec<String> = (1..=27).map(|i| format!("c{i} text")).collect();
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS bill_copy; CREATE UNLOGGED TABLE bill_copy ({})",
        cols.join(", ")
    ))
    .await?;
    let started = Instant::now();
    let sink = db.copy_in("COPY bill_copy FROM STDIN (FORMAT csv)").await?;
    futures_util::pin_mut!(sink);
    // The file's data lines: after the header, before the two summary lines.
    let mut reader = BufReader::with_capacity(1 << 20, std::fs::File::open(bill)?);
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line)?;
    let mut chunk = Vec::with_capacity(1 << 20);
    for _ in 0..rows {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            bail!("the bill ended early");
        }
        chunk.extend_from_slice(&line);
        if chunk.len() >= 1 << 20 {
            sink.send(bytes::Bytes::from(std::mem::take(&mut chunk))).await?;
        }
    }
    if !chunk.is_empty() {
        sink.send(bytes::Bytes::from(chunk)).await?;
    }
    sink.finish().await?;
    let r = db
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE b.txn IS NOT NULL AND p.id IS NOT NULL AND b.cents = p.online_cents),
                        count(*) FILTER (WHERE b.txn IS NOT NULL AND p.id IS NOT NULL AND b.cents <> p.online_cents),
                        count(*) FILTER (WHERE p.id IS NULL),
                        count(*) FILTER (WHERE b.txn IS NULL)
                   FROM (SELECT substr(c6, 2) AS txn, (substr(c13, 2)::numeric * 100)::bigint AS cents
                           FROM bill_copy WHERE substr(c10, 2) = 'SUCCESS') b
                   FULL JOIN (SELECT id, provider_txn_id, online_cents FROM payments
                               WHERE method = 'WECHAT_PAY' AND online_cents > 0
                                 AND paid_at >= ('{day} 00:00:00'::timestamp AT TIME ZONE 'Asia/Shanghai')
                                 AND paid_at < ('{day} 00:00:00'::timestamp AT TIME ZONE 'Asia/Shanghai') + interval '1 day') p
                     ON p.provider_txn_id = b.txn"
            ),
            &[],
        )
        .await?;
    let elapsed = started.elapsed();
    db.batch_execute("DROP TABLE bill_copy").await?;
    Ok((
        elapsed,
        (0..4).map(|i| r.try_get::<_, i64>(i)).collect::<Result<_, _>>()?,
    ))
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let n = s.bill_rows;
    // Yesterday in Asia/Shanghai, as the 02:00 run would reconcile.
    let shanghai = FixedOffset::east_opt(8 * 3600).expect("UTC+8");
    let day = shanghai.from_utc_datetime(&Utc::now().naive_utc()).date_naive() - Days::days(1);
    say!("B4: seeding {n} paid orders and writing a {n}-row bill ...");
    let url = bench.fresh_db("b4").await?;
    {
        let db = connect(&url).await?;
        seed_payments(&db, n, day).await?;
    }
    seed::settle(&url).await?;
    {
        let sandbox = bench.sandbox.clone();
        tokio::task::spawn_blocking(move || sandbox.publish_bill("WECHAT_PAY", day, &bill_rows(n, day)))
            .await?
            .context("publishing the bill at the sandbox")?;
    }
    // Where fitorder unpacks what it fetched; it must not find a bill there already (it would
    // read that instead of fetching).
    let bill = fitorder::reconciliation::statement_path(
        &bench.tmp.join("statements"),
        fitorder::domain::Provider::WechatPay,
        day,
    );
    let _ = std::fs::remove_file(&bill);

    say!("B4: fitorder reconcile, the {n}-row bill fetched from the sandbox ...");
    let cmd = bench.fitorder(
        &url,
        &["reconcile", "--provider", "wechatpay", "--date", &day.to_string()],
    );
    let out_path = bench.tmp.join("reconcile.out");
    let err_path = bench.tmp.join("reconcile.err");
    let (out_file, err_file) = (std::fs::File::create(&out_path)?, std::fs::File::create(&err_path)?);
    let tmp = bench.tmp.clone();
    let cpu0 = CpuSplit::sample(0);
    let m = tokio::task::spawn_blocking(move || run_measured(&cmd, out_file, err_file, &tmp)).await??;
    let cpu1 = CpuSplit::sample(0);
    let (status, peak_kb, ours) = (m.status, m.peak_kb, m.wall);
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    if !status.success() {
        bail!("fitorder reconcile failed ({status}): {stdout}{stderr}");
    }
    let summary = stdout.lines().last().unwrap_or_default().to_string();
    let size_mb = std::fs::metadata(&bill)
        .with_context(|| format!("fitorder reconcile left no fetched bill at {}", bill.display()))?
        .len() as f64
        / 1e6;
    // "run N: P provider rows, L local rows, M matched, T tickets opened"
    let number_before = |word: &str| {
        let words: Vec<&str> = summary.split([' ', ',', ':']).filter(|w| !w.is_empty()).collect();
        words
            .windows(2)
            .find(|w| w[1] == word)
            .and_then(|w| w[0].parse::<i64>().ok())
            .unwrap_or(-1)
    };
    let matched = number_before("matched");
    let tickets = number_before("tickets");

    say!("B4: baseline COPY + join ...");
    let (base, counts) = baseline(&url, &bill, n, day).await?;
    // Done with the bill: a `fitorder worker` started later in this run (B6) in the same
    // directory would otherwise reconcile yesterday from it, a million rows, while it is
    // measured.
    let _ = std::fs::remove_file(&bill);
    bench.sandbox.withdraw_bill("WECHAT_PAY", day)?;
    let expected_mismatch = (1..=n)
        .filter(|g| g % MISMATCH_EVERY == 7 && g % MISSING_EVERY != 11)
        .count() as i64;
    let expected_missing = (1..=n).filter(|g| g % MISSING_EVERY == 11).count() as i64;
    let times = ours.as_secs_f64() / base.as_secs_f64();
    let peak_mb = peak_kb as f64 / 1024.0;
    say!(
        "B4: ours {:.2} s, {peak_mb:.1} MB peak RSS; baseline {:.2} s; {times:.2} × baseline; {summary}",
        ours.as_secs_f64(),
        base.as_secs_f64()
    );

    let mut r = Row::new(
        "B4",
        format!("reconciling a {n}-row WeChat trade bill against {n} local payments"),
        "time ≤ 2 × baseline; peak RSS ≤ 200 MB",
    );
    r.ours = format!("{:.2} s, peak RSS {peak_mb:.1} MB", ours.as_secs_f64());
    r.baseline = format!("COPY + one join: {:.2} s", base.as_secs_f64());
    r.ratio = Some(times);
    r.check(format!("{times:.2} × baseline > 2"), times <= 2.0);
    r.check(format!("peak RSS {peak_mb:.0} MB > 200 MB"), peak_kb <= 200 * 1024);
    r.check(
        "same answer as the baseline",
        matched == counts[0]
            && counts[1] == expected_mismatch
            && counts[2] == expected_missing
            && counts[3] == expected_missing
            && tickets == expected_mismatch + 2 * expected_missing,
    );
    r.note(format!(
        "`fitorder reconcile --provider wechatpay --date {day}` as a child process, the bill fetched through the \
         provider's API from the bench's sandbox (signed `GET /v3/bill/tradebill`, download of the gzip, SHA1 \
         check, unpacked into the statement directory), then loaded and matched; wall time from spawn to exit \
         (its own migration check, connection set-up and the fetch included); peak RSS is its ru_maxrss from \
         wait4. It said: \"{summary}\" {}",
        stderr
            .lines()
            .rev()
            .find(|l| l.contains("reconciling"))
            .unwrap_or_default()
            .trim()
    ));
    r.note(format!(
        "the bill ({size_mb:.0} MB unpacked) is written by `dev::bill_writers::write_wechat_bill` in the provider's \
         format and gzipped by the sandbox before the clock starts (`SandboxProvider::publish_bill`); \
         {expected_mismatch} rows bill another amount, {expected_missing} local payments are missing from it and as \
         many bill rows are unknown locally"
    ));
    r.note(format!(
        "baseline: the data lines of the bill fitorder unpacked streamed with COPY … (FORMAT csv) into an unlogged \
         27-column table, then one \
         FULL JOIN with the day's payments counting matched / other amount / bill only / books only = {counts:?}; \
         timed from COPY start to the join's answer"
    ));
    r.note(format!(
        "CPU over {:.1} s wall: fitorder reconcile {:.1} s, PostgreSQL {:.1} s",
        ours.as_secs_f64(),
        m.cpu,
        cpu1.since(&cpu0).postgres
    ));
    Ok(r)
}
