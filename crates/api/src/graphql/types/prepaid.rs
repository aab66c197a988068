//! Prepaid money (docs/prepaid-and-cards.md "Prepaid money"): a store's rules and terms, the business calendar,
//! the prepaid ledger.

use async_graphql::{InputObject, SimpleObject};

use super::{Date, PrepaidRulesPreset};
use crate::domain::prepaid::PrepaidRulesRequest;
use crate::domain::PrepaidRules;

/// Money summed over many orders, in cents: a whole number that may pass 2^31 (a JSON number,
/// exact to 2^53)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Long(pub i64);

#[async_graphql::Scalar(name = "Long")]
impl async_graphql::ScalarType for Long {
    fn parse(value: async_graphql::Value) -> async_graphql::InputValueResult<Self> {
        match &value {
            async_graphql::Value::Number(n) => n
                .as_i64()
                .filter(|v| v.unsigned_abs() <= 1 << 53)
                .map(Long)
                .ok_or_else(|| async_graphql::InputValueError::custom("expected a whole number within ±2^53")),
            _ => Err(async_graphql::InputValueError::expected_type(value)),
        }
    }
    fn to_value(&self) -> async_graphql::Value {
        async_graphql::Value::Number(self.0.into())
    }
}

/// The prepaid-money rules a store sells under. Amounts in cents; a null limit is no limit.
#[derive(SimpleObject)]
#[graphql(name = "PrepaidRules")]
pub struct PrepaidRulesNode {
    pub preset: PrepaidRulesPreset,
    pub membership_max_cents: Option<i32>,
    pub membership_max_days: Option<i32>,
    pub sessions_max_cents: Option<i32>,
    pub sessions_max_count: Option<i32>,
    pub top_up_max_cents: Option<i32>,
    pub total_max_cents: Option<i32>,
    /// 0: no cooling-off
    pub cooling_off_days: i32,
    pub refund_within_working_days: i32,
    /// the terms a member must accept before a prepaid order (null: none asked)
    pub terms_version: Option<String>,
}

/// Cents within the rules' bound (¥1,000,000) always fit an Int.
fn small(v: Option<i64>) -> Option<i32> {
    v.map(|c| i32::try_from(c).unwrap_or(i32::MAX))
}

impl From<&PrepaidRules> for PrepaidRulesNode {
    fn from(r: &PrepaidRules) -> Self {
        PrepaidRulesNode {
            preset: r.preset.into(),
            membership_max_cents: small(r.membership_max_cents),
            membership_max_days: r.membership_max_days,
            sessions_max_cents: small(r.sessions_max_cents),
            sessions_max_count: r.sessions_max_count,
            top_up_max_cents: small(r.top_up_max_cents),
            total_max_cents: small(r.total_max_cents),
            cooling_off_days: r.cooling_off_days,
            refund_within_working_days: r.refund_within_working_days,
            terms_version: r.terms_version.clone(),
        }
    }
}

/// Null fields keep the preset's value; CUSTOM starts from NONE.
#[derive(InputObject)]
pub struct PrepaidRulesInput {
    pub preset: PrepaidRulesPreset,
    pub membership_max_cents: Option<i32>,
    pub membership_max_days: Option<i32>,
    pub sessions_max_cents: Option<i32>,
    pub sessions_max_count: Option<i32>,
    pub top_up_max_cents: Option<i32>,
    pub total_max_cents: Option<i32>,
    pub cooling_off_days: Option<i32>,
    pub refund_within_working_days: Option<i32>,
    pub terms_version: Option<String>,
    pub terms_text: Option<String>,
}

impl From<PrepaidRulesInput> for PrepaidRulesRequest {
    fn from(i: PrepaidRulesInput) -> Self {
        PrepaidRulesRequest {
            preset: Some(i.preset.into()),
            membership_max_cents: i.membership_max_cents.map(i64::from),
            membership_max_days: i.membership_max_days,
            sessions_max_cents: i.sessions_max_cents.map(i64::from),
            sessions_max_count: i.sessions_max_count,
            top_up_max_cents: i.top_up_max_cents.map(i64::from),
            total_max_cents: i.total_max_cents.map(i64::from),
            cooling_off_days: i.cooling_off_days,
            refund_within_working_days: i.refund_within_working_days,
            terms_version: i.terms_version,
            terms_text: i.terms_text,
        }
    }
}

#[derive(SimpleObject)]
#[graphql(name = "Terms")]
pub struct TermsNode {
    pub version: String,
    pub text: String,
}

#[derive(SimpleObject)]
#[graphql(name = "BusinessDay")]
pub struct BusinessDayNode {
    pub date: Date,
    pub working: bool,
    /// WEEKDAY, WEEKEND or SET (by setBusinessDays)
    pub source: String,
    pub note: Option<String>,
}

#[derive(InputObject)]
pub struct BusinessDayInput {
    pub date: Date,
    pub working: bool,
    pub note: Option<String>,
}

/// One business day of a store's prepaid money (预收资金). balance = previous balance +
/// collected − earned − refunded.
#[derive(SimpleObject)]
#[graphql(name = "PrepaidDay")]
pub struct PrepaidDayNode {
    pub date: Date,
    pub collected_cents: Long,
    pub earned_cents: Long,
    pub refunded_cents: Long,
    pub balance_cents: Long,
}

impl From<crate::prepaid::ledger::PrepaidDay> for PrepaidDayNode {
    fn from(d: crate::prepaid::ledger::PrepaidDay) -> Self {
        PrepaidDayNode {
            date: Date(d.date),
            collected_cents: Long(d.collected_cents),
            earned_cents: Long(d.earned_cents),
            refunded_cents: Long(d.refunded_cents),
            balance_cents: Long(d.balance_cents),
        }
    }
}
