//! One error type for the whole service. Each variant says why it exists; `code()` maps it to
//! the contract's `extensions.code` in one place. A database error converts to INTERNAL unless
//! it is one of the few that mean the same wherever they happen (a lost serialization race, the
//! state-machine trigger's refusal); a constraint refusal means something only where it was
//! expected, so the call site that expects it maps it by name ([`OnViolation`]).
//!
//! What an outside caller reads is [`AppError::public_message`]: an internal error is a stable
//! "internal error" (the trace id says where the detail is logged); [`AppError::message`] is
//! the whole text, for logs and stored rows. How a GraphQL client is told (`extensions`) is the
//! API's (`fitorder-api`'s `graphql::error`): this layer names no GraphQL server crate.

use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::domain::{MembershipStatus, OrderStatus, PrepaidLimit, Refusal, TransitionError};

#[derive(Debug, Clone)]
pub enum AppError {
    /// No token, a bad signature, an expired token or missing claims: the client must log in.
    Unauthenticated(String),
    /// A valid caller whose role or stores do not allow this operation.
    Forbidden(String),
    /// The thing does not exist, or the caller may not know that it does (another member's
    /// order is answered exactly like a missing one).
    NotFound(String),
    /// The request is malformed or asks for something impossible (negative amounts, too many
    /// sessions, a slot that already started).
    BadInput(String),
    /// Input refused for a reason the client acts on (`extensions.reason`: `PHONE_REQUIRED`,
    /// `STORE_REQUIRED`, `RATE_LIMITED`, ..., every one a [`Refusal`]); `BAD_USER_INPUT`. A rate
    /// limit also says when to come back (`extensions.retryAfter`, seconds, and the
    /// `Retry-After` header).
    Refused {
        reason: Refusal,
        message: String,
        retry_after_secs: Option<u64>,
    },
    /// Prepaid money over a rule of the store sold in (docs/prepaid-and-cards.md "Prepaid money"): `BAD_USER_INPUT`,
    /// `extensions.reason` `PREPAID_LIMIT` with the rule (`limit`), its `max` and what the
    /// member holds of that kind already (`current`), for a member app to show as they are.
    PrepaidLimit {
        limit: PrepaidLimit,
        max: i64,
        current: i64,
        message: String,
    },
    /// A prepaid order without the store's current terms accepted: `BAD_USER_INPUT`,
    /// `extensions.reason` `TERMS_NOT_ACCEPTED` with `extensions.currentVersion`.
    TermsNotAccepted { current_version: String },
    /// The state machine refused: the order (or membership card) is not in a status from which
    /// this step exists (`extensions.from`, `extensions.to`).
    IllegalTransition(Transition),
    /// The wallet cannot cover the amount.
    InsufficientFunds(String),
    /// No seat or stock unit left.
    SoldOut(String),
    /// A race lost or a key reused with other content: retrying may help, or the caller must
    /// look at what is there now.
    Conflict(String),
    /// A payment provider did not answer, or not with a signed answer: nothing was changed
    /// and the caller may try again (`extensions.reason: PROVIDER_UNAVAILABLE`).
    ProviderUnavailable(String),
    /// The database cannot be reached, its connection was lost (a failover: the primary stopped,
    /// was demoted or no server accepts writes yet), or every pooled connection is busy past the
    /// checkout wait: the caller may retry (`extensions.reason: DATABASE_UNAVAILABLE`; a provider's
    /// notification is answered 5xx). A connection lost at COMMIT may hide a commit that
    /// happened: the idempotency keys make the retry safe.
    Unavailable(String),
    /// Anything else: a bug, the database down. Logged with the trace id; the client sees a
    /// generic message.
    Internal(std::sync::Arc<anyhow::Error>),
}

pub type AppResult<T> = Result<T, AppError>;

impl AppError {
    pub fn code(&self) -> &'static str {
        match self {
            AppError::Unauthenticated(_) => "UNAUTHENTICATED",
            AppError::Forbidden(_) => "FORBIDDEN",
            AppError::NotFound(_) => "NOT_FOUND",
            AppError::BadInput(_)
            | AppError::Refused { .. }
            | AppError::PrepaidLimit { .. }
            | AppError::TermsNotAccepted { .. } => "BAD_USER_INPUT",
            AppError::IllegalTransition { .. } => "ILLEGAL_TRANSITION",
            AppError::InsufficientFunds(_) => "INSUFFICIENT_FUNDS",
            AppError::SoldOut(_) => "SOLD_OUT",
            AppError::Conflict(_) => "CONFLICT",
            AppError::ProviderUnavailable(_) => "INTERNAL",
            AppError::Unavailable(_) => "INTERNAL",
            AppError::Internal(_) => "INTERNAL",
        }
    }

    pub fn illegal(from: OrderStatus, to: OrderStatus) -> AppError {
        AppError::IllegalTransition(Transition::Order { from, to })
    }

    pub fn bad(msg: impl Into<String>) -> AppError {
        AppError::BadInput(msg.into())
    }

    /// `BAD_USER_INPUT` with `extensions.reason`.
    pub fn refused(reason: Refusal, msg: impl Into<String>) -> AppError {
        AppError::Refused {
            reason,
            message: msg.into(),
            retry_after_secs: None,
        }
    }

    /// `BAD_USER_INPUT`, reason `RATE_LIMITED`, to be tried again after `wait` (whole seconds,
    /// rounded up).
    pub fn rate_limited(what: &str, wait: std::time::Duration) -> AppError {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        AppError::Refused {
            reason: Refusal::RateLimited,
            message: format!("too many {what}: try again in {secs} s"),
            retry_after_secs: Some(secs.max(1)),
        }
    }

    pub fn internal(msg: impl std::fmt::Display) -> AppError {
        AppError::Internal(std::sync::Arc::new(anyhow::anyhow!("{msg}")))
    }

    /// The whole text, for the log and for rows read inside (a callback's error, a task run's
    /// detail): an internal error's chain included. Never for an outside caller: that is
    /// [`AppError::public_message`]. (AppError has no Display on purpose: async-graphql converts
    /// any Display type into an error without our `extensions.code`, so the compiler makes sure
    /// every conversion goes through the API's `into_gql`.)
    pub fn message(&self) -> String {
        match self {
            AppError::Internal(e) => format!("internal error: {e:#}"),
            other => other.client_text(),
        }
    }

    /// What an outside caller (a GraphQL client, a provider's callback) may read: a stable
    /// "internal error" for anything internal, file paths cut to their names otherwise.
    pub fn public_message(&self) -> String {
        match self {
            AppError::Internal(_) => "internal error".to_string(),
            other => public_text(&other.client_text()),
        }
    }

    /// The text of the variants written for the client.
    fn client_text(&self) -> String {
        match self {
            AppError::Unauthenticated(m)
            | AppError::Forbidden(m)
            | AppError::BadInput(m)
            | AppError::InsufficientFunds(m)
            | AppError::SoldOut(m)
            | AppError::Conflict(m)
            | AppError::ProviderUnavailable(m)
            | AppError::Unavailable(m) => m.clone(),
            AppError::Refused { message, .. } | AppError::PrepaidLimit { message, .. } => message.clone(),
            AppError::TermsNotAccepted { current_version } => format!(
                "this store sells prepaid money only to members who accepted its terms (version {current_version})"
            ),
            AppError::NotFound(what) => format!("{what} not found"),
            AppError::IllegalTransition(t) => format!("illegal transition {t}"),
            AppError::Internal(_) => "internal error".to_string(),
        }
    }
}

impl From<anyhow::Error> for AppError {
    fn from(e: anyhow::Error) -> Self {
        AppError::Internal(std::sync::Arc::new(e))
    }
}

/// A required text input, trimmed: refuses empty or longer than `max` bytes with a message
/// naming the field.
pub fn required_text<'a>(value: &'a str, max: usize, what: &str) -> AppResult<&'a str> {
    let v = value.trim();
    if v.is_empty() || v.len() > max {
        return Err(AppError::BadInput(format!("{what} must be 1 to {max} characters")));
    }
    Ok(v)
}

/// A status change a state machine refused: an order's or a membership card's, with the
/// statuses it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Order {
        from: OrderStatus,
        to: OrderStatus,
    },
    Membership {
        from: MembershipStatus,
        to: MembershipStatus,
    },
}

impl Transition {
    /// The two statuses as stored and shown (`extensions.from`, `extensions.to`).
    pub fn words(self) -> (&'static str, &'static str) {
        match self {
            Transition::Order { from, to } => (from.as_str(), to.as_str()),
            Transition::Membership { from, to } => (from.as_str(), to.as_str()),
        }
    }
}

impl std::fmt::Display for Transition {
    /// `FROM -> TO`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (from, to) = self.words();
        write!(f, "{from} -> {to}")
    }
}

impl From<TransitionError> for AppError {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::Illegal { from, to } => AppError::illegal(from, to),
            TransitionError::NotAllowed { .. } => AppError::Forbidden(e.to_string()),
        }
    }
}

/// A named constraint the database refused a statement with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation<'a> {
    /// A CHECK constraint (SQLSTATE 23514).
    Check(&'a str),
    /// A unique constraint or unique index (SQLSTATE 23505).
    Unique(&'a str),
    /// A foreign key (SQLSTATE 23503).
    ForeignKey(&'a str),
}

impl AppError {
    /// The named constraint this error is the refusal of, if it is one (read from the database
    /// error's SQLSTATE and constraint name, never from its message text).
    pub fn violation(&self) -> Option<Violation<'_>> {
        let AppError::Internal(e) = self else {
            return None;
        };
        let DieselError::DatabaseError(kind, info) = e.downcast_ref::<DieselError>()? else {
            return None;
        };
        let name = info.constraint_name()?;
        match kind {
            DatabaseErrorKind::CheckViolation => Some(Violation::Check(name)),
            DatabaseErrorKind::UniqueViolation => Some(Violation::Unique(name)),
            DatabaseErrorKind::ForeignKeyViolation => Some(Violation::ForeignKey(name)),
            _ => None,
        }
    }
}

/// The constraints a statement is expected to run into, mapped where it runs: a refusal the
/// caller expects becomes what the client is told; any other stays INTERNAL (a bug: its name
/// and the database's text go to the log, never to the caller).
///
/// ```ignore
/// diesel::insert_into(refunds::table)
///     .values(..)
///     .execute(conn)
///     .await
///     .on_violation(|v| match v {
///         Violation::Unique("refunds_one_per_order") => Some(AppError::Conflict("order already refunded".into())),
///         _ => None,
///     })?;
/// ```
pub trait OnViolation<T> {
    fn on_violation(self, expected: impl FnOnce(Violation<'_>) -> Option<AppError>) -> AppResult<T>;
}

impl<T, E: Into<AppError>> OnViolation<T> for Result<T, E> {
    fn on_violation(self, expected: impl FnOnce(Violation<'_>) -> Option<AppError>) -> AppResult<T> {
        self.map_err(|e| {
            let e = e.into();
            e.violation().and_then(expected).unwrap_or(e)
        })
    }
}

/// A state-machine trigger's refusal (SQLSTATE FS001 for orders, FS002 for membership cards,
/// which diesel does not name): its DETAIL is `from=<FROM> to=<TO>`, written by the trigger
/// for this (the statuses are words of the column's CHECK, so they parse).
fn trigger_refusal(info: &dyn diesel::result::DatabaseErrorInformation) -> Option<AppError> {
    let detail = info.details()?;
    let (from, to) = detail.strip_prefix("from=")?.split_once(" to=")?;
    let (from, to) = (from.trim(), to.trim());
    let message = info.message();
    let transition = if message.starts_with("illegal order transition: ") {
        Transition::Order {
            from: OrderStatus::parse(from)?,
            to: OrderStatus::parse(to)?,
        }
    } else if message.starts_with("illegal membership transition: ") {
        Transition::Membership {
            from: MembershipStatus::parse(from)?,
            to: MembershipStatus::parse(to)?,
        }
    } else {
        return None;
    };
    Some(AppError::IllegalTransition(transition))
}

impl From<DieselError> for AppError {
    fn from(e: DieselError) -> Self {
        match &e {
            DieselError::NotFound => return AppError::NotFound("record".into()),
            DieselError::DatabaseError(DatabaseErrorKind::SerializationFailure, _) => {
                return AppError::Conflict("concurrent update, please retry".into())
            }
            DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) => {
                if let Some(refused) = trigger_refusal(info.as_ref()) {
                    return refused;
                }
                if server_going_away(info.message()) {
                    return database_lost(&e);
                }
            }
            // No SQLSTATE (the socket closed, the server vanished): the pool drops that
            // connection by itself (it reports itself broken).
            DieselError::DatabaseError(
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
                _,
            )
            | DieselError::BrokenTransactionManager => return database_lost(&e),
            // A server that no longer takes writes (a primary draining before its demotion, a
            // standby): its connections stay open, so the pools are told not to reuse them.
            DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _) => {
                let since = lost_clock().elapsed().as_micros();
                READ_ONLY_MET_AT.fetch_max(u64::try_from(since).unwrap_or(u64::MAX - 1) + 1, Ordering::Relaxed);
                return database_lost(&e);
            }
            _ => {}
        }
        // Constraint refusals included: the call sites that expect one map it (`OnViolation`);
        // one nobody expected is a bug.
        AppError::Internal(std::sync::Arc::new(anyhow::Error::new(e)))
    }
}

/// What a caller is told when the database went away under a statement (the detail is logged).
fn database_lost(e: &DieselError) -> AppError {
    tracing::warn!(error = %e, "database connection lost or read-only");
    AppError::Unavailable(DATABASE_UNAVAILABLE.into())
}

use std::sync::atomic::{AtomicU64, Ordering};

/// When a statement last met a server that takes no writes: microseconds after [`lost_clock`]
/// plus one (0: never). One per process: in production every pool of a process leads to the
/// same primary.
static READ_ONLY_MET_AT: AtomicU64 = AtomicU64::new(0);

fn lost_clock() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// Whether a connection made at `created` predates the last time a statement met a server that
/// takes no writes (a failover under way): then it may lead to the old primary, and the pool
/// discards it instead of handing it out again.
pub fn made_before_read_only_met(created: std::time::Instant) -> bool {
    let lost = READ_ONLY_MET_AT.load(Ordering::Relaxed);
    if lost == 0 {
        return false;
    }
    // Made in the same microsecond counts as before (one connection made anew, at worst).
    let made = created.saturating_duration_since(lost_clock()).as_micros();
    u64::try_from(made).unwrap_or(u64::MAX) < lost
}

const DATABASE_UNAVAILABLE: &str = "the service is busy or its database is unavailable; try again shortly";

/// Whether a server error (one diesel does not name: its SQLSTATE is not kept) says the server
/// is stopping or not yet serving: `admin_shutdown` (57P01: a fast shutdown, a switchover's
/// demotion, or its postmaster killed), `crash_shutdown` (57P02), `cannot_connect_now` (57P03).
/// PostgreSQL's English texts (the server's `lc_messages`; a translated server's errors stay
/// INTERNAL, their connection is dropped all the same).
fn server_going_away(message: &str) -> bool {
    const TEXTS: [&str; 6] = [
        "terminating connection due to administrator command",
        "terminating connection due to unexpected postmaster exit",
        "terminating connection because of crash of another server process",
        "the database system is shutting down",
        "the database system is starting up",
        "the database system is in recovery mode",
    ];
    TEXTS.iter().any(|t| message.starts_with(t))
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for AppError {
    fn from(e: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        // The detail (a timeout, a refused connection) is for the log, not the caller.
        tracing::warn!(error = %e, "no database connection");
        AppError::Unavailable(DATABASE_UNAVAILABLE.into())
    }
}

/// A message as outside callers may read it: file system paths are cut to their file name
/// (`/srv/fitorder/statements/wechat-2026-12-01.csv: No such file` -> `wechat-2026-12-01.csv: ...`).
pub fn public_text(message: &str) -> String {
    if !message.contains('/') {
        return message.to_string();
    }
    message
        .split(' ')
        .map(|word| {
            let bare = word.trim_start_matches(['"', '\'', '(', '[']);
            if bare.starts_with('/') || bare.starts_with("./") || bare.starts_with("../") || bare.starts_with("~/") {
                let lead = &word[..word.len() - bare.len()];
                let name = bare.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
                format!("{lead}{name}")
            } else {
                word.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod public_text_tests {
    use super::public_text;

    #[test]
    fn paths_are_cut_to_file_names() {
        assert_eq!(
            public_text("bill /srv/fitorder/statements/wechat-2026-12-01.csv: No such file or directory (os error 2)"),
            "bill wechat-2026-12-01.csv: No such file or directory (os error 2)"
        );
        assert_eq!(public_text("reading \"./statements/a.csv\""), "reading \"a.csv\"");
        assert_eq!(public_text("1 -> 2 and a/b"), "1 -> 2 and a/b");
    }
}

#[cfg(test)]
mod violation_tests {
    use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error as DieselError};

    use super::{AppError, OnViolation, Violation};

    /// A database refusal as PostgreSQL reports one.
    struct Refusal {
        message: &'static str,
        detail: Option<&'static str>,
        constraint: Option<&'static str>,
    }

    impl DatabaseErrorInformation for Refusal {
        fn message(&self) -> &str {
            self.message
        }
        fn details(&self) -> Option<&str> {
            self.detail
        }
        fn hint(&self) -> Option<&str> {
            None
        }
        fn table_name(&self) -> Option<&str> {
            None
        }
        fn column_name(&self) -> Option<&str> {
            None
        }
        fn constraint_name(&self) -> Option<&str> {
            self.constraint
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn refused(kind: DatabaseErrorKind, constraint: &'static str) -> DieselError {
        DieselError::DatabaseError(
            kind,
            Box::new(Refusal {
                message: "new row for relation \"orders\" violates check constraint",
                detail: Some("Failing row contains (1, FS20261201000001, ...)."),
                constraint: Some(constraint),
            }),
        )
    }

    #[test]
    fn a_database_going_away_is_unavailable() {
        let lost = |kind, message: &'static str| {
            AppError::from(DieselError::DatabaseError(
                kind,
                Box::new(Refusal {
                    message,
                    detail: None,
                    constraint: None,
                }),
            ))
        };
        for (kind, message) in [
            (
                DatabaseErrorKind::Unknown,
                "terminating connection due to administrator command",
            ),
            (
                DatabaseErrorKind::Unknown,
                "terminating connection due to unexpected postmaster exit",
            ),
            (DatabaseErrorKind::Unknown, "the database system is shutting down"),
            (DatabaseErrorKind::UnableToSendCommand, "connection closed"),
            (DatabaseErrorKind::ClosedConnection, "connection closed"),
            (
                DatabaseErrorKind::ReadOnlyTransaction,
                "cannot execute INSERT in a read-only transaction",
            ),
        ] {
            let made = std::time::Instant::now();
            let e = lost(kind, message);
            if kind == DatabaseErrorKind::ReadOnlyTransaction {
                // Connections made before are not handed out again; those made after are.
                assert!(super::made_before_read_only_met(made));
                std::thread::sleep(std::time::Duration::from_millis(1));
                assert!(!super::made_before_read_only_met(std::time::Instant::now()));
            }
            assert!(matches!(e, AppError::Unavailable(_)), "{message}: {e:?}");
            assert_eq!(e.code(), "INTERNAL");
            assert!(!e.public_message().contains(message));
        }
        // Any other server error stays a bug.
        let e = lost(DatabaseErrorKind::Unknown, "division by zero");
        assert!(matches!(e, AppError::Internal(_)));
    }

    #[test]
    fn an_unexpected_constraint_is_internal_and_only_the_log_has_its_name() {
        for kind in [
            DatabaseErrorKind::CheckViolation,
            DatabaseErrorKind::UniqueViolation,
            DatabaseErrorKind::ForeignKeyViolation,
        ] {
            let e = AppError::from(refused(kind, "orders_refund_in_range"));
            assert_eq!(e.code(), "INTERNAL");
            assert_eq!(e.public_message(), "internal error");
            // What a GraphQL client is told of it: `graphql::error`'s tests in the API.
            let all = e.public_message();
            for inside in ["orders_refund_in_range", "violates", "Failing row"] {
                assert!(!all.contains(inside), "{inside} reached the caller: {all}");
            }
            // The whole text is kept for the log and the rows people read inside.
            assert!(e.message().contains("violates check constraint"), "{}", e.message());
        }
    }

    #[test]
    fn an_expected_constraint_is_what_its_call_site_says_by_kind_and_name() {
        let expect = |v: Violation<'_>| match v {
            Violation::Unique("refunds_one_per_order") => Some(AppError::Conflict("order already refunded".into())),
            _ => None,
        };
        let r: Result<(), DieselError> = Err(refused(DatabaseErrorKind::UniqueViolation, "refunds_one_per_order"));
        let e = r.on_violation(expect).unwrap_err();
        assert_eq!(
            (e.code(), e.public_message().as_str()),
            ("CONFLICT", "order already refunded")
        );
        // Already an AppError (converted inside a transaction): the same.
        let r: Result<(), AppError> = Err(refused(DatabaseErrorKind::UniqueViolation, "refunds_one_per_order").into());
        assert_eq!(r.on_violation(expect).unwrap_err().code(), "CONFLICT");
        // Another constraint, or the same name of another kind, is not what was expected.
        for (kind, name) in [
            (DatabaseErrorKind::UniqueViolation, "payments_one_per_order"),
            (DatabaseErrorKind::CheckViolation, "refunds_one_per_order"),
        ] {
            let r: Result<(), DieselError> = Err(refused(kind, name));
            assert_eq!(r.on_violation(expect).unwrap_err().code(), "INTERNAL", "{name}");
        }
        // Errors that are no refusal pass through unchanged.
        let r: Result<(), DieselError> = Err(DieselError::NotFound);
        assert_eq!(r.on_violation(expect).unwrap_err().code(), "NOT_FOUND");
    }

    #[test]
    fn the_state_machine_triggers_refusal_is_an_illegal_transition() {
        let e = AppError::from(DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(Refusal {
                message: "illegal order transition: PAID -> WAIT_PAY",
                detail: Some("from=PAID to=WAIT_PAY"),
                constraint: None,
            }),
        ));
        assert_eq!(e.code(), "ILLEGAL_TRANSITION");
        assert_eq!(e.public_message(), "illegal transition PAID -> WAIT_PAY");
    }
}
