//! Persisted documents: Apollo's automatic persisted queries (a request names its document by
//! `extensions.persistedQuery.sha256Hash`), the trusted documents manifest
//! (`FITORDER_TRUSTED_DOCUMENTS`), and the parsed documents by hash that both share.
//!
//! The registry of hash to document is this process's own bounded cache, not a table: the
//! protocol heals a miss by itself (an unknown hash is answered `PERSISTED_QUERY_NOT_FOUND` and
//! the client sends the document once more), so a restart or another instance costs one round
//! trip per document, while a table would cost a database round trip on every request that
//! came by hash (the request the cache exists to make cheap) and would let any token holder
//! grow it. What must be the same on every instance, the trusted documents, comes from the
//! manifest each instance reads at start.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use async_graphql::parser::types::ExecutableDocument;
use sha2::{Digest, Sha256};

use crate::auth::{Role, Viewer};
use crate::bounds::Shape;
use crate::config::{TrustedDocuments, TrustedDocumentsFor};

/// Documents parsed and kept by hash.
const CACHED_DOCUMENTS: usize = 1024;
/// What the kept documents may weigh together: their text and their parsed trees, which
/// grow with tokens, not bytes (a 62 KB document of 31,000 integers held 3.3 MB of tree).
const CACHED_WEIGHT: usize = 16 << 20;
/// What a parsed tree is counted to hold per token of its text: what a list of integers, the
/// lightest kind of token for its bytes, measured (3.3 MB for 31,000), rounded up.
const TREE_BYTES_PER_TOKEN: usize = 128;

pub type Hash = [u8; 32];

pub fn sha256(text: &str) -> Hash {
    Sha256::digest(text.as_bytes()).into()
}

/// A document as parsed once.
pub struct Document {
    pub text: Arc<str>,
    pub parsed: ExecutableDocument,
    /// Whether it is one of the manifest's.
    pub trusted: bool,
    /// Its text's tokens and nesting, as measured before it was parsed.
    pub shape: Shape,
    hash: Hash,
}

impl Document {
    /// What keeping it costs: its text and its tree.
    fn weight(&self) -> usize {
        self.text
            .len()
            .saturating_add(self.shape.tokens.saturating_mul(TREE_BYTES_PER_TOKEN))
    }
}

/// Why a request's document could not be had.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A hash this process does not know, and no document with it.
    NotFound,
    /// `persistedQuery` is not `{version: 1, sha256Hash: <64 hex digits>}`.
    Malformed(&'static str),
    /// The document sent does not hash to the hash sent.
    Mismatch,
    /// Neither a document nor a hash.
    Missing,
}

/// What the caller asked for: the text, a hash, or both.
pub enum Found {
    /// Already parsed.
    Parsed(Arc<Document>),
    /// To measure and parse ([`PersistedDocuments::parsed`]), then, once it validated,
    /// [`PersistedDocuments::keep`].
    Text { text: String, hash: Hash },
}

pub struct PersistedDocuments {
    cache: Mutex<Cache>,
    /// The manifest's documents, by their id and by the hash of their text.
    trusted_by_id: HashMap<String, Arc<Document>>,
    trusted_by_text: HashMap<Hash, Arc<Document>>,
    manifest: bool,
    binds: TrustedDocumentsFor,
}

struct Cache {
    docs: lru::LruCache<Hash, Arc<Document>>,
    weight: usize,
}

impl PersistedDocuments {
    pub fn new(manifest: Option<&TrustedDocuments>, binds: TrustedDocumentsFor) -> PersistedDocuments {
        let mut trusted_by_id = HashMap::new();
        let mut trusted_by_text = HashMap::new();
        for (id, text) in manifest.map(|m| m.entries.as_slice()).unwrap_or_default() {
            // The configuration checked that every document is within the bounds and parses.
            let shape = crate::bounds::graphql_shape(text, crate::config::TrustedDocuments::BOUND);
            if crate::bounds::graphql_refusal(text, crate::config::TrustedDocuments::BOUND).is_some() {
                continue;
            }
            let Ok(parsed) = async_graphql::parser::parse_query(text) else {
                continue;
            };
            let doc = Arc::new(Document {
                text: Arc::from(text.as_str()),
                parsed,
                trusted: true,
                shape,
                hash: sha256(text),
            });
            trusted_by_text.insert(sha256(text), doc.clone());
            trusted_by_id.insert(id.clone(), doc);
        }
        PersistedDocuments {
            cache: Mutex::new(Cache {
                docs: lru::LruCache::new(NonZeroUsize::new(CACHED_DOCUMENTS).expect("non-zero")),
                weight: 0,
            }),
            trusted_by_id,
            trusted_by_text,
            manifest: manifest.is_some(),
            binds,
        }
    }

    /// Whether `viewer` may run only the manifest's documents. In `member` mode that is a member
    /// token, and a caller without one (the member app before it signs in); staff tools run
    /// anything.
    pub fn binds(&self, viewer: Option<&Viewer>) -> bool {
        self.manifest
            && match self.binds {
                TrustedDocumentsFor::All => true,
                TrustedDocumentsFor::Member => viewer.is_none_or(|v| v.role == Role::Member),
            }
    }

    /// The manifest's text of a document named by its text or its manifest id (None: not in
    /// the manifest), for transports that carry no hash check of their own (WebSocket).
    pub fn trusted_text(&self, query: Option<&str>, persisted: Option<&serde_json::Value>) -> Option<Arc<str>> {
        let doc = match query {
            Some(q) => self.trusted_by_text.get(&sha256(q)).filter(|d| *d.text == *q),
            None => self.trusted_by_id.get(&persisted_hash(persisted?).ok()?),
        };
        doc.map(|d| d.text.clone())
    }

    /// The document of a request: `query` and/or `extensions.persistedQuery`.
    pub fn find(&self, query: Option<String>, persisted: Option<&serde_json::Value>) -> Result<Found, Refusal> {
        let hash = persisted.map(persisted_hash).transpose()?;
        match (query, hash) {
            (None, None) => Err(Refusal::Missing),
            (None, Some(id)) => self.by_id(&id).map(Found::Parsed).ok_or(Refusal::NotFound),
            (Some(text), id) => {
                let hash = sha256(&text);
                if let Some(id) = id {
                    match self.trusted_by_id.get(&id) {
                        Some(doc) if *doc.text != *text => return Err(Refusal::Mismatch),
                        Some(doc) => return Ok(Found::Parsed(doc.clone())),
                        None if hex::encode(hash) != id => return Err(Refusal::Mismatch),
                        None => {}
                    }
                }
                match self.by_hash(&hash) {
                    // Same hash, same text (a collision of SHA-256 is not a concern here, but a
                    // comparison of a few KB costs nothing).
                    Some(doc) if *doc.text == *text => Ok(Found::Parsed(doc)),
                    _ => Ok(Found::Text { text, hash }),
                }
            }
        }
    }

    fn by_id(&self, id: &str) -> Option<Arc<Document>> {
        if let Some(doc) = self.trusted_by_id.get(id) {
            return Some(doc.clone());
        }
        let mut hash = [0u8; 32];
        hex::decode_to_slice(id, &mut hash).ok()?;
        self.by_hash(&hash)
    }

    fn by_hash(&self, hash: &Hash) -> Option<Arc<Document>> {
        if let Some(doc) = self.trusted_by_text.get(hash) {
            return Some(doc.clone());
        }
        self.cache.lock().expect("document cache").docs.get(hash).cloned()
    }

    /// A document just parsed from text of `hash`, measured as `shape`: not kept until
    /// [`keep`](Self::keep) (after it validated).
    pub fn parsed(&self, hash: Hash, text: String, parsed: ExecutableDocument, shape: Shape) -> Arc<Document> {
        Arc::new(Document {
            text: Arc::from(text),
            parsed,
            trusted: false,
            shape,
            hash,
        })
    }

    /// Keeps a document that validated, the least recently used ones making room; one that
    /// would weigh more than an eighth of the cache is not kept.
    pub fn keep(&self, doc: &Arc<Document>) {
        if doc.trusted {
            return;
        }
        let weight = doc.weight();
        if weight > CACHED_WEIGHT / 8 {
            return;
        }
        let mut cache = self.cache.lock().expect("document cache");
        if let Some(old) = cache.docs.put(doc.hash, doc.clone()) {
            cache.weight -= old.weight();
        }
        cache.weight += weight;
        while cache.weight > CACHED_WEIGHT {
            match cache.docs.pop_lru() {
                Some((_, old)) => cache.weight -= old.weight(),
                None => break,
            }
        }
        ::metrics::gauge!("fitorder_graphql_documents_kept").set(cache.docs.len() as f64);
        ::metrics::gauge!("fitorder_graphql_documents_kept_bytes").set(cache.weight as f64);
    }

    /// What the kept documents weigh (text and trees, as [`keep`](Self::keep) counts them).
    pub fn cached_weight(&self) -> usize {
        self.cache.lock().expect("document cache").weight
    }

    /// How many documents the cache holds (for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache.lock().expect("document cache").docs.len()
    }
}

/// The hash of `{"version": 1, "sha256Hash": "<hex>"}`, lower-case.
fn persisted_hash(v: &serde_json::Value) -> Result<String, Refusal> {
    let obj = v
        .as_object()
        .ok_or(Refusal::Malformed("extensions.persistedQuery must be an object"))?;
    if obj.get("version").and_then(|v| v.as_i64()) != Some(1) {
        return Err(Refusal::Malformed("extensions.persistedQuery.version must be 1"));
    }
    let hash = obj
        .get("sha256Hash")
        .and_then(|h| h.as_str())
        .ok_or(Refusal::Malformed(
            "extensions.persistedQuery.sha256Hash must be a string",
        ))?;
    let hash = hash.to_ascii_lowercase();
    if hash.is_empty()
        || hash.len() > 128
        || !hash
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Refusal::Malformed(
            "extensions.persistedQuery.sha256Hash is not a document hash",
        ));
    }
    Ok(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest() -> TrustedDocuments {
        TrustedDocuments::from_json(
            &json!({ hex::encode(sha256("query A { __typename }")): "query A { __typename }" }).to_string(),
        )
        .unwrap()
    }

    fn parse(docs: &PersistedDocuments, text: &str) -> Arc<Document> {
        match docs.find(Some(text.into()), None).unwrap() {
            Found::Parsed(d) => d,
            Found::Text { text, hash } => {
                let shape = crate::bounds::graphql_shape(&text, crate::config::TrustedDocuments::BOUND);
                let parsed = async_graphql::parser::parse_query(&text).unwrap();
                let doc = docs.parsed(hash, text, parsed, shape);
                docs.keep(&doc);
                doc
            }
        }
    }

    #[test]
    fn a_hash_finds_what_was_sent_once() {
        let docs = PersistedDocuments::new(None, TrustedDocumentsFor::Member);
        let text = "query B { __typename }";
        let id = hex::encode(sha256(text));
        let pq = json!({"version": 1, "sha256Hash": id});
        assert_eq!(docs.find(None, Some(&pq)).err(), Some(Refusal::NotFound));
        // Text with a hash that is not its own.
        let wrong = json!({"version": 1, "sha256Hash": hex::encode(sha256("other"))});
        assert_eq!(
            docs.find(Some(text.into()), Some(&wrong)).err(),
            Some(Refusal::Mismatch)
        );
        let first = parse(&docs, text);
        let Found::Parsed(again) = docs.find(None, Some(&pq)).unwrap() else {
            panic!("parsed once, found by hash")
        };
        assert!(Arc::ptr_eq(&first, &again));
        assert!(matches!(
            docs.find(None, Some(&json!({"version": 2, "sha256Hash": id}))),
            Err(Refusal::Malformed(_))
        ));
    }

    #[test]
    fn the_manifest_binds_members_and_anonymous_callers_in_member_mode() {
        let m = manifest();
        let docs = PersistedDocuments::new(Some(&m), TrustedDocumentsFor::Member);
        let viewer = |role| Viewer {
            role,
            subject: "1".into(),
            member_id: Some(1),
            stores: None,
            session: None,
        };
        assert!(docs.binds(Some(&viewer(Role::Member))));
        assert!(docs.binds(None));
        assert!(!docs.binds(Some(&viewer(Role::Admin))));
        assert!(!docs.binds(Some(&viewer(Role::Ops))));
        let all = PersistedDocuments::new(Some(&m), TrustedDocumentsFor::All);
        assert!(all.binds(Some(&viewer(Role::Admin))));
        let none = PersistedDocuments::new(None, TrustedDocumentsFor::All);
        assert!(!none.binds(None));
        // Over WebSocket: by identical text or by the manifest's id.
        let id = hex::encode(sha256("query A { __typename }"));
        assert!(docs.trusted_text(Some("query A { __typename }"), None).is_some());
        assert!(docs
            .trusted_text(None, Some(&json!({"version": 1, "sha256Hash": id})))
            .is_some());
        assert!(docs.trusted_text(Some("query B { __typename }"), None).is_none());
        assert!(docs.trusted_text(None, None).is_none());
        // Identical text is the manifest's document.
        assert!(parse(&docs, "query A { __typename }").trusted);
        assert!(!parse(&docs, "query A { __typename  }").trusted);
    }

    #[test]
    fn the_cache_is_bounded_by_what_it_holds() {
        let docs = PersistedDocuments::new(None, TrustedDocumentsFor::Member);
        // Text: 40 documents of 200 KB of comment.
        let pad = "x".repeat(200_000);
        for i in 0..40 {
            parse(&docs, &format!("query Q{i} {{ __typename }} #{pad}"));
        }
        assert!(docs.cached() <= CACHED_WEIGHT / 200_000, "{}", docs.cached());
        assert!(docs.cached_weight() <= CACHED_WEIGHT);
        // Trees: small texts of many tokens weigh by their tokens (12,000 integers: ~24 KB of
        // text, ~1.5 MB counted), so far fewer are kept than their text would allow.
        let docs = PersistedDocuments::new(None, TrustedDocumentsFor::Member);
        let ints = "1 ".repeat(12_000);
        for i in 0..100 {
            parse(&docs, &format!("query Q{i} {{ f(x: [{ints}]) }}"));
        }
        let kept = docs.cached();
        assert!(kept <= CACHED_WEIGHT / (12_000 * TREE_BYTES_PER_TOKEN), "{kept}");
        assert!(kept >= 1, "documents under an eighth of the cache are kept");
        assert!(docs.cached_weight() <= CACHED_WEIGHT);
        // One that weighs more than an eighth of the cache is parsed for its request, not kept.
        let docs = PersistedDocuments::new(None, TrustedDocumentsFor::Member);
        parse(&docs, &format!("query {{ f(x: [{}]) }}", "1 ".repeat(20_000)));
        assert_eq!(docs.cached(), 0);
    }
}
