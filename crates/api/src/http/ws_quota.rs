//! Operations running over WebSockets, counted per token across every connection of this
//! process (`FITORDER_MAX_SUBSCRIPTIONS_PER_TOKEN`): one token on 200 sockets held 20,000
//! subscriptions, each a stream of every event of the hub.

use std::collections::HashMap;
use std::sync::Mutex;

/// Which token: a digest of its text (the text itself is not kept).
pub type TokenKey = [u8; 32];

pub fn token_key(authorization: &str) -> TokenKey {
    use sha2::{Digest, Sha256};
    let v = authorization.trim();
    let token = match v.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
        _ => v,
    };
    Sha256::digest(token.as_bytes()).into()
}

#[derive(Default)]
pub struct TokenOperations {
    running: Mutex<HashMap<TokenKey, usize>>,
}

impl TokenOperations {
    /// One more operation for `key`, unless it already runs `limit`.
    pub fn try_take(&self, key: &TokenKey, limit: usize) -> bool {
        let mut running = self.running.lock().expect("token operations");
        let n = running.entry(*key).or_default();
        if *n >= limit {
            return false;
        }
        *n += 1;
        true
    }

    /// `n` operations of `key` ended.
    pub fn give_back(&self, key: &TokenKey, n: usize) {
        if n == 0 {
            return;
        }
        let mut running = self.running.lock().expect("token operations");
        if let Some(have) = running.get_mut(key) {
            *have = have.saturating_sub(n);
            if *have == 0 {
                running.remove(key);
            }
        }
    }

    /// How many operations `key` runs (for tests).
    pub fn running(&self, key: &TokenKey) -> usize {
        self.running
            .lock()
            .expect("token operations")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}
