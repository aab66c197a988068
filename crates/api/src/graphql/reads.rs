//! Which database a request reads: the one place that chooses between the primary and the
//! streaming replica (`FITORDER_READ_DATABASE_URL`, `db::replica`).
//!
//! The replica serves a query whose every root field is one of the admin console's and the ops
//! screen's lists and statistics ([`REPLICA_FIELDS`]), asked by staff, and then all of that
//! request's reads (its nested fields and DataLoader batches too). Everything else reads the
//! primary: mutations, a member's requests (their own orders), single records (`order`,
//! `member`, `exceptionTicket`), subscriptions. A staff viewer's mutation records, in the
//! primary, the WAL position it had reached after committing ([`RecordWrites`]); that viewer's
//! next list reads the replica only once the replica has replayed that far (read-your-writes,
//! whichever `serve` process took the write). A replica that is down, lags past
//! `FITORDER_READ_MAX_LAG`, or has not caught up falls back to the primary, counted in
//! `fitorder_read_replica_fallback_total{reason}`: the caller never sees the difference.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_graphql::parser::types::{OperationDefinition, OperationType, Selection};

use crate::app::AppState;
use crate::auth::{Role, Viewer};
use crate::db::replica::Replica;
use crate::db::{DbConn, DbPool};
use crate::error::AppResult;

/// The root fields a replica may answer: lists and statistics, where a few seconds' lag is
/// what a dashboard shows anyway.
pub const REPLICA_FIELDS: [&str; 10] = [
    "orders",
    "memberships",
    "exceptionTickets",
    "compensationEvents",
    "reconciliationRuns",
    "taskRuns",
    "reconciliationHealing",
    "anomalyStats",
    "stores",
    "__typename",
];

/// One request's reads: the primary, or (decided once, at its first read) the replica.
pub struct Reads {
    primary: DbPool,
    /// The replica and the viewer whose writes it must have replayed; None: the primary only.
    replica: Option<(Arc<Replica>, String)>,
    /// Whether this request reads the replica, decided at its first read.
    decided: tokio::sync::OnceCell<bool>,
}

impl Reads {
    /// Every read on the primary.
    pub fn primary(pool: DbPool) -> Reads {
        Reads {
            primary: pool,
            replica: None,
            decided: tokio::sync::OnceCell::new(),
        }
    }

    /// The reads of the operation `op` by `viewer`: the replica's when one is configured and
    /// the operation is a staff query of lists and statistics only.
    pub fn for_operation(state: &AppState, viewer: Option<&Viewer>, op: &OperationDefinition) -> Reads {
        let mut reads = Reads::primary(state.pool.clone());
        if let (Some(replica), Some(v)) = (&state.replica, viewer) {
            if is_staff(v) && replica_may_answer(op) {
                reads.replica = Some((replica.clone(), writer_key(v)));
            }
        }
        reads
    }

    /// A connection for this request's next read.
    pub async fn conn(&self) -> AppResult<DbConn> {
        if let Some((replica, viewer)) = &self.replica {
            let use_replica = *self
                .decided
                .get_or_init(|| async {
                    // The viewer's last write, from the primary (a failure there fails the
                    // primary read that follows the same way).
                    let after = match self.primary.get().await {
                        Ok(mut c) => match crate::db::replica::last_write(&mut c, viewer).await {
                            Ok(after) => after,
                            Err(_) => return false,
                        },
                        Err(_) => return false,
                    };
                    replica.usable(after.as_deref()).await.is_ok()
                })
                .await;
            if use_replica {
                if let Ok(c) = replica.conn().await {
                    return Ok(c);
                }
            }
        }
        Ok(self.primary.get().await?)
    }
}

fn is_staff(v: &Viewer) -> bool {
    matches!(v.role, Role::Admin | Role::Ops)
}

/// The key a staff viewer's writes are remembered under: the same person on every instance and
/// in every tab of the console.
fn writer_key(v: &Viewer) -> String {
    format!("{}:{}", v.role.as_str(), v.subject)
}

/// A query whose root selects only [`REPLICA_FIELDS`] (fragments at the root are not looked
/// into: such a query reads the primary).
fn replica_may_answer(op: &OperationDefinition) -> bool {
    op.ty == OperationType::Query
        && op.selection_set.node.items.iter().all(|item| match &item.node {
            Selection::Field(f) => REPLICA_FIELDS.contains(&f.node.name.node.as_str()),
            _ => false,
        })
}

/// The schema extension that remembers a staff viewer's writes: after an operation of a
/// document holding a mutation ran, the primary's WAL position (see `db::replica`). Only when a
/// replica is configured; over HTTP and WebSocket alike.
pub(crate) struct RecordWrites;

impl async_graphql::extensions::ExtensionFactory for RecordWrites {
    fn create(&self) -> Arc<dyn async_graphql::extensions::Extension> {
        Arc::new(RecordWritesOf {
            mutation: AtomicBool::new(false),
        })
    }
}

struct RecordWritesOf {
    mutation: AtomicBool,
}

#[async_graphql::async_trait::async_trait]
impl async_graphql::extensions::Extension for RecordWritesOf {
    async fn parse_query(
        &self,
        ctx: &async_graphql::extensions::ExtensionContext<'_>,
        query: &str,
        variables: &async_graphql::Variables,
        next: async_graphql::extensions::NextParseQuery<'_>,
    ) -> async_graphql::ServerResult<async_graphql::parser::types::ExecutableDocument> {
        let doc = next.run(ctx, query, variables).await?;
        let mutation = doc
            .operations
            .iter()
            .any(|(_, op)| op.node.ty == OperationType::Mutation);
        self.mutation.store(mutation, Ordering::Relaxed);
        Ok(doc)
    }

    async fn execute(
        &self,
        ctx: &async_graphql::extensions::ExtensionContext<'_>,
        operation_name: Option<&str>,
        next: async_graphql::extensions::NextExecute<'_>,
    ) -> async_graphql::Response {
        let response = next.run(ctx, operation_name).await;
        if !self.mutation.load(Ordering::Relaxed) {
            return response;
        }
        let (Some(state), Some(request)) = (ctx.data_opt::<AppState>(), ctx.data_opt::<super::RequestContext>()) else {
            return response;
        };
        if let Some(viewer) = request.viewer.as_ref() {
            record_staff_write(state, viewer).await;
        }
        response
    }
}

/// After a mutation by a staff viewer, and only when a replica is configured: the primary's WAL
/// position, so that viewer's next list waits for the replica to have replayed it (or reads the
/// primary). The HTTP route calls this itself (its schema has no extensions); the WebSocket
/// schema through [`RecordWrites`].
pub async fn record_staff_write(state: &AppState, viewer: &Viewer) {
    if !is_staff(viewer) || state.replica.is_none() {
        return;
    }
    let recorded = match state.pool.get().await {
        Ok(mut c) => crate::db::replica::record_write(&mut c, &writer_key(viewer))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = recorded {
        // The write stands; the viewer's next list may read a replica that has not
        // replayed it yet (no older than FITORDER_READ_MAX_LAG).
        tracing::warn!(%error, "could not record a staff write for read-your-writes");
    }
}
