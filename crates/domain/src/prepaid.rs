//! Prepaid money (预付款): the rules a store sells under, the caps they put on what one member may
//! hold with one business operator (Shanghai's "三限"), the cooling-off period (七天冷静期) and
//! the working-day deadline of its refund. Pure: the callers bring the figures and the calendar.
//!
//! | rule | NONE | SHANGHAI_2025 | BEIJING | CUSTOM |
//! | --- | --- | --- | --- | --- |
//! | membership ¥ / days | — | 5,000 / 731 | — | from NONE |
//! | class pack ¥ / sessions | — | 20,000 / 60 | — | from NONE |
//! | one top-up ¥ | — | 5,000 | — | from NONE |
//! | total held ¥ | — | 20,000 | — | from NONE |
//! | cooling-off days | 0 | 7 | 7 | from NONE |
//! | refund within working days | 5 | 5 | 15 | from NONE |
//!
//! A named preset (SHANGHAI_2025, BEIJING) may be made stricter by an override, never looser
//! (a looser one contradicts the preset: use CUSTOM); NONE takes no override.

use chrono::{Datelike, Duration, NaiveDate, Weekday};

use super::order::OrderKind;
use super::vocabulary::vocabulary;

vocabulary! {
    /// Which city's rules a store sells under (`prepaid_rules.preset`).
    pub enum PrepaidPreset {
        None = "NONE",
        Shanghai2025 = "SHANGHAI_2025",
        Beijing = "BEIJING",
        Custom = "CUSTOM",
    }
}

vocabulary! {
    /// The rule a refusal names (`extensions.limit`).
    pub enum PrepaidLimit {
        MembershipAmount = "MEMBERSHIP_AMOUNT",
        MembershipDays = "MEMBERSHIP_DAYS",
        SessionsAmount = "SESSIONS_AMOUNT",
        SessionsCount = "SESSIONS_COUNT",
        TopUpAmount = "TOP_UP_AMOUNT",
        Total = "TOTAL",
    }
}

/// The rules in force at a store, every value resolved (a `None` limit is no limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepaidRules {
    pub preset: PrepaidPreset,
    pub membership_max_cents: Option<i64>,
    pub membership_max_days: Option<i32>,
    pub sessions_max_cents: Option<i64>,
    pub sessions_max_count: Option<i32>,
    pub top_up_max_cents: Option<i64>,
    pub total_max_cents: Option<i64>,
    pub cooling_off_days: i32,
    pub refund_within_working_days: i32,
    pub terms_version: Option<String>,
    pub terms_text: Option<String>,
}

/// What a chain-wide admin asks for: a preset and the values it overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrepaidRulesRequest {
    pub preset: Option<PrepaidPreset>,
    pub membership_max_cents: Option<i64>,
    pub membership_max_days: Option<i32>,
    pub sessions_max_cents: Option<i64>,
    pub sessions_max_count: Option<i32>,
    pub top_up_max_cents: Option<i64>,
    pub total_max_cents: Option<i64>,
    pub cooling_off_days: Option<i32>,
    pub refund_within_working_days: Option<i32>,
    pub terms_version: Option<String>,
    pub terms_text: Option<String>,
}

/// Bounds of what rules may say (refused beyond them, whatever the preset).
pub const MAX_CAP_CENTS: i64 = 100_000_000;
pub const MAX_CAP_DAYS: i32 = 3660;
pub const MAX_CAP_SESSIONS: i32 = 1000;
pub const MAX_COOLING_OFF_DAYS: i32 = 30;
pub const MAX_REFUND_WORKING_DAYS: i32 = 60;
pub const MAX_TERMS_VERSION_CHARS: usize = 32;
pub const MAX_TERMS_TEXT_CHARS: usize = 20_000;

impl PrepaidRules {
    /// A preset's own values.
    pub fn preset(preset: PrepaidPreset) -> PrepaidRules {
        let none = PrepaidRules {
            preset,
            membership_max_cents: None,
            membership_max_days: None,
            sessions_max_cents: None,
            sessions_max_count: None,
            top_up_max_cents: None,
            total_max_cents: None,
            cooling_off_days: 0,
            refund_within_working_days: 5,
            terms_version: None,
            terms_text: None,
        };
        match preset {
            PrepaidPreset::None | PrepaidPreset::Custom => none,
            // 《上海市体育健身行业预付式消费经营活动监管实施办法（试行）》 art. 8; the 2025 model
            // contracts' cooling-off and 5 working days.
            PrepaidPreset::Shanghai2025 => PrepaidRules {
                membership_max_cents: Some(500_000),
                membership_max_days: Some(731),
                sessions_max_cents: Some(2_000_000),
                sessions_max_count: Some(60),
                top_up_max_cents: Some(500_000),
                total_max_cents: Some(2_000_000),
                cooling_off_days: 7,
                refund_within_working_days: 5,
                ..none
            },
            // Beijing's model contract for fitness: cooling-off, refund within 15 working days.
            PrepaidPreset::Beijing => PrepaidRules {
                cooling_off_days: 7,
                refund_within_working_days: 15,
                ..none
            },
        }
    }

    /// The rules a request stands for: the preset's values with the request's overrides, or
    /// why they may not be.
    pub fn resolve(req: &PrepaidRulesRequest) -> Result<PrepaidRules, String> {
        let preset = req.preset.unwrap_or(PrepaidPreset::None);
        let base = PrepaidRules::preset(preset);
        let named = matches!(preset, PrepaidPreset::Shanghai2025 | PrepaidPreset::Beijing);
        let overrides = [
            req.membership_max_cents.is_some(),
            req.membership_max_days.is_some(),
            req.sessions_max_cents.is_some(),
            req.sessions_max_count.is_some(),
            req.top_up_max_cents.is_some(),
            req.total_max_cents.is_some(),
            req.cooling_off_days.is_some(),
            req.refund_within_working_days.is_some(),
        ];
        if preset == PrepaidPreset::None && overrides.iter().any(|o| *o) {
            return Err("the NONE preset takes no limits: use CUSTOM to set your own".into());
        }
        fn cap<T: Copy + PartialOrd + std::fmt::Display>(
            field: &str,
            asked: Option<T>,
            preset_value: Option<T>,
            range: (T, T),
            named: bool,
        ) -> Result<Option<T>, String> {
            let Some(v) = asked else { return Ok(preset_value) };
            if v < range.0 || v > range.1 {
                return Err(format!("{field} must be between {} and {}", range.0, range.1));
            }
            if let (true, Some(p)) = (named, preset_value) {
                if v > p {
                    return Err(format!(
                        "{field} {v} is looser than the preset's {p}: a preset may only be made stricter (use CUSTOM)"
                    ));
                }
            }
            Ok(Some(v))
        }
        let cooling_off_days = match req.cooling_off_days {
            None => base.cooling_off_days,
            Some(d) if !(0..=MAX_COOLING_OFF_DAYS).contains(&d) => {
                return Err(format!("coolingOffDays must be between 0 and {MAX_COOLING_OFF_DAYS}"))
            }
            Some(d) if named && d < base.cooling_off_days => {
                return Err(format!(
                "coolingOffDays {d} is shorter than the preset's {}: a preset may only be made stricter (use CUSTOM)",
                base.cooling_off_days
            ))
            }
            Some(d) => d,
        };
        let refund_within_working_days = match req.refund_within_working_days {
            None => base.refund_within_working_days,
            Some(d) if !(1..=MAX_REFUND_WORKING_DAYS).contains(&d) => {
                return Err(format!(
                    "refundWithinWorkingDays must be between 1 and {MAX_REFUND_WORKING_DAYS}"
                ))
            }
            Some(d) if named && d > base.refund_within_working_days => {
                return Err(format!(
                    "refundWithinWorkingDays {d} is later than the preset's {}: a preset may only be made stricter (use CUSTOM)",
                    base.refund_within_working_days
                ))
            }
            Some(d) => d,
        };
        let (terms_version, terms_text) = match (&req.terms_version, &req.terms_text) {
            (None, None) => (None, None),
            (Some(v), Some(t)) => {
                let v = v.trim();
                if v.is_empty()
                    || v.chars().count() > MAX_TERMS_VERSION_CHARS
                    || !v
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
                {
                    return Err(format!(
                        "termsVersion must be 1 to {MAX_TERMS_VERSION_CHARS} letters, digits, '.', '-' or '_'"
                    ));
                }
                let t = t.trim();
                if t.is_empty() || t.chars().count() > MAX_TERMS_TEXT_CHARS {
                    return Err(format!("termsText must be 1 to {MAX_TERMS_TEXT_CHARS} characters"));
                }
                (Some(v.to_string()), Some(t.to_string()))
            }
            _ => return Err("termsVersion and termsText go together".into()),
        };
        Ok(PrepaidRules {
            preset,
            membership_max_cents: cap(
                "membershipMaxCents",
                req.membership_max_cents,
                base.membership_max_cents,
                (1, MAX_CAP_CENTS),
                named,
            )?,
            membership_max_days: cap(
                "membershipMaxDays",
                req.membership_max_days,
                base.membership_max_days,
                (1, MAX_CAP_DAYS),
                named,
            )?,
            sessions_max_cents: cap(
                "sessionsMaxCents",
                req.sessions_max_cents,
                base.sessions_max_cents,
                (1, MAX_CAP_CENTS),
                named,
            )?,
            sessions_max_count: cap(
                "sessionsMaxCount",
                req.sessions_max_count,
                base.sessions_max_count,
                (1, MAX_CAP_SESSIONS),
                named,
            )?,
            top_up_max_cents: cap(
                "topUpMaxCents",
                req.top_up_max_cents,
                base.top_up_max_cents,
                (1, MAX_CAP_CENTS),
                named,
            )?,
            total_max_cents: cap(
                "totalMaxCents",
                req.total_max_cents,
                base.total_max_cents,
                (1, MAX_CAP_CENTS),
                named,
            )?,
            cooling_off_days,
            refund_within_working_days,
            terms_version,
            terms_text,
        })
    }

    /// Whether any cap is set (a store without caps costs a placing no count).
    pub fn has_caps(&self) -> bool {
        self.membership_max_cents.is_some()
            || self.membership_max_days.is_some()
            || self.sessions_max_cents.is_some()
            || self.sessions_max_count.is_some()
            || self.top_up_max_cents.is_some()
            || self.total_max_cents.is_some()
    }
}

/// Whether an order of this kind and so many sessions is prepaid money: a card, or a class
/// pack of more than one session. A single session is a purchase.
pub fn is_prepaid(kind: OrderKind, sessions_total: i32) -> bool {
    match kind {
        OrderKind::Membership => true,
        OrderKind::ClassPack => sessions_total > 1,
        OrderKind::PrivateSession => false,
    }
}

/// A refusal: the rule, its maximum and what the member holds of that kind already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    pub limit: PrepaidLimit,
    pub max: i64,
    pub current: i64,
}

/// What a member holds with one operator, of each kind (cents, days, sessions).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Unused value of cards.
    pub membership_cents: i64,
    /// Days of cards not used yet.
    pub membership_days: i64,
    /// Unused value of class packs (of more than one session).
    pub sessions_cents: i64,
    /// Sessions not used yet.
    pub sessions_count: i64,
    /// Wallet money (frozen or not).
    pub wallet_cents: i64,
    /// Everything: cards, packs (waiting MIXED orders less their wallet part) and the wallet.
    pub total_cents: i64,
}

/// What is being added: an order (its kind, amount, days or sessions, and the part the wallet
/// pays, which the wallet already holds), or a top-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adding {
    Order {
        kind: OrderKind,
        amount_cents: i64,
        plan_days: i32,
        sessions: i32,
        wallet_cents: i64,
    },
    TopUp {
        amount_cents: i64,
    },
}

/// Checks `adding` against the rules, the kind's limits first, then the total. `Ok` for
/// anything that is not prepaid money.
pub fn check(rules: &PrepaidRules, held: &Holdings, adding: Adding) -> Result<(), OverLimit> {
    let over = |limit, max: Option<i64>, current: i64, added: i64| match max {
        Some(max) if current.saturating_add(added) > max => Err(OverLimit { limit, max, current }),
        _ => Ok(()),
    };
    let new_money = match adding {
        Adding::Order {
            kind,
            amount_cents,
            plan_days,
            sessions,
            wallet_cents,
        } => {
            if !is_prepaid(kind, sessions) {
                return Ok(());
            }
            match kind {
                OrderKind::Membership => {
                    over(
                        PrepaidLimit::MembershipAmount,
                        rules.membership_max_cents,
                        held.membership_cents,
                        amount_cents,
                    )?;
                    over(
                        PrepaidLimit::MembershipDays,
                        rules.membership_max_days.map(i64::from),
                        held.membership_days,
                        i64::from(plan_days),
                    )?;
                }
                OrderKind::ClassPack => {
                    over(
                        PrepaidLimit::SessionsAmount,
                        rules.sessions_max_cents,
                        held.sessions_cents,
                        amount_cents,
                    )?;
                    over(
                        PrepaidLimit::SessionsCount,
                        rules.sessions_max_count.map(i64::from),
                        held.sessions_count,
                        i64::from(sessions),
                    )?;
                }
                OrderKind::PrivateSession => {}
            }
            amount_cents - wallet_cents
        }
        Adding::TopUp { amount_cents } => {
            // One top-up's own cap: `current` is the wallet money held already.
            if let Some(max) = rules.top_up_max_cents.filter(|max| amount_cents > *max) {
                return Err(OverLimit {
                    limit: PrepaidLimit::TopUpAmount,
                    max,
                    current: held.wallet_cents,
                });
            }
            amount_cents
        }
    };
    over(PrepaidLimit::Total, rules.total_max_cents, held.total_cents, new_money)
}

/// Checks a catalog item a store would sell against its rules: one that no member could ever
/// buy there (above a cap on its own) is refused, with `current` 0.
pub fn check_item(
    rules: &PrepaidRules,
    kind: OrderKind,
    amount_cents: i64,
    plan_days: i32,
    sessions: i32,
) -> Result<(), OverLimit> {
    check(
        rules,
        &Holdings::default(),
        Adding::Order {
            kind,
            amount_cents,
            plan_days,
            sessions,
            wallet_cents: 0,
        },
    )
}

/// The unused value of a card: `amount × unused days ÷ plan days`, rounded down, where the used
/// days are the dates from its first date through `today` (a card not started is unused whole;
/// `frozen_days` of those dates do not count as used).
pub fn card_unused(
    amount_cents: i64,
    plan_days: i32,
    first_date: NaiveDate,
    today: NaiveDate,
    frozen_days: i64,
) -> (i64, i64) {
    let days = i64::from(plan_days.max(1));
    let used = if today < first_date {
        0
    } else {
        ((today - first_date).num_days() + 1 - frozen_days).clamp(0, days)
    };
    let unused = days - used;
    (super::money::pro_rata(amount_cents, unused, days), unused)
}

/// The end of the cooling-off period of an order paid on `paid_date` (business time zone):
/// the start of the date after the `days`-th day after it (the model contracts count from the
/// day after signing). `None` when there is none.
pub fn cooling_off_ends(paid_date: NaiveDate, days: i32) -> Option<NaiveDate> {
    (days > 0).then(|| paid_date + Duration::days(i64::from(days) + 1))
}

/// Whether `date` is a working day: what staff set for it, or Monday to Friday.
pub fn is_working(date: NaiveDate, set: Option<bool>) -> bool {
    set.unwrap_or(!matches!(date.weekday(), Weekday::Sat | Weekday::Sun))
}

/// The `n`-th working day after `from` (`from` itself not counted), on a calendar where `set`
/// says what staff set for a date. The one rule every deadline uses.
pub fn nth_working_day_after(from: NaiveDate, n: i32, set: impl Fn(NaiveDate) -> Option<bool>) -> NaiveDate {
    let mut day = from;
    let mut left = n.max(0);
    // A calendar with no working day at all would loop for ever: a year of holidays ends it.
    let mut guard = 0;
    while left > 0 && guard < 3660 {
        day += Duration::days(1);
        guard += 1;
        if is_working(day, set(day)) {
            left -= 1;
        }
    }
    day
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn presets_and_overrides() {
        let sh = PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::Shanghai2025),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(sh.membership_max_cents, Some(500_000));
        assert_eq!(sh.total_max_cents, Some(2_000_000));
        assert_eq!((sh.cooling_off_days, sh.refund_within_working_days), (7, 5));
        let stricter = PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::Shanghai2025),
            total_max_cents: Some(1_000_000),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(stricter.total_max_cents, Some(1_000_000));
        assert_eq!(stricter.membership_max_days, Some(731));
        let looser = PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::Shanghai2025),
            total_max_cents: Some(3_000_000),
            ..Default::default()
        });
        assert!(looser.unwrap_err().contains("looser"));
        let bj = PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::Beijing),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (bj.cooling_off_days, bj.refund_within_working_days, bj.has_caps()),
            (7, 15, false)
        );
        assert!(PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::Beijing),
            refund_within_working_days: Some(20),
            ..Default::default()
        })
        .is_err());
        assert!(PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::None),
            total_max_cents: Some(1),
            ..Default::default()
        })
        .is_err());
        let custom = PrepaidRules::resolve(&PrepaidRulesRequest {
            preset: Some(PrepaidPreset::Custom),
            total_max_cents: Some(90_000_000),
            cooling_off_days: Some(3),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (
                custom.total_max_cents,
                custom.membership_max_cents,
                custom.cooling_off_days
            ),
            (Some(90_000_000), None, 3)
        );
        for bad in [
            PrepaidRulesRequest {
                preset: Some(PrepaidPreset::Custom),
                total_max_cents: Some(-1),
                ..Default::default()
            },
            PrepaidRulesRequest {
                preset: Some(PrepaidPreset::Custom),
                cooling_off_days: Some(31),
                ..Default::default()
            },
            PrepaidRulesRequest {
                preset: Some(PrepaidPreset::Custom),
                terms_version: Some("v1".into()),
                ..Default::default()
            },
            PrepaidRulesRequest {
                preset: Some(PrepaidPreset::Custom),
                terms_version: Some("v 1".into()),
                terms_text: Some("x".into()),
                ..Default::default()
            },
            PrepaidRulesRequest {
                preset: Some(PrepaidPreset::Custom),
                terms_version: Some("v1".into()),
                terms_text: Some("x".repeat(MAX_TERMS_TEXT_CHARS + 1)),
                ..Default::default()
            },
        ] {
            assert!(PrepaidRules::resolve(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn caps_name_the_rule_and_what_is_held() {
        let sh = PrepaidRules::preset(PrepaidPreset::Shanghai2025);
        let card = |amount, days| Adding::Order {
            kind: OrderKind::Membership,
            amount_cents: amount,
            plan_days: days,
            sessions: 0,
            wallet_cents: 0,
        };
        let none = Holdings::default();
        assert_eq!(check(&sh, &none, card(500_000, 365)), Ok(()));
        assert_eq!(
            check(&sh, &none, card(500_001, 365)).unwrap_err(),
            OverLimit {
                limit: PrepaidLimit::MembershipAmount,
                max: 500_000,
                current: 0
            }
        );
        let held = Holdings {
            membership_cents: 300_000,
            membership_days: 400,
            total_cents: 300_000,
            ..none
        };
        assert_eq!(check(&sh, &held, card(200_000, 331)), Ok(()));
        assert_eq!(
            check(&sh, &held, card(200_000, 332)).unwrap_err(),
            OverLimit {
                limit: PrepaidLimit::MembershipDays,
                max: 731,
                current: 400
            }
        );
        let pack = |amount, sessions| Adding::Order {
            kind: OrderKind::ClassPack,
            amount_cents: amount,
            plan_days: 0,
            sessions,
            wallet_cents: 0,
        };
        assert_eq!(
            check(&sh, &none, pack(2_000_001, 1)),
            Ok(()),
            "a single session is a purchase"
        );
        assert_eq!(
            check(&sh, &none, pack(100, 61)).unwrap_err().limit,
            PrepaidLimit::SessionsCount
        );
        let rich = Holdings {
            wallet_cents: 1_900_000,
            total_cents: 1_900_000,
            ..none
        };
        assert_eq!(
            check(&sh, &rich, pack(200_000, 10)).unwrap_err(),
            OverLimit {
                limit: PrepaidLimit::Total,
                max: 2_000_000,
                current: 1_900_000
            }
        );
        // Paid from the wallet, it moves money the total counts already.
        let from_wallet = Adding::Order {
            kind: OrderKind::ClassPack,
            amount_cents: 200_000,
            plan_days: 0,
            sessions: 10,
            wallet_cents: 200_000,
        };
        assert_eq!(check(&sh, &rich, from_wallet), Ok(()));
        assert_eq!(
            check(&sh, &none, Adding::TopUp { amount_cents: 500_001 })
                .unwrap_err()
                .limit,
            PrepaidLimit::TopUpAmount
        );
        assert_eq!(
            check(&sh, &rich, Adding::TopUp { amount_cents: 100_001 })
                .unwrap_err()
                .limit,
            PrepaidLimit::Total
        );
        assert_eq!(
            check(
                &PrepaidRules::preset(PrepaidPreset::None),
                &rich,
                pack(99_999_999, 1000)
            ),
            Ok(())
        );
    }

    #[test]
    fn cards_unused_by_dates() {
        let first = d("2026-03-01");
        assert_eq!(card_unused(36_500, 365, first, d("2026-02-28"), 0), (36_500, 365));
        assert_eq!(card_unused(36_500, 365, first, first, 0), (36_400, 364));
        assert_eq!(card_unused(36_500, 365, first, d("2026-03-10"), 0), (35_500, 355));
        assert_eq!(card_unused(36_500, 365, first, d("2026-03-10"), 5), (36_000, 360));
        assert_eq!(card_unused(36_500, 365, first, d("2030-01-01"), 0), (0, 0));
    }

    #[test]
    fn cooling_off_and_working_days() {
        // Paid on a Monday: seven days after it end with the next Monday; open until Tuesday 00:00.
        assert_eq!(cooling_off_ends(d("2026-12-07"), 7), Some(d("2026-12-15")));
        assert_eq!(cooling_off_ends(d("2026-12-07"), 0), None);
        // Five working days after Friday 2026-12-04: Mon..Fri of the next week.
        assert_eq!(nth_working_day_after(d("2026-12-04"), 5, |_| None), d("2026-12-11"));
        // 调休: Saturday worked, Monday a holiday.
        let set = |day: NaiveDate| match day.to_string().as_str() {
            "2026-12-05" => Some(true),
            "2026-12-07" => Some(false),
            _ => None,
        };
        assert_eq!(nth_working_day_after(d("2026-12-04"), 1, set), d("2026-12-05"));
        assert_eq!(nth_working_day_after(d("2026-12-04"), 2, set), d("2026-12-08"));
        assert_eq!(nth_working_day_after(d("2026-12-04"), 5, set), d("2026-12-11"));
        assert_eq!(nth_working_day_after(d("2026-12-04"), 0, set), d("2026-12-04"));
    }
}
