//! Relay-style connections with opaque cursors. Lists are newest first; a cursor is the
//! position (the row id) after which the next page starts.

use async_graphql::{OutputType, SimpleObject};
use base64::Engine;

use super::types::{
    CompensationEventNode, ExceptionTicketNode, MemberNode, MembershipNode, OrderNode, ReconciliationRunNode,
    WalletEntryNode,
};
use crate::error::{AppError, AppResult};

pub const DEFAULT_PAGE: i64 = 20;
pub const MAX_PAGE: i64 = 100;

#[derive(SimpleObject, Clone, Debug, Default)]
pub struct PageInfo {
    pub has_next_page: bool,
    pub has_previous_page: bool,
    pub start_cursor: Option<String>,
    pub end_cursor: Option<String>,
}

#[derive(SimpleObject)]
#[graphql(concrete(name = "OrderEdge", params(OrderNode)))]
#[graphql(concrete(name = "MembershipEdge", params(MembershipNode)))]
#[graphql(concrete(name = "ExceptionTicketEdge", params(ExceptionTicketNode)))]
#[graphql(concrete(name = "CompensationEventEdge", params(CompensationEventNode)))]
#[graphql(concrete(name = "ReconciliationRunEdge", params(ReconciliationRunNode)))]
#[graphql(concrete(name = "MemberEdge", params(MemberNode)))]
#[graphql(concrete(name = "WalletEntryEdge", params(WalletEntryNode)))]
pub struct Edge<T: OutputType> {
    pub cursor: String,
    pub node: T,
}

#[derive(SimpleObject)]
#[graphql(concrete(name = "OrderConnection", params(OrderNode)))]
#[graphql(concrete(name = "MembershipConnection", params(MembershipNode)))]
#[graphql(concrete(name = "ExceptionTicketConnection", params(ExceptionTicketNode)))]
#[graphql(concrete(name = "CompensationEventConnection", params(CompensationEventNode)))]
#[graphql(concrete(name = "ReconciliationRunConnection", params(ReconciliationRunNode)))]
#[graphql(concrete(name = "MemberConnection", params(MemberNode)))]
#[graphql(concrete(name = "WalletEntryConnection", params(WalletEntryNode)))]
pub struct Connection<T: OutputType>
where
    Edge<T>: OutputType,
{
    pub total_count: i32,
    pub page_info: PageInfo,
    pub edges: Vec<Edge<T>>,
}

/// The page size asked for: default 20, capped at 100; negative is an error.
pub fn page_size(first: Option<i32>) -> AppResult<i64> {
    match first {
        None => Ok(DEFAULT_PAGE),
        Some(n) if n < 0 => Err(AppError::bad("first may not be negative")),
        Some(n) => Ok(i64::from(n).min(MAX_PAGE)),
    }
}

pub fn encode_cursor(id: i64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("c1:{id}"))
}

/// Decodes a cursor made by [`encode_cursor`]; anything else is BAD_USER_INPUT.
pub fn decode_cursor(cursor: &str) -> AppResult<i64> {
    let bad = || AppError::bad("after is not a cursor from this API");
    if cursor.len() > 64 {
        return Err(bad());
    }
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.as_bytes())
        .map_err(|_| bad())?;
    let text = std::str::from_utf8(&raw).map_err(|_| bad())?;
    text.strip_prefix("c1:")
        .and_then(|id| id.parse::<i64>().ok())
        .filter(|id| *id > 0)
        .ok_or_else(bad)
}

/// Builds a connection from rows fetched with `limit = first + 1`, newest first.
pub fn build<R, T: OutputType>(
    mut rows: Vec<R>,
    first: i64,
    after: Option<i64>,
    total: i64,
    id_of: impl Fn(&R) -> i64,
    node: impl Fn(R) -> T,
) -> Connection<T>
where
    Edge<T>: OutputType,
{
    let has_next = rows.len() as i64 > first;
    rows.truncate(first as usize);
    let edges: Vec<Edge<T>> = rows
        .into_iter()
        .map(|r| Edge {
            cursor: encode_cursor(id_of(&r)),
            node: node(r),
        })
        .collect();
    Connection {
        total_count: super::count(total),
        page_info: PageInfo {
            has_next_page: has_next,
            has_previous_page: after.is_some(),
            start_cursor: edges.first().map(|e| e.cursor.clone()),
            end_cursor: edges.last().map(|e| e.cursor.clone()),
        },
        edges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        assert_eq!(decode_cursor(&encode_cursor(42)).unwrap(), 42);
        for bad in ["", "abc", "YzE6LTE", "YzE6eA", &"A".repeat(100)] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn page_size_is_capped() {
        assert_eq!(page_size(None).unwrap(), 20);
        assert_eq!(page_size(Some(1000)).unwrap(), 100);
        assert_eq!(page_size(Some(0)).unwrap(), 0);
        assert!(page_size(Some(-1)).is_err());
    }
}
