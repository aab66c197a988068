//! How an [`AppError`] reaches a GraphQL client: its message as outside callers may read it
//! ([`AppError::public_message`]) and `extensions.code` ([`AppError::code`]), with what the
//! variant adds (`reason`, `retryAfter`, `from`/`to`, the prepaid limit's numbers). The one
//! place the lower layers' error becomes async-graphql's; `fitorder-base` names no GraphQL
//! server crate.
//!
//! The orphan rule keeps `From<AppError> for async_graphql::Error` out of this crate, so the
//! resolvers answer [`GqlResult`]: `?` turns an `AppError` (or anything that becomes one) into
//! a [`GqlError`], which async-graphql converts with [`IntoGqlError::into_gql`].

use async_graphql::ErrorExtensions;

use crate::error::{AppError, AppResult};

/// An [`AppError`] on its way to a GraphQL client.
#[derive(Debug, Clone)]
pub struct GqlError(pub AppError);

/// What a resolver answers.
pub type GqlResult<T> = Result<T, GqlError>;

/// `?` in a resolver: whatever becomes an [`AppError`] becomes a [`GqlError`].
macro_rules! into_gql_error {
    ($($from:ty),* $(,)?) => {$(
        impl From<$from> for GqlError {
            fn from(e: $from) -> Self {
                GqlError(AppError::from(e))
            }
        }
    )*};
}

into_gql_error!(
    AppError,
    anyhow::Error,
    diesel::result::Error,
    diesel_async::pooled_connection::deadpool::PoolError,
    crate::domain::TransitionError,
);

impl From<GqlError> for async_graphql::Error {
    fn from(e: GqlError) -> Self {
        e.0.into_gql()
    }
}

/// An [`AppError`]'s result as a resolver answers it: `.gql()` where `?` does not convert (a
/// tail expression; `.gql()?` where async-graphql wants its own error, as a subscription).
pub trait IntoGqlResult<T> {
    fn gql(self) -> GqlResult<T>;
}

impl<T> IntoGqlResult<T> for AppResult<T> {
    fn gql(self) -> GqlResult<T> {
        self.map_err(GqlError)
    }
}

/// The GraphQL error of an [`AppError`] (an extension trait: both types are of other crates).
pub trait IntoGqlError {
    fn into_gql(self) -> async_graphql::Error;
}

impl IntoGqlError for AppError {
    fn into_gql(self) -> async_graphql::Error {
        GqlError(self).extend()
    }
}

impl ErrorExtensions for GqlError {
    fn extend(&self) -> async_graphql::Error {
        let GqlError(e) = self;
        if let AppError::Internal(inner) = e {
            // Internal details go to the log (under the request's trace id), not to the client.
            tracing::error!(error = %format!("{inner:#}"), "internal error");
        }
        let message = e.public_message();
        async_graphql::Error::new(message).extend_with(|_, ext| {
            ext.set("code", e.code());
            if let AppError::IllegalTransition(transition) = e {
                let (from, to) = transition.words();
                ext.set("from", from);
                ext.set("to", to);
            }
            if let AppError::PrepaidLimit {
                limit, max, current, ..
            } = e
            {
                ext.set("reason", "PREPAID_LIMIT");
                ext.set("limit", limit.as_str());
                ext.set("max", *max);
                ext.set("current", *current);
            }
            if let AppError::TermsNotAccepted { current_version } = e {
                ext.set("reason", "TERMS_NOT_ACCEPTED");
                ext.set("currentVersion", current_version.as_str());
            }
            if let AppError::Unavailable(_) = e {
                ext.set("reason", "DATABASE_UNAVAILABLE");
            }
            if let AppError::ProviderUnavailable(_) = e {
                ext.set("reason", "PROVIDER_UNAVAILABLE");
            }
            if let AppError::Refused {
                reason,
                retry_after_secs,
                ..
            } = e
            {
                ext.set("reason", reason.as_str());
                if let Some(secs) = retry_after_secs {
                    ext.set("retryAfter", *secs);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error as DieselError};

    use super::IntoGqlError;
    use crate::domain::{OrderStatus, PrepaidLimit, Refusal};
    use crate::error::AppError;

    /// A database refusal as PostgreSQL reports one.
    struct Refused {
        constraint: &'static str,
    }

    impl DatabaseErrorInformation for Refused {
        fn message(&self) -> &str {
            "new row for relation \"orders\" violates check constraint"
        }
        fn details(&self) -> Option<&str> {
            Some("Failing row contains (1, FS20261201000001, ...).")
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
            Some(self.constraint)
        }
        fn statement_position(&self) -> Option<i32> {
            None
        }
    }

    fn extensions(e: AppError) -> serde_json::Value {
        let told = e.into_gql();
        serde_json::to_value(told.extensions.expect("extensions")).unwrap()
    }

    #[test]
    fn an_unexpected_constraint_reaches_the_client_as_internal_error_only() {
        for kind in [
            DatabaseErrorKind::CheckViolation,
            DatabaseErrorKind::UniqueViolation,
            DatabaseErrorKind::ForeignKeyViolation,
        ] {
            let e = AppError::from(DieselError::DatabaseError(
                kind,
                Box::new(Refused {
                    constraint: "orders_refund_in_range",
                }),
            ));
            let told = e.into_gql();
            assert_eq!(told.message, "internal error");
            let all = format!("{told:?}");
            for inside in ["orders_refund_in_range", "violates", "Failing row"] {
                assert!(!all.contains(inside), "{inside} reached the caller: {all}");
            }
        }
    }

    #[test]
    fn extensions_say_the_code_and_what_the_variant_adds() {
        assert_eq!(
            extensions(AppError::rate_limited(
                "sign-ins",
                std::time::Duration::from_millis(1500)
            )),
            serde_json::json!({"code": "BAD_USER_INPUT", "reason": "RATE_LIMITED", "retryAfter": 2})
        );
        assert_eq!(
            extensions(AppError::refused(
                Refusal::PhoneRequired,
                "a first sign-in needs phoneCode"
            )),
            serde_json::json!({"code": "BAD_USER_INPUT", "reason": "PHONE_REQUIRED"})
        );
        assert_eq!(
            extensions(AppError::illegal(OrderStatus::Paid, OrderStatus::WaitPay)),
            serde_json::json!({"code": "ILLEGAL_TRANSITION", "from": "PAID", "to": "WAIT_PAY"})
        );
        assert_eq!(
            extensions(AppError::PrepaidLimit {
                limit: PrepaidLimit::MembershipDays,
                max: 365,
                current: 300,
                message: "over".into(),
            }),
            serde_json::json!({"code": "BAD_USER_INPUT", "reason": "PREPAID_LIMIT", "limit": "MEMBERSHIP_DAYS", "max": 365, "current": 300})
        );
    }
}
