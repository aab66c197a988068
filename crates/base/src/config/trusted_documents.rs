//! The trusted documents manifest (`FITORDER_TRUSTED_DOCUMENTS`) and whom it binds.

use std::sync::Arc;

use anyhow::{Context, Result};

/// Whom the trusted documents manifest binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TrustedDocumentsFor {
    /// Member tokens (and anonymous callers, the member app before sign-in); staff run anything.
    Member,
    /// Every caller.
    All,
}

/// A persisted-documents manifest as GraphQL Code Generator's client preset and Relay write it:
/// a JSON object from a document's id (its SHA-256, hex) to the document's text.
#[derive(Clone, Debug)]
pub struct TrustedDocuments {
    /// (id as written, lower-case, without a `sha256:` prefix; document text)
    pub entries: Vec<(String, String)>,
}

impl TrustedDocuments {
    /// The bounds a manifest's document is held to before it is parsed: a staff document's.
    pub const BOUND: crate::bounds::Shape = crate::bounds::Shape {
        tokens: crate::bounds::TokenBudget::DEFAULT.staff,
        nesting: crate::bounds::DEFAULT_NESTING,
    };

    pub fn from_json(text: &str) -> Result<TrustedDocuments> {
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_str(text).context("not a JSON object from document hash to document text")?;
        let mut entries = Vec::with_capacity(map.len());
        for (id, doc) in map {
            let id = id.trim().to_ascii_lowercase();
            let id = id.strip_prefix("sha256:").unwrap_or(&id).to_string();
            anyhow::ensure!(!id.is_empty(), "a document without a hash");
            if let Some(why) = crate::bounds::graphql_refusal(&doc, Self::BOUND) {
                anyhow::bail!("the document {id}: {why}");
            }
            if let Err(e) = async_graphql_parser::parse_query(&doc) {
                let at = e
                    .positions()
                    .next()
                    .map(|p| format!(" at {}:{}", p.line, p.column))
                    .unwrap_or_default();
                anyhow::bail!("the document {id} does not parse{at}");
            }
            entries.push((id, doc));
        }
        Ok(TrustedDocuments { entries })
    }

    /// `FITORDER_TRUSTED_DOCUMENTS`'s value parser: the manifest at `path`, read and checked.
    pub(super) fn load(path: &str) -> Result<Arc<TrustedDocuments>, String> {
        let text = std::fs::read_to_string(path.trim()).map_err(|_| format!("{path:?} cannot be read"))?;
        TrustedDocuments::from_json(&text)
            .map(Arc::new)
            .map_err(|e| format!("{path:?}: {e:#}"))
    }
}
