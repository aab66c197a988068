//! A per-key rate limiter: at most `limit` hits per key in a fixed window that starts at the
//! key's first hit, with memory bounded by `max_keys`. When every slot is taken by a key whose
//! window is still open, the key whose window started first is forgotten (its window is the
//! next to end anyway): a flood of new keys can shorten an old key's window, never grow the map.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimiter {
    limit: u32,
    window: Duration,
    max_keys: usize,
    inner: Mutex<Windows>,
}

#[derive(Default)]
struct Windows {
    /// Key -> (window start, hits in it).
    hits: HashMap<String, (Instant, u32)>,
    /// Keys in the order their windows started (an entry whose start no longer matches the
    /// map's is stale and skipped).
    order: VecDeque<(Instant, String)>,
}

impl RateLimiter {
    pub fn new(limit: u32, window: std::time::Duration, max_keys: usize) -> Self {
        RateLimiter {
            limit: limit.max(1),
            window: window.max(Duration::from_millis(1)),
            max_keys: max_keys.max(1),
            inner: Mutex::new(Windows::default()),
        }
    }

    /// Counts a hit of `key`: `Ok` while the key is within its limit, otherwise how long until
    /// its window ends (what a `Retry-After` says).
    pub fn check(&self, key: &str) -> Result<(), std::time::Duration> {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut w = self.inner.lock().expect("rate limiter lock");
        w.forget_ended(now, self.window);
        if let Some((start, n)) = w.hits.get_mut(key) {
            if now.duration_since(*start) < self.window {
                if *n >= self.limit {
                    return Err(self.window - now.duration_since(*start));
                }
                *n += 1;
                return Ok(());
            }
        }
        // A new window for this key.
        while w.hits.len() >= self.max_keys && !w.hits.contains_key(key) {
            let Some((start, oldest)) = w.order.pop_front() else {
                break;
            };
            if w.hits.get(&oldest).is_some_and(|(s, _)| *s == start) {
                w.hits.remove(&oldest);
            }
        }
        w.hits.insert(key.to_string(), (now, 1));
        w.order.push_back((now, key.to_string()));
        // Stale order entries (keys whose window restarted) are bounded by the map's size.
        if w.order.len() > 2 * self.max_keys {
            let Windows { hits, order } = &mut *w;
            order.retain(|(s, k)| hits.get(k).is_some_and(|(start, _)| start == s));
        }
        Ok(())
    }

    /// Keys held now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.inner.lock().expect("rate limiter lock").hits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Windows {
    fn forget_ended(&mut self, now: Instant, window: Duration) {
        while let Some((start, _)) = self.order.front() {
            if now.duration_since(*start) < window {
                break;
            }
            let (start, key) = self.order.pop_front().expect("front exists");
            if self.hits.get(&key).is_some_and(|(s, _)| *s == start) {
                self.hits.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gets_its_limit_per_window_then_waits_for_the_rest_of_it() {
        let l = RateLimiter::new(3, Duration::from_secs(60), 100);
        let t0 = Instant::now();
        for _ in 0..3 {
            l.check_at("a", t0).unwrap();
        }
        let wait = l.check_at("a", t0 + Duration::from_secs(20)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(40));
        // Another key has its own count.
        l.check_at("b", t0 + Duration::from_secs(20)).unwrap();
        // The window ends: counted afresh.
        l.check_at("a", t0 + Duration::from_secs(60)).unwrap();
    }

    #[test]
    fn memory_stays_bounded_by_max_keys() {
        let l = RateLimiter::new(1, Duration::from_secs(60), 50);
        let t0 = Instant::now();
        for i in 0..10_000 {
            l.check_at(&format!("k{i}"), t0 + Duration::from_millis(i)).unwrap();
            assert!(l.len() <= 50);
        }
        let w = l.inner.lock().unwrap();
        assert!(w.order.len() <= 100, "{}", w.order.len());
        drop(w);
        // The newest keys are still counted.
        assert!(l.check_at("k9999", t0 + Duration::from_secs(1)).is_err());
        // Ended windows are forgotten.
        l.check_at("fresh", t0 + Duration::from_secs(3600)).unwrap();
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn a_key_hit_after_its_window_restarts_without_growing_the_order() {
        let l = RateLimiter::new(1, Duration::from_secs(1), 2);
        let t0 = Instant::now();
        for i in 0..1000 {
            l.check_at("a", t0 + Duration::from_secs(i)).unwrap();
        }
        assert!(l.inner.lock().unwrap().order.len() <= 4);
    }
}
