//! Exception tickets: what the system could not settle by itself, handed to staff with the
//! whole story attached. Opened once per finding, however often the finding is made.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::models::{ExceptionTicket, Order};
use crate::db::schema::exception_tickets as et;
use crate::error::AppResult;
use crate::trace::TraceId;

pub struct NewTicket<'a> {
    pub kind: &'a str,
    pub provider: Option<&'a str>,
    pub order: Option<&'a Order>,
    pub order_no: Option<&'a str>,
    pub provider_txn_id: Option<&'a str>,
    pub local_amount_cents: Option<i64>,
    pub provider_amount_cents: Option<i64>,
    pub detail: serde_json::Value,
    /// Makes a finding the same finding: a second open with the same key does nothing.
    pub finding_key: String,
}

/// Opens a ticket unless one exists for the same finding; returns it when newly opened.
pub async fn open(
    conn: &mut AsyncPgConnection,
    t: NewTicket<'_>,
    trace: &TraceId,
) -> AppResult<Option<ExceptionTicket>> {
    let opened: Option<ExceptionTicket> = diesel::insert_into(et::table)
        .values((
            et::kind.eq(t.kind),
            et::provider.eq(t.provider),
            et::order_id.eq(t.order.map(|o| o.id)),
            et::order_no.eq(t.order.map(|o| o.order_no.as_str()).or(t.order_no)),
            et::store_id.eq(t.order.map(|o| o.store_id)),
            et::provider_txn_id.eq(t.provider_txn_id),
            et::local_amount_cents.eq(t.local_amount_cents),
            et::provider_amount_cents.eq(t.provider_amount_cents),
            et::detail.eq(t.detail),
            et::finding_key.eq(&t.finding_key),
            et::trace_id.eq(trace.as_str()),
        ))
        .on_conflict(et::finding_key)
        .do_nothing()
        .returning(ExceptionTicket::as_returning())
        .get_result(conn)
        .await
        .optional()?;
    if let Some(ticket) = &opened {
        tracing::warn!(ticket = ticket.id, kind = t.kind, order_no = ?ticket.order_no, "exception ticket opened");
        metrics::counter!("fitorder_tickets_opened_total", "kind" => t.kind.to_string()).increment(1);
        crate::events::notify_sql(&format!("ticket:{}", ticket.id))
            .execute(conn)
            .await?;
    }
    Ok(opened)
}
