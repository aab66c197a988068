//! Small bounded sets of digests this process has seen lately: signatures verified, payment
//! keys processed. Each is only a shortcut; what they remember is true forever (a signature
//! that verified once verifies again, a key processed stays processed), and the oldest entry
//! goes first once the set is full.

use std::num::NonZeroUsize;
use std::sync::{Mutex, OnceLock};

/// How many digests a set keeps: the payments of a busy day (a provider redelivers within
/// minutes, at most a day), about 6 MB at the most.
pub const KEEP: usize = 65_536;

/// A bounded set on `lru`'s cache: looked at with `peek` (which leaves the order alone), so the
/// oldest insertion goes first, as a FIFO; made on first use so that a `static` can hold one.
pub struct Seen {
    keep: usize,
    seen: OnceLock<Mutex<lru::LruCache<[u8; 32], ()>>>,
}

impl Seen {
    pub const fn new(keep: usize) -> Seen {
        Seen {
            keep,
            seen: OnceLock::new(),
        }
    }

    fn set(&self) -> std::sync::MutexGuard<'_, lru::LruCache<[u8; 32], ()>> {
        self.seen
            .get_or_init(|| {
                Mutex::new(lru::LruCache::new(
                    NonZeroUsize::new(self.keep.max(1)).expect("non-zero"),
                ))
            })
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The SHA-256 of `parts`, each prefixed with its length (so no two lists collide).
    pub fn digest(parts: &[&[u8]]) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in parts {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        h.finalize().into()
    }

    pub fn contains(&self, d: &[u8; 32]) -> bool {
        self.set().peek(d).is_some()
    }

    pub fn insert(&self, d: [u8; 32]) {
        let mut set = self.set();
        // Seen again: it keeps its place (a FIFO, not a recency list).
        if set.peek(&d).is_none() {
            set.push(d, ());
        }
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.set().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_its_bound_oldest_out_first() {
        let s = Seen::new(3);
        let d = |i: u8| Seen::digest(&[&[i]]);
        for i in 0..5 {
            s.insert(d(i));
        }
        assert_eq!(s.count(), 3);
        assert!(!s.contains(&d(0)) && !s.contains(&d(1)));
        assert!(s.contains(&d(2)) && s.contains(&d(4)));
        s.insert(d(4));
        assert_eq!(s.count(), 3, "a digest seen again is not counted twice");
    }

    #[test]
    fn digests_of_different_splits_differ() {
        assert_ne!(Seen::digest(&[b"ab", b"c"]), Seen::digest(&[b"a", b"bc"]));
    }
}
