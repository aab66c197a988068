//! A membership card's life: the one place that says which status changes a card has and who
//! may ask for each, and the rules of freezing (停卡) and transferring (转卡) it. The database
//! trigger `membership_status_guard` (migrations/…_membership_operations/up.sql) holds the same
//! pairs; `tests/it/state_machine.rs` checks that both agree.
//!
//! ```text
//! ACTIVE ──freeze──> FROZEN ──unfreeze / freeze ends──> ACTIVE
//! ACTIVE ──validity ends──> EXPIRED          ACTIVE, FROZEN ──order refunded──> REVOKED
//! ```
//!
//! A transfer and a freeze that is only scheduled change no status: they are events of the
//! card's history ([`MembershipEventKind`]) all the same.

use chrono::NaiveDate;

use super::actor::ActorKind;
use super::refusal::Refusal;
use super::vocabulary::vocabulary;

vocabulary! {
    /// ACTIVE while paid for and usable (between its dates); FROZEN while a freeze runs (no
    /// check-in, no door); EXPIRED once over; REVOKED when its order was refunded.
    pub enum MembershipStatus {
        Active = "ACTIVE",
        Frozen = "FROZEN",
        Expired = "EXPIRED",
        Revoked = "REVOKED",
    }
}

vocabulary! {
    /// What happened to a card (`Membership.history`).
    pub enum MembershipEventKind {
        Started = "STARTED",
        Frozen = "FROZEN",
        Unfrozen = "UNFROZEN",
        Transferred = "TRANSFERRED",
        Expired = "EXPIRED",
        Revoked = "REVOKED",
    }
}

vocabulary! {
    /// Where one freeze stands: waiting for its first day, running (the card FROZEN), done (on
    /// time or early), or called off before it started (it counts against no limit).
    pub enum FreezeState {
        Scheduled = "SCHEDULED",
        Running = "RUNNING",
        Done = "DONE",
        CalledOff = "CALLED_OFF",
    }
}

/// Every status change a card has, with the actors allowed to cause it and what it means.
/// Reading this table is reading the whole lifecycle. A card is born ACTIVE (its order paid).
pub const TRANSITIONS: &[(MembershipStatus, MembershipStatus, &[ActorKind], &str)] = {
    use ActorKind::*;
    use MembershipStatus::*;
    &[
        // A freeze from today starts at once (the member for their own card, or staff); a
        // scheduled one at the start of its first day (the scheduler).
        (Active, Frozen, &[Member, Admin, System], "freeze started"),
        // Ended early on request, or at the start of the day after its last (the scheduler).
        (Frozen, Active, &[Member, Admin, System], "freeze ended"),
        // The validity is over (the scheduler; a frozen card does not expire).
        (Active, Expired, &[System], "validity over"),
        // Its order refunded (staff, ops closing a ticket, the member's cooling-off refund).
        (Active, Revoked, &[Member, Admin, Ops], "order refunded"),
        (Frozen, Revoked, &[Member, Admin, Ops], "order refunded"),
    ]
};

/// A status change nobody may make, or not this actor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipTransitionError {
    #[error("illegal membership transition {from} -> {to}")]
    Illegal {
        from: MembershipStatus,
        to: MembershipStatus,
    },
    #[error("{actor:?} may not move a membership {from} -> {to}")]
    NotAllowed {
        from: MembershipStatus,
        to: MembershipStatus,
        actor: ActorKind,
    },
}

/// Decides whether `actor` may move a card from `from` to `to` (the same status: no change,
/// always allowed, as a transfer is).
pub fn check(from: MembershipStatus, to: MembershipStatus, actor: ActorKind) -> Result<(), MembershipTransitionError> {
    if from == to {
        return Ok(());
    }
    match TRANSITIONS.iter().find(|(f, t, ..)| *f == from && *t == to) {
        None => Err(MembershipTransitionError::Illegal { from, to }),
        Some((_, _, actors, _)) if !actors.contains(&actor) => {
            Err(MembershipTransitionError::NotAllowed { from, to, actor })
        }
        Some(_) => Ok(()),
    }
}

impl MembershipStatus {
    /// Statuses reachable in one step, whoever asks.
    pub fn allowed_next(self) -> Vec<MembershipStatus> {
        TRANSITIONS
            .iter()
            .filter(|(from, ..)| *from == self)
            .map(|(_, to, ..)| *to)
            .collect()
    }

    pub fn is_final(self) -> bool {
        self.allowed_next().is_empty()
    }
}

/// A plan's freezing limits when it sets none (docs/prepaid-and-cards.md "Freezing and transferring cards").
pub const DEFAULT_MAX_FREEZE_DAYS: i32 = 30;
pub const DEFAULT_MAX_FREEZES: i32 = 3;
/// The most days one freeze may ask for (a year); the plan's total caps it further.
pub const MAX_FREEZE_REQUEST_DAYS: i32 = 366;

/// One freeze of a card as the rules see it: its days `[from, until)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreezeSpan {
    pub from: NaiveDate,
    pub until: NaiveDate,
}

impl FreezeSpan {
    pub fn days(self) -> i64 {
        (self.until - self.from).num_days()
    }
    fn overlaps(self, other: FreezeSpan) -> bool {
        self.from < other.until && other.from < self.until
    }
}

/// Why a freeze is refused: each is `BAD_USER_INPUT` with this `reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FreezeRefusal {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Limit(String),
    #[error("the card is {0}: only a card in use can be frozen")]
    NotActive(MembershipStatus),
}

impl FreezeRefusal {
    /// The `extensions.reason` a client reads.
    pub fn reason(&self) -> Refusal {
        match self {
            FreezeRefusal::BadRequest(_) => Refusal::InvalidFreeze,
            FreezeRefusal::Limit(_) => Refusal::FreezeLimit,
            FreezeRefusal::NotActive(_) => Refusal::MembershipNotActive,
        }
    }
}

/// What a freeze request is checked against: the card and the freezes it has (called-off ones
/// left out by the caller), all dates in the business time zone.
#[derive(Debug, Clone)]
pub struct FreezeCheck<'a> {
    pub status: MembershipStatus,
    pub today: NaiveDate,
    /// The card's first day and its first day no longer valid (`validTo`'s date, or the day
    /// after when `validTo` is not at midnight: a started day is a day of the card).
    pub first_day: NaiveDate,
    pub end_day: NaiveDate,
    pub max_freeze_days: i32,
    pub max_freezes: i32,
    pub freezes: &'a [FreezeSpan],
}

/// Decides a freeze of `days` days from `from`: the span it would take, or why not. A freeze
/// starts today or later, on a day of the card (not before its first day, before its end),
/// for whole days (1 … [`MAX_FREEZE_REQUEST_DAYS`]); it overlaps no other freeze, and the
/// card's freezes stay within the plan's `maxFreezes` and `maxFreezeDays`.
pub fn check_freeze(c: &FreezeCheck<'_>, from: NaiveDate, days: i32) -> Result<FreezeSpan, FreezeRefusal> {
    // A frozen card may have its next freeze scheduled (after the running one: they may not
    // overlap); a card that is over or revoked has nothing to freeze.
    if c.status.is_final() {
        return Err(FreezeRefusal::NotActive(c.status));
    }
    if !(1..=MAX_FREEZE_REQUEST_DAYS).contains(&days) {
        return Err(FreezeRefusal::BadRequest(format!(
            "days must be between 1 and {MAX_FREEZE_REQUEST_DAYS}"
        )));
    }
    if from < c.today {
        return Err(FreezeRefusal::BadRequest(format!(
            "a freeze starts today ({}) or later, not {from}",
            c.today
        )));
    }
    if from < c.first_day {
        return Err(FreezeRefusal::BadRequest(format!(
            "the card starts on {}: a freeze starts on a day of the card",
            c.first_day
        )));
    }
    if from >= c.end_day {
        return Err(FreezeRefusal::BadRequest(format!(
            "the card is valid until {}: a freeze starts before its end",
            c.end_day
        )));
    }
    let span = FreezeSpan {
        from,
        until: from + chrono::Duration::days(i64::from(days)),
    };
    if let Some(other) = c.freezes.iter().find(|f| f.overlaps(span)) {
        return Err(FreezeRefusal::Limit(format!(
            "the card is already frozen from {} until {}",
            other.from, other.until
        )));
    }
    if c.freezes.len() as i64 >= i64::from(c.max_freezes) {
        return Err(FreezeRefusal::Limit(format!(
            "the plan allows {} freezes per card; this card has {}",
            c.max_freezes,
            c.freezes.len()
        )));
    }
    let used: i64 = c.freezes.iter().map(|f| f.days()).sum();
    if used + i64::from(days) > i64::from(c.max_freeze_days) {
        return Err(FreezeRefusal::Limit(format!(
            "the plan allows {} frozen days per card; this card has used {used}, {} are left",
            c.max_freeze_days,
            (i64::from(c.max_freeze_days) - used).max(0)
        )));
    }
    Ok(span)
}

/// The span a running freeze keeps when it is ended early on `today`: its days through today
/// (a started day counts), so `until` becomes tomorrow (never later than it was).
pub fn end_early(span: FreezeSpan, today: NaiveDate) -> FreezeSpan {
    let until = (today + chrono::Duration::days(1)).clamp(span.from, span.until);
    FreezeSpan { from: span.from, until }
}

/// The days of `spans` that fall in `[from, to)`: the frozen days of a card's range.
pub fn frozen_days_between(spans: &[FreezeSpan], from: NaiveDate, to: NaiveDate) -> i64 {
    spans
        .iter()
        .map(|s| {
            let a = s.from.max(from);
            let b = s.until.min(to);
            (b - a).num_days().max(0)
        })
        .sum()
}

/// The words of a history row (`MembershipEvent.summary`), English. The workbench shows them in
/// its language by their forms (`CARD_SUMMARIES` in playground/ops/workbench.js, checked by its
/// browser test): a summary changed here is changed there too, or shown as it is.
pub fn freeze_summary(span: FreezeSpan, started: bool) -> String {
    let days = span.days();
    format!(
        "{} {} until {} ({days} day{})",
        if started {
            "frozen from"
        } else {
            "freeze scheduled from"
        },
        span.from,
        span.until,
        if days == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    fn card<'a>(freezes: &'a [FreezeSpan]) -> FreezeCheck<'a> {
        FreezeCheck {
            status: MembershipStatus::Active,
            today: d("2026-12-04"),
            first_day: d("2026-12-01"),
            end_day: d("2027-01-01"),
            max_freeze_days: 30,
            max_freezes: 3,
            freezes,
        }
    }

    #[test]
    fn exactly_the_contract_transitions_exist() {
        use MembershipStatus::*;
        let legal = [
            (Active, Frozen),
            (Frozen, Active),
            (Active, Expired),
            (Active, Revoked),
            (Frozen, Revoked),
        ];
        for from in MembershipStatus::ALL {
            for to in MembershipStatus::ALL {
                let exists = TRANSITIONS.iter().any(|(f, t, ..)| *f == from && *t == to);
                assert_eq!(exists, legal.contains(&(from, to)), "{from} -> {to}");
            }
        }
        assert!(Expired.is_final() && Revoked.is_final());
        assert_eq!(
            check(Frozen, Expired, ActorKind::System),
            Err(MembershipTransitionError::Illegal {
                from: Frozen,
                to: Expired
            })
        );
        assert!(check(Active, Expired, ActorKind::Admin).is_err());
        assert!(check(Active, Frozen, ActorKind::Ops).is_err());
        assert!(check(Active, Active, ActorKind::Admin).is_ok());
    }

    #[test]
    fn freezes_are_checked_against_dates_and_limits() {
        let none = [];
        let ok = check_freeze(&card(&none), d("2026-12-04"), 7).unwrap();
        assert_eq!(ok.until, d("2026-12-11"));
        assert_eq!(ok.days(), 7);
        let past = check_freeze(&card(&none), d("2026-12-03"), 7).unwrap_err();
        assert_eq!(past.reason().as_str(), "INVALID_FREEZE");
        for days in [0, -3, 367] {
            assert_eq!(
                check_freeze(&card(&none), d("2026-12-05"), days)
                    .unwrap_err()
                    .reason()
                    .as_str(),
                "INVALID_FREEZE"
            );
        }
        assert_eq!(
            check_freeze(&card(&none), d("2027-01-01"), 1)
                .unwrap_err()
                .reason()
                .as_str(),
            "INVALID_FREEZE"
        );
        // Over the plan's days, overlapping, over the count.
        assert_eq!(
            check_freeze(&card(&none), d("2026-12-05"), 31)
                .unwrap_err()
                .reason()
                .as_str(),
            "FREEZE_LIMIT"
        );
        let one = [FreezeSpan {
            from: d("2026-12-10"),
            until: d("2026-12-20"),
        }];
        assert_eq!(
            check_freeze(&card(&one), d("2026-12-19"), 2)
                .unwrap_err()
                .reason()
                .as_str(),
            "FREEZE_LIMIT"
        );
        assert!(check_freeze(&card(&one), d("2026-12-20"), 2).is_ok());
        assert!(check_freeze(&card(&one), d("2026-12-05"), 5).is_ok());
        assert_eq!(
            check_freeze(&card(&one), d("2026-12-21"), 21)
                .unwrap_err()
                .reason()
                .as_str(),
            "FREEZE_LIMIT"
        );
        let three = [
            FreezeSpan {
                from: d("2026-12-05"),
                until: d("2026-12-06"),
            },
            FreezeSpan {
                from: d("2026-12-07"),
                until: d("2026-12-08"),
            },
            FreezeSpan {
                from: d("2026-12-09"),
                until: d("2026-12-10"),
            },
        ];
        assert_eq!(
            check_freeze(&card(&three), d("2026-12-20"), 1)
                .unwrap_err()
                .reason()
                .as_str(),
            "FREEZE_LIMIT"
        );
        let mut over = card(&none);
        over.status = MembershipStatus::Expired;
        assert_eq!(
            check_freeze(&over, d("2026-12-20"), 1).unwrap_err().reason().as_str(),
            "MEMBERSHIP_NOT_ACTIVE"
        );
    }

    #[test]
    fn an_early_end_keeps_the_started_days() {
        let s = FreezeSpan {
            from: d("2026-12-01"),
            until: d("2026-12-11"),
        };
        assert_eq!(end_early(s, d("2026-12-04")).until, d("2026-12-05"));
        assert_eq!(end_early(s, d("2026-12-01")).days(), 1);
        assert_eq!(end_early(s, d("2026-12-30")), s);
        assert_eq!(frozen_days_between(&[s], d("2026-12-05"), d("2026-12-31")), 6);
    }
}
