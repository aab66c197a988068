//! The object types of the schema, one file per entity. Nodes wrap database rows; related
//! objects come through the request's DataLoader so that a page of 100 orders costs a handful
//! of statements. The enums are the domain's words, mirrored in [`enums`].

mod catalog;
mod compensation;
pub mod enums;
mod front_desk;
mod member;
mod ops;
mod order;
mod payment;
mod prepaid;
mod session;
mod ticket;

use chrono::NaiveDate;

pub use catalog::*;
pub use compensation::*;
pub use enums::*;
pub use front_desk::*;
pub use member::*;
pub use ops::*;
pub use order::*;
pub use payment::*;
pub use prepaid::*;
pub use session::*;
pub use ticket::*;

use async_graphql::Context;

use crate::auth::Detail;

/// Members see their own things, and less of them than staff (`auth::Detail`: a caller without
/// a token sees what a member does).
fn is_member(ctx: &Context<'_>) -> bool {
    Detail::of(super::request(ctx).viewer.as_ref()) == Detail::Member
}

/// Calendar date, YYYY-MM-DD
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Date(pub NaiveDate);

#[async_graphql::Scalar(name = "Date")]
impl async_graphql::ScalarType for Date {
    fn parse(value: async_graphql::Value) -> async_graphql::InputValueResult<Self> {
        match &value {
            async_graphql::Value::String(s) => NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .map(Date)
                .map_err(|_| async_graphql::InputValueError::custom("expected a date YYYY-MM-DD")),
            _ => Err(async_graphql::InputValueError::expected_type(value)),
        }
    }
    fn to_value(&self) -> async_graphql::Value {
        async_graphql::Value::String(self.0.format("%Y-%m-%d").to_string())
    }
}
