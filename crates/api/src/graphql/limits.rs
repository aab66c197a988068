//! Bounds on a GraphQL document, checked before async-graphql validates or runs it.
//!
//! async-graphql's own depth and complexity checks (and its recursion check, run right after
//! parsing) walk a document with every fragment spread expanded, without memoization: named
//! fragments that each spread the next twice make a 1 KB document cost 2^levels. Here each
//! fragment is counted once (memoized), so the cost of the check is linear in the document,
//! and a document whose expansion is too large is refused before anything else looks at it.

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::extensions::{Extension, ExtensionContext, ExtensionFactory, NextPrepareRequest, NextRequest};
use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::{Request, ServerError, ServerResult};

/// The limits, from the configuration.
#[derive(Clone, Copy, Debug)]
pub struct DocumentLimits {
    /// Longest query text, in bytes.
    pub max_bytes: usize,
    /// Fields, fragment spreads and inline fragments, counted with every fragment expanded.
    pub max_selections: u64,
    /// Fragment spreads, counted with every fragment expanded.
    pub max_spreads: u64,
    /// Fragment definitions in one document.
    pub max_fragments: usize,
    /// What introspection may cost (None: not checked here).
    pub introspection: Option<super::introspection::IntrospectionBudget>,
    /// Lexical tokens, by who sends the document, and the deepest nesting of brackets:
    /// measured on the text before it is parsed (`bounds::graphql_shape`).
    pub max_tokens: crate::bounds::TokenBudget,
    pub max_nesting: usize,
}

/// Who sends a document, as its token budget counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// No token: the sign-in mutations and, where allowed, introspection.
    Anonymous,
    Member,
    Staff,
}

impl Sender {
    pub fn of(viewer: Option<&crate::auth::Viewer>) -> Sender {
        match viewer.map(|v| v.role) {
            None => Sender::Anonymous,
            Some(crate::auth::Role::Member) => Sender::Member,
            Some(_) => Sender::Staff,
        }
    }
}

impl DocumentLimits {
    pub fn from_config(config: &crate::config::Config) -> DocumentLimits {
        DocumentLimits {
            max_bytes: config.max_document_bytes,
            max_selections: config.max_selections,
            max_spreads: config.max_fragment_spreads,
            max_fragments: 200,
            introspection: None,
            max_tokens: config.max_document_tokens,
            max_nesting: config.max_document_nesting,
        }
    }

    /// The bounds of the text `sender` may send, before it is parsed.
    pub fn shape(&self, sender: Sender) -> crate::bounds::Shape {
        crate::bounds::Shape {
            tokens: match sender {
                Sender::Anonymous => self.max_tokens.anonymous,
                Sender::Member => self.max_tokens.member,
                Sender::Staff => self.max_tokens.staff,
            },
            nesting: self.max_nesting,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    selections: u64,
    spreads: u64,
}

impl Cost {
    fn add(self, o: Cost) -> Cost {
        Cost {
            selections: self.selections.saturating_add(o.selections),
            spreads: self.spreads.saturating_add(o.spreads),
        }
    }
}

enum Seen {
    Visiting,
    Done(Cost),
}

/// A refusal as the client sees it: `BAD_USER_INPUT`, nothing run.
pub fn refusal(message: impl Into<String>) -> ServerError {
    let mut err = ServerError::new(message, None);
    let mut ext = async_graphql::ErrorExtensionValues::default();
    ext.set("code", "BAD_USER_INPUT");
    err.extensions = Some(ext);
    err
}

/// Checks the size of the text (before parsing).
pub fn check_text(query: &str, limits: &DocumentLimits) -> ServerResult<()> {
    if query.len() > limits.max_bytes {
        return Err(refusal(format!(
            "query too complex: the document has {} bytes (limit {})",
            query.len(),
            limits.max_bytes
        )));
    }
    Ok(())
}

/// Measures the text `sender` sent before anything parses it: its size, then its tokens and
/// the nesting of its brackets (a loop, no recursion). What it answers is the document's
/// [`Shape`](crate::bounds::Shape), for [`check_shape`] when the parsed document is used again.
pub fn measure(query: &str, limits: &DocumentLimits, sender: Sender) -> ServerResult<crate::bounds::Shape> {
    check_text(query, limits)?;
    let bound = limits.shape(sender);
    let shape = crate::bounds::graphql_shape(query, bound);
    check_shape(shape, limits, sender)?;
    Ok(shape)
}

/// Whether a document of `shape` (measured when it was first parsed) is within `sender`'s
/// bounds: a document parsed for staff and kept is not run for a member over theirs.
pub fn check_shape(shape: crate::bounds::Shape, limits: &DocumentLimits, sender: Sender) -> ServerResult<()> {
    match crate::bounds::refusal(shape, limits.shape(sender)) {
        Some(why) => Err(refusal(why)),
        None => Ok(()),
    }
}

/// Parses text `sender` sent, measured first ([`measure`]), and checks the parsed document
/// ([`check_document`]).
pub fn parse(
    query: &str,
    limits: &DocumentLimits,
    sender: Sender,
) -> ServerResult<(ExecutableDocument, crate::bounds::Shape)> {
    let shape = measure(query, limits, sender)?;
    let doc = async_graphql::parser::parse_query(query).map_err(|e| syntax_refusal(&e))?;
    check_document(&doc, limits)?;
    Ok((doc, shape))
}

/// Checks a parsed document: fragment count, cycles, and the expanded size of every operation.
pub fn check_document(doc: &ExecutableDocument, limits: &DocumentLimits) -> ServerResult<()> {
    if doc.fragments.len() > limits.max_fragments {
        return Err(refusal(format!(
            "query too complex: {} fragments (limit {})",
            doc.fragments.len(),
            limits.max_fragments
        )));
    }
    // Introspection's weight is counted once cycles are known to be absent.
    check_expansion(doc, limits)?;
    if let Some(budget) = &limits.introspection {
        budget.check(doc)?;
    }
    Ok(())
}

fn check_expansion(doc: &ExecutableDocument, limits: &DocumentLimits) -> ServerResult<()> {
    let mut seen: HashMap<&str, Seen> = HashMap::new();
    let mut total = Cost::default();
    for (_, op) in doc.operations.iter() {
        total = total.add(cost(doc, &op.node.selection_set.node, &mut seen, limits)?);
        within(total, limits)?;
    }
    // Fragments no operation uses are refused by validation; count them too so that
    // validation itself never walks a large expansion.
    for (name, frag) in &doc.fragments {
        if !seen.contains_key(name.as_str()) {
            seen.insert(name.as_str(), Seen::Visiting);
            let c = cost(doc, &frag.node.selection_set.node, &mut seen, limits)?;
            within(c, limits)?;
            seen.insert(name.as_str(), Seen::Done(c));
        }
    }
    Ok(())
}

fn within(c: Cost, limits: &DocumentLimits) -> ServerResult<()> {
    if c.selections > limits.max_selections {
        return Err(refusal(format!(
            "query too complex: more than {} selections once fragments are expanded",
            limits.max_selections
        )));
    }
    if c.spreads > limits.max_spreads {
        return Err(refusal(format!(
            "query too complex: more than {} fragment spreads once fragments are expanded",
            limits.max_spreads
        )));
    }
    Ok(())
}

fn cost<'d>(
    doc: &'d ExecutableDocument,
    set: &'d SelectionSet,
    seen: &mut HashMap<&'d str, Seen>,
    limits: &DocumentLimits,
) -> ServerResult<Cost> {
    let mut c = Cost::default();
    for item in &set.items {
        let here = match &item.node {
            Selection::Field(f) => Cost {
                selections: 1,
                spreads: 0,
            }
            .add(cost(doc, &f.node.selection_set.node, seen, limits)?),
            Selection::InlineFragment(f) => Cost {
                selections: 1,
                spreads: 0,
            }
            .add(cost(doc, &f.node.selection_set.node, seen, limits)?),
            Selection::FragmentSpread(s) => {
                let name = s.node.fragment_name.node.as_str();
                let inner = match seen.get(name) {
                    Some(Seen::Done(c)) => *c,
                    Some(Seen::Visiting) => {
                        return Err(refusal(format!("fragment {name} spreads itself")));
                    }
                    None => match doc.fragments.get(name) {
                        // Unknown fragments are validation's to refuse.
                        None => Cost::default(),
                        Some(frag) => {
                            let (key, _) = doc.fragments.get_key_value(name).expect("present");
                            seen.insert(key.as_str(), Seen::Visiting);
                            let c = cost(doc, &frag.node.selection_set.node, seen, limits)?;
                            within(c, limits)?;
                            seen.insert(key.as_str(), Seen::Done(c));
                            c
                        }
                    },
                };
                Cost {
                    selections: 1,
                    spreads: 1,
                }
                .add(inner)
            }
        };
        c = c.add(here);
        within(c, limits)?;
    }
    Ok(c)
}

/// The schema extension: every request (HTTP and WebSocket) is bounded before parsing ends.
pub struct BoundDocuments(pub DocumentLimits);

impl ExtensionFactory for BoundDocuments {
    fn create(&self) -> Arc<dyn Extension> {
        Arc::new(BoundDocumentsExtension(self.0))
    }
}

struct BoundDocumentsExtension(DocumentLimits);

#[async_graphql::async_trait::async_trait]
impl Extension for BoundDocumentsExtension {
    async fn prepare_request(
        &self,
        ctx: &ExtensionContext<'_>,
        mut request: Request,
        next: NextPrepareRequest<'_>,
    ) -> ServerResult<Request> {
        // A request may come parsed (the HTTP route keeps documents parsed by hash): that tree
        // is checked, not parsed again. `parsed_query` parses the text when there is none, so
        // with the text set aside it answers whether there is one.
        let query = std::mem::take(&mut request.query);
        let parsed = request.parsed_query().is_ok();
        request.query = query;
        if !parsed {
            // Measured, then parsed once here; async-graphql reuses the parsed document. The
            // sender is the request's, or the connection's (a WebSocket's `connection_init`
            // token); a request without either is held to the bounds of a caller without one.
            let of_request = request
                .data
                .get(&std::any::TypeId::of::<super::RequestContext>())
                .and_then(|d| d.downcast_ref::<super::RequestContext>());
            let viewer = of_request
                .or_else(|| ctx.data_opt::<super::RequestContext>())
                .and_then(|r| r.viewer.as_ref());
            measure(&request.query, &self.0, Sender::of(viewer))?;
            let doc = async_graphql::parser::parse_query(&request.query).map_err(|e| syntax_refusal(&e))?;
            request.set_parsed_query(doc);
        } else {
            check_text(&request.query, &self.0)?;
        }
        let variables = std::mem::take(&mut request.variables);
        let checked = request
            .parsed_query()
            .and_then(|doc| check_document(doc, &self.0).and_then(|()| check_no_nul(doc, &variables)));
        request.variables = variables;
        checked?;
        next.run(ctx, request).await
    }

    /// async-graphql's own refusals of the caller's document (a syntax error, an unknown
    /// field, a value out of range for its type, such as an `Int` past 2^31 - 1) carry no code:
    /// they are the caller's input, `BAD_USER_INPUT`. Every error of ours has its code already.
    async fn request(&self, ctx: &ExtensionContext<'_>, next: NextRequest<'_>) -> async_graphql::Response {
        let mut response = next.run(ctx).await;
        code_uncoded(&mut response);
        response
    }
}

/// async-graphql's own refusals (see [`BoundDocumentsExtension::request`]): `BAD_USER_INPUT`.
pub fn code_uncoded(response: &mut async_graphql::Response) {
    for err in &mut response.errors {
        let coded = err.extensions.as_ref().is_some_and(|e| e.get("code").is_some());
        if !coded {
            err.extensions
                .get_or_insert_with(Default::default)
                .set("code", "BAD_USER_INPUT");
        }
    }
}

/// A document that does not parse, said without quoting it: the parser's own message repeats
/// the offending line (a one-line document of 60 KB came back whole). Here: where, and what
/// was expected there.
pub fn syntax_refusal(e: &async_graphql::parser::Error) -> ServerError {
    use async_graphql::parser::Error;
    let message = match e {
        Error::Syntax { message, start, .. } => {
            // pest's last line says what it wanted ("  = expected selection_set"); the lines
            // before it quote the document.
            let wanted = message
                .lines()
                .rev()
                .find_map(|l| l.trim_start().strip_prefix("= "))
                .map(|w| w.chars().take(200).collect::<String>())
                .unwrap_or_else(|| "a GraphQL document".into());
            format!("syntax error at line {}, column {}: {wanted}", start.line, start.column)
        }
        Error::RecursionLimitExceeded => "the document is nested too deep".to_string(),
        // The other kinds name only an operation or a fragment (names are at most a line).
        other => {
            let text = other.to_string();
            text.chars().take(200).collect()
        }
    };
    let mut err = refusal(message);
    err.locations = e.positions().collect();
    err
}

/// A NUL can be no text the database keeps (PostgreSQL refuses it in `text`): a string with one,
/// in a variable or written in the document, is the caller's mistake, not an INTERNAL error.
pub fn check_no_nul(doc: &ExecutableDocument, variables: &async_graphql::Variables) -> ServerResult<()> {
    use async_graphql::parser::types::DocumentOperations;
    fn const_has_nul(v: &async_graphql::Value) -> bool {
        use async_graphql::Value as V;
        match v {
            V::String(s) => s.contains('\0'),
            V::List(l) => l.iter().any(const_has_nul),
            V::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || const_has_nul(v)),
            _ => false,
        }
    }
    // A literal argument, its variables taken as null (theirs are checked apart).
    macro_rules! has_nul {
        ($v:expr) => {
            $v.clone()
                .into_const_with(|_| Ok::<_, std::convert::Infallible>(async_graphql::Value::Null))
                .is_ok_and(|c| const_has_nul(&c))
        };
    }
    fn set_has_nul(set: &SelectionSet) -> bool {
        set.items.iter().any(|item| {
            let directives = item.node.directives();
            let in_directives = directives
                .iter()
                .any(|d| d.node.arguments.iter().any(|(_, v)| has_nul!(v.node)));
            in_directives
                || match &item.node {
                    Selection::Field(f) => {
                        f.node.arguments.iter().any(|(_, v)| has_nul!(v.node))
                            || set_has_nul(&f.node.selection_set.node)
                    }
                    Selection::InlineFragment(f) => set_has_nul(&f.node.selection_set.node),
                    Selection::FragmentSpread(_) => false,
                }
        })
    }
    let refused = || refusal("a string may not contain the NUL character (U+0000)");
    if variables.iter().any(|(_, v)| const_has_nul(v)) {
        return Err(refused());
    }
    let operations: Vec<&async_graphql::parser::types::OperationDefinition> = match &doc.operations {
        DocumentOperations::Single(op) => vec![&op.node],
        DocumentOperations::Multiple(ops) => ops.values().map(|op| &op.node).collect(),
    };
    for op in operations {
        let defaults = op
            .variable_definitions
            .iter()
            .any(|d| d.node.default_value.as_ref().is_some_and(|v| const_has_nul(&v.node)));
        if defaults || set_has_nul(&op.selection_set.node) {
            return Err(refused());
        }
    }
    if doc.fragments.values().any(|f| set_has_nul(&f.node.selection_set.node)) {
        return Err(refused());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: DocumentLimits = DocumentLimits {
        max_bytes: 65_536,
        max_selections: 2_000,
        max_spreads: 500,
        max_fragments: 100,
        introspection: None,
        max_tokens: crate::bounds::TokenBudget::DEFAULT,
        max_nesting: crate::bounds::DEFAULT_NESTING,
    };

    fn doubling(levels: usize) -> String {
        let mut q = String::from("query{...F0}");
        for i in 0..levels {
            q.push_str(&format!(" fragment F{i} on Query{{...F{n} ...F{n}}}", n = i + 1));
        }
        q.push_str(&format!(" fragment F{levels} on Query{{__typename}}"));
        q
    }

    fn check(q: &str) -> Result<(), String> {
        parse(q, &LIMITS, Sender::Staff).map(|_| ()).map_err(|e| e.message)
    }

    #[test]
    fn doubling_fragments_are_refused_quickly() {
        for levels in [24, 30, 60] {
            let started = std::time::Instant::now();
            let err = check(&doubling(levels)).unwrap_err();
            assert!(err.contains("too complex"), "{err}");
            assert!(started.elapsed() < std::time::Duration::from_millis(50));
        }
        // A few levels are fine: 2^5 spreads of __typename.
        check(&doubling(4)).unwrap();
    }

    #[test]
    fn cycles_and_sizes() {
        assert!(check("query{...A} fragment A on Query{...B} fragment B on Query{...A}")
            .unwrap_err()
            .contains("spreads itself"));
        let wide = format!("query{{{}}}", "__typename ".repeat(2_001));
        assert!(check(&wide).unwrap_err().contains("selections"));
        let long = format!("query{{__typename}}#{}", "x".repeat(70_000));
        assert!(check(&long).unwrap_err().contains("bytes"));
        check("query{me{role}} fragment Unused on Query{__typename}").unwrap();
    }
}
