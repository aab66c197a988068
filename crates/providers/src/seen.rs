//! Small bounded sets of digests this process has seen lately: signatures verified, payment
//! keys processed. Each is only a shortcut; what they remember is true forever (a signature
//! that verified once verifies again, a key processed stays processed), and the oldest entry
//! goes first once the set is full.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;

type Digests = HashSet<[u8; 32], std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>>;

/// How many digests a set keeps: the payments of a busy day (a provider redelivers within
/// minutes, at most a day), about 6 MB at the most.
pub const KEEP: usize = 65_536;

pub struct Seen {
    keep: usize,
    seen: Mutex<(Digests, VecDeque<[u8; 32]>)>,
}

impl Seen {
    pub const fn new(keep: usize) -> Seen {
        Seen {
            keep,
            seen: Mutex::new((
                Digests::with_hasher(std::hash::BuildHasherDefault::new()),
                VecDeque::new(),
            )),
        }
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
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).0.contains(d)
    }

    pub fn insert(&self, d: [u8; 32]) {
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *guard;
        if set.insert(d) {
            order.push_back(d);
            if order.len() > self.keep {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).0.len()
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
