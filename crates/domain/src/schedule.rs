//! When periodic tasks are due. A tick is a fixed instant (the start of an interval, or a time
//! of day in the business time zone), so every instance computes the same tick and the
//! database decides which instance runs it.

use chrono::{DateTime, Duration, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

use super::vocabulary::vocabulary;

vocabulary! {
    /// Where one run of a periodic task stands (`task_runs.status`).
    pub enum TaskRunStatus {
        Running = "RUNNING",
        Succeeded = "SUCCEEDED",
        Failed = "FAILED",
    }
}

/// Until when (local time) a provider's bill that is not made yet is asked for again; then the
/// reconciliation run is FAILED and people are alerted (one alert: the alert sweep's bill-late
/// alert leaves such days to the run's own).
pub const BILL_WAIT_UNTIL: NaiveTime = match NaiveTime::from_hms_opt(18, 0, 0) {
    Some(t) => t,
    None => NaiveTime::MIN,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Every `secs` seconds, aligned to the Unix epoch.
    Every { secs: i64 },
    /// Once a day at `hour:minute` in the time zone.
    DailyAt { hour: u32, minute: u32 },
}

impl Schedule {
    /// The most recent tick at or before `now`.
    pub fn current_tick(self, now: DateTime<Utc>, tz: Tz) -> DateTime<Utc> {
        match self {
            Schedule::Every { secs } => {
                let secs = secs.max(1);
                let t = now.timestamp().div_euclid(secs) * secs;
                Utc.timestamp_opt(t, 0).single().unwrap_or(now)
            }
            Schedule::DailyAt { hour, minute } => {
                let local = now.with_timezone(&tz);
                let at = NaiveTime::from_hms_opt(hour, minute, 0).unwrap_or(NaiveTime::MIN);
                let today = local.date_naive().and_time(at);
                let candidate = tz
                    .from_local_datetime(&today)
                    .earliest()
                    .map(|t| t.with_timezone(&Utc))
                    .unwrap_or(now);
                if candidate <= now {
                    candidate
                } else {
                    let yesterday = today - Duration::days(1);
                    tz.from_local_datetime(&yesterday)
                        .earliest()
                        .map(|t| t.with_timezone(&Utc))
                        .unwrap_or(now)
                }
            }
        }
    }

    /// The first tick after `now`.
    pub fn next_tick(self, now: DateTime<Utc>, tz: Tz) -> DateTime<Utc> {
        match self {
            Schedule::Every { secs } => self.current_tick(now, tz) + Duration::seconds(secs.max(1)),
            Schedule::DailyAt { .. } => {
                let mut probe = now + Duration::hours(1);
                // The next day's tick is within 25 hours (DST days included).
                for _ in 0..26 {
                    let t = self.current_tick(probe, tz);
                    if t > now {
                        return t;
                    }
                    probe += Duration::hours(1);
                }
                now + Duration::days(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn interval_ticks_are_aligned_and_shared() {
        let s = Schedule::Every { secs: 60 };
        let tz = chrono_tz::Asia::Shanghai;
        assert_eq!(
            s.current_tick(at("2026-11-30T08:15:42Z"), tz),
            at("2026-11-30T08:15:00Z")
        );
        assert_eq!(s.next_tick(at("2026-11-30T08:15:42Z"), tz), at("2026-11-30T08:16:00Z"));
        assert_eq!(
            s.current_tick(at("2026-11-30T08:15:00Z"), tz),
            at("2026-11-30T08:15:00Z")
        );
    }

    #[test]
    fn daily_ticks_follow_the_business_time_zone() {
        let s = Schedule::DailyAt { hour: 2, minute: 0 };
        let tz = chrono_tz::Asia::Shanghai;
        // 02:00 in Shanghai is 18:00 UTC the day before.
        assert_eq!(
            s.current_tick(at("2026-11-30T08:00:00Z"), tz),
            at("2026-11-29T18:00:00Z")
        );
        assert_eq!(
            s.current_tick(at("2026-11-29T17:59:59Z"), tz),
            at("2026-11-28T18:00:00Z")
        );
        assert_eq!(s.next_tick(at("2026-11-30T08:00:00Z"), tz), at("2026-11-30T18:00:00Z"));
    }
}
