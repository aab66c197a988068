//! A bill streamed into the `bill_rows` staging table with COPY.

use std::io::BufReader;
use std::path::Path;

use futures_util::SinkExt;

use super::bills::{self, BillKind, BillRow};
use crate::app::AppState;
use crate::domain::Provider;
use crate::error::{AppError, AppResult};

/// Streams the bill into `bill_rows` with COPY. The parser runs on a blocking thread and hands
/// rows over in chunks; an error (with its line) stops everything.
pub(super) async fn load_bill(
    state: &AppState,
    run_id: i64,
    provider: Provider,
    path: &Path,
) -> AppResult<bills::BillSummary> {
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
