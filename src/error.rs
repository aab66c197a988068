//! One error type for the whole service. Each variant says why it exists; `code()` maps it to
//! the contract's `extensions.code` in one place, and `From<diesel::result::Error>` turns the
//! database's named refusals (constraints, the state-machine trigger) into client errors.

use async_graphql::ErrorExtensions;
use diesel::result::{DatabaseErrorKind, Error as DieselError};

use crate::domain::{OrderStatus, TransitionError};

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
    /// The state machine refused: the order is not in a status from which this step exists.
    IllegalTransition { from: String, to: String },
    /// The wallet cannot cover the amount.
    InsufficientFunds(String),
    /// No seat or stock unit left.
    SoldOut(String),
    /// A race lost or a key reused with other content: retrying may help, or the caller must
    /// look at what is there now.
    Conflict(String),
    /// The capability exists in the contract but is built by a later piece of work.
    /// A payment provider did not answer, or not with a signed answer: nothing was changed
    /// and the caller may try again (`extensions.reason: PROVIDER_UNAVAILABLE`).
    ProviderUnavailable(String),
    /// The database cannot be reached, or every pooled connection is busy past the checkout
    /// wait: nothing was changed, the caller may retry (`extensions.reason: UNAVAILABLE`).
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
            AppError::BadInput(_) => "BAD_USER_INPUT",
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
        AppError::IllegalTransition {
            from: from.to_string(),
            to: to.to_string(),
        }
    }

    pub fn bad(msg: impl Into<String>) -> AppError {
        AppError::BadInput(msg.into())
    }

    pub fn internal(msg: impl std::fmt::Display) -> AppError {
        AppError::Internal(std::sync::Arc::new(anyhow::anyhow!("{msg}")))
    }

    /// What the client is told. (AppError has no Display on purpose: async-graphql converts
    /// any Display type into an error without our `extensions.code`, so the compiler makes
    /// sure every conversion goes through `extend`.)
    pub fn message(&self) -> String {
        match self {
            AppError::Unauthenticated(m)
            | AppError::Forbidden(m)
            | AppError::BadInput(m)
            | AppError::InsufficientFunds(m)
            | AppError::SoldOut(m)
            | AppError::Conflict(m) => m.clone(),
            AppError::NotFound(what) => format!("{what} not found"),
            AppError::IllegalTransition { from, to } => {
                format!("illegal transition {from} -> {to}")
            }
            AppError::ProviderUnavailable(m) => m.clone(),
            AppError::Unavailable(m) => m.clone(),
            AppError::Internal(e) => format!("internal error: {e:#}"),
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

impl From<TransitionError> for AppError {
    fn from(e: TransitionError) -> Self {
        match e {
            TransitionError::Illegal { from, to } => AppError::illegal(from, to),
            TransitionError::NotAllowed { .. } => AppError::Forbidden(e.to_string()),
        }
    }
}

/// Named constraints that mean "the client asked for something the books cannot allow".
fn constraint_error(name: &str, message: &str) -> Option<AppError> {
    Some(match name {
        "wallet_balance_not_negative" => AppError::InsufficientFunds("wallet balance is too low".into()),
        "wallet_frozen_not_negative" => AppError::Conflict("frozen wallet money was already released".into()),
        "class_pack_stock_not_negative" | "coach_slot_seats_in_range" => AppError::SoldOut("sold out".into()),
        "stores_code_key" => AppError::Conflict("a store with this code exists".into()),
        "members_store_phone_key" => AppError::Conflict("a member with this phone exists in this store".into()),
        "orders_member_idempotency_key" => {
            AppError::Conflict("an order with this idempotency key is being placed".into())
        }
        "orders_sessions_in_range" => AppError::BadInput("not enough sessions left".into()),
        "wallet_ledger_top_up_reference" => AppError::Conflict("top-up reference already used".into()),
        "payments_one_per_order" | "payments_idempotency_key" => AppError::Conflict("order already paid".into()),
        "refunds_one_per_order" => AppError::Conflict("order already refunded".into()),
        "check_ins_order_txn_key" => AppError::Conflict("check-in already recorded".into()),
        _ if message.contains("violates check constraint") => AppError::BadInput(format!("refused: {name}")),
        _ => return None,
    })
}

impl From<DieselError> for AppError {
    fn from(e: DieselError) -> Self {
        match &e {
            DieselError::NotFound => AppError::NotFound("record".into()),
            DieselError::DatabaseError(kind, info) => {
                let message = info.message();
                // The state-machine trigger: `illegal order transition: FROM -> TO`.
                if let Some(rest) = message.strip_prefix("illegal order transition: ") {
                    if let Some((from, to)) = rest.split_once(" -> ") {
                        return AppError::IllegalTransition {
                            from: from.trim().to_string(),
                            to: to.trim().to_string(),
                        };
                    }
                }
                if let Some(name) = info.constraint_name() {
                    if let Some(err) = constraint_error(name, message) {
                        return err;
                    }
                }
                match kind {
                    DatabaseErrorKind::SerializationFailure => {
                        AppError::Conflict("concurrent update, please retry".into())
                    }
                    DatabaseErrorKind::ForeignKeyViolation => {
                        tracing::debug!(error = %message, "foreign key violation");
                        AppError::BadInput("refers to something that does not exist".into())
                    }
                    _ => AppError::Internal(std::sync::Arc::new(anyhow::Error::new(e))),
                }
            }
            _ => AppError::Internal(std::sync::Arc::new(anyhow::Error::new(e))),
        }
    }
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for AppError {
    fn from(e: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        // The detail (a timeout, a refused connection) is for the log, not the caller.
        tracing::warn!(error = %e, "no database connection");
        AppError::Unavailable("the service is busy or its database is unavailable; try again shortly".into())
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

impl From<AppError> for async_graphql::Error {
    fn from(e: AppError) -> Self {
        e.extend()
    }
}

impl ErrorExtensions for AppError {
    fn extend(&self) -> async_graphql::Error {
        let message = match self {
            // Internal details go to the log, not to the client.
            AppError::Internal(inner) => {
                tracing::error!(error = %format!("{inner:#}"), "internal error");
                "internal error".to_string()
            }
            other => public_text(&other.message()),
        };
        async_graphql::Error::new(message).extend_with(|_, ext| {
            ext.set("code", self.code());
            if let AppError::IllegalTransition { from, to } = self {
                ext.set("from", from.as_str());
                ext.set("to", to.as_str());
            }
            if let AppError::Unavailable(_) = self {
                ext.set("reason", "UNAVAILABLE");
            }
            if let AppError::ProviderUnavailable(_) = self {
                ext.set("reason", "PROVIDER_UNAVAILABLE");
            }
        })
    }
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
