//! Which unverified callbacks are kept as evidence. Anybody can post to the notify routes, so a
//! row per unsigned post lets a stranger fill the database: per source address and minute the
//! first few are kept whole, beyond that one in [`UNVERIFIED_SAMPLE_EVERY`], and never more
//! than a total a minute. Every refused callback is still counted in
//! `fitorder_callbacks_unverified_total` (and those not kept in
//! `fitorder_callbacks_unverified_dropped_total`).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::Config;
pub use crate::config::UNVERIFIED_SAMPLE_EVERY;
use crate::ratelimit::RateLimiter;

/// Source addresses one process tells apart in a minute (the limiter's memory bound; beyond
/// it new addresses share the sample).
const ADDRESSES: usize = 10_000;

pub struct UnverifiedSampler {
    per_address: RateLimiter,
    total: RateLimiter,
    over: AtomicU64,
}

impl UnverifiedSampler {
    pub fn new(config: &Config) -> UnverifiedSampler {
        let minute = Duration::from_secs(60);
        UnverifiedSampler {
            per_address: RateLimiter::new(config.unverified_callbacks_per_minute, minute, ADDRESSES),
            total: RateLimiter::new(config.unverified_callbacks_per_minute_total, minute, 1),
            over: AtomicU64::new(0),
        }
    }

    /// Whether the refused callback from `source` (None: unknown) is kept as a row.
    pub fn keep(&self, source: Option<IpAddr>) -> bool {
        let key = source.map_or_else(|| "unknown".to_string(), |a| a.to_string());
        let wanted = self.per_address.check(&key).is_ok()
            || self
                .over
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(UNVERIFIED_SAMPLE_EVERY);
        wanted && self.total.check("all").is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_from_one_address_keeps_a_bounded_sample_and_others_keep_theirs() {
        let mut c = Config::for_tests(String::new());
        c.unverified_callbacks_per_minute = 5;
        c.unverified_callbacks_per_minute_total = 1_000;
        let s = UnverifiedSampler::new(&c);
        let flood: IpAddr = "203.0.113.7".parse().unwrap();
        let kept = (0..10_000).filter(|_| s.keep(Some(flood))).count();
        assert_eq!(kept, 5 + 10_000usize.saturating_sub(5).div_ceil(100));
        let other: IpAddr = "198.51.100.1".parse().unwrap();
        assert!((0..5).all(|_| s.keep(Some(other))));
    }
}
