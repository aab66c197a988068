//! When a failed downstream call is tried again.

use std::time::Duration;

/// The most the delay is moved either way, as a fraction of it.
pub const JITTER: f64 = 0.2;

/// Delay before attempt `n + 1` after failed attempt `n` (1-based): `base × 2^(n−1)`, moved by
/// `jitter` in `[-1, 1]` times [`JITTER`]. Capped at a day so a large attempt count cannot
/// overflow.
pub fn backoff(base: Duration, failed_attempt: i32, jitter: f64) -> Duration {
    let exp = failed_attempt.clamp(1, 40) - 1;
    let nominal = base.as_secs_f64() * 2f64.powi(exp);
    let moved = nominal * (1.0 + JITTER * jitter.clamp(-1.0, 1.0));
    Duration::from_secs_f64(moved.clamp(0.0, 86_400.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_base_within_the_jitter() {
        let base = Duration::from_secs(30);
        assert_eq!(backoff(base, 1, 0.0), Duration::from_secs(30));
        assert_eq!(backoff(base, 2, 0.0), Duration::from_secs(60));
        assert_eq!(backoff(base, 4, 0.0), Duration::from_secs(240));
        assert_eq!(backoff(base, 1, 1.0), Duration::from_secs(36));
        assert_eq!(backoff(base, 1, -1.0), Duration::from_secs(24));
        assert_eq!(backoff(base, 1, 7.0), Duration::from_secs(36));
        assert_eq!(backoff(base, 1000, 0.0), Duration::from_secs(86_400));
    }
}
