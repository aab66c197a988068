//! A per-key rate limiter: at most `limit` events per key in a fixed window, in bounded memory.
//!
//! Each key has a counter for the current window; a key seen in an older window starts again.
//! When `max_keys` keys are held, the ones whose window is over are dropped first; if every
//! held key is still in its window, the new key is refused (a flood of new keys cannot grow the
//! table nor push out the keys it is limiting).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimiter {
    limit: u32,
    window: Duration,
    max_keys: usize,
    slots: Mutex<HashMap<String, Slot>>,
}

#[derive(Clone, Copy)]
struct Slot {
    started: Instant,
    count: u32,
}

impl RateLimiter {
    pub fn new(limit: u32, window: std::time::Duration, max_keys: usize) -> Self {
        RateLimiter {
            limit,
            window,
            max_keys: max_keys.max(1),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one event for `key`: `Ok` while the key is within its limit, otherwise how long
    /// until its window ends.
    pub fn check(&self, key: &str) -> Result<(), std::time::Duration /* retry after */> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get_mut(key) {
            let elapsed = now.duration_since(slot.started);
            if elapsed >= self.window {
                *slot = Slot { started: now, count: 1 };
                return if self.limit == 0 { Err(self.window) } else { Ok(()) };
            }
            if slot.count >= self.limit {
                return Err(self.window - elapsed);
            }
            slot.count += 1;
            return Ok(());
        }
        if slots.len() >= self.max_keys {
            let window = self.window;
            slots.retain(|_, s| now.duration_since(s.started) < window);
            if slots.len() >= self.max_keys {
                // Every held key is in its window: the soonest to end tells when to come back.
                let soonest = slots
                    .values()
                    .map(|s| window.saturating_sub(now.duration_since(s.started)))
                    .min()
                    .unwrap_or(window);
                return Err(soonest.max(Duration::from_millis(1)));
            }
        }
        if self.limit == 0 {
            return Err(self.window);
        }
        slots.insert(key.to_string(), Slot { started: now, count: 1 });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_gets_its_limit_per_window_and_keys_are_bounded() {
        let rl = RateLimiter::new(3, Duration::from_millis(200), 2);
        for _ in 0..3 {
            assert!(rl.check("a").is_ok());
        }
        let wait = rl.check("a").unwrap_err();
        assert!(wait <= Duration::from_millis(200));
        assert!(rl.check("b").is_ok());
        // The table is full of keys within their window: a third key waits.
        assert!(rl.check("c").is_err());
        std::thread::sleep(Duration::from_millis(220));
        assert!(rl.check("a").is_ok());
        assert!(rl.check("c").is_ok());
        assert!(rl.slots.lock().unwrap().len() <= 2);
    }
}
