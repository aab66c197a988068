//! Introspection, bounded like any other document and answered once.
//!
//! async-graphql counts no complexity for `__schema` and `__type`: 200 aliases of
//! `__schema { types { fields { args … } } }` in 12 KB answered 3.7 MB. Here every
//! introspection field has a weight: the number of values it can answer, lists multiplied by
//! the longest such list of this schema (its types, the most fields of a type, the most
//! arguments of a field, …), each fragment counted once. A document may weigh at most twice
//! the standard introspection query (the full schema, once): aliases, repeated fields and
//! spread fragments all add up. The schema never changes while the process runs, so answers to
//! introspection-only documents are kept ([`Introspection`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_graphql::parser::types::{ExecutableDocument, Selection, SelectionSet};
use async_graphql::ServerResult;

use super::AppSchema;

/// The standard introspection query with every option graphql-js has (descriptions,
/// `specifiedByURL`, `isRepeatable`, deprecated arguments): what GraphiQL and code generators ask.
pub const STANDARD_QUERY: &str = include_str!("introspection.graphql");

/// The longest lists introspection can answer in this schema.
#[derive(Clone, Copy, Debug, Default)]
struct Factors {
    types: u64,
    fields: u64,
    input_fields: u64,
    args: u64,
    enum_values: u64,
    interfaces: u64,
    possible_types: u64,
    directives: u64,
    locations: u64,
}

impl Factors {
    /// Measured on the schema's SDL, plus what the SDL leaves out (the introspection types, the
    /// built-in scalars and directives).
    fn of_sdl(sdl: &str) -> Factors {
        use async_graphql::parser::types::{TypeKind, TypeSystemDefinition};
        let mut f = Factors {
            // __Schema, __Type, __Field, __InputValue, __EnumValue, __Directive, __TypeKind,
            // __DirectiveLocation; String, Int, Float, Boolean, ID.
            types: 13,
            // __Type has 11 fields, __TypeKind 8 values, __DirectiveLocation 19.
            fields: 11,
            input_fields: 1,
            args: 1,
            enum_values: 19,
            interfaces: 1,
            possible_types: 1,
            // @include, @skip, @deprecated, @specifiedBy, @oneOf.
            directives: 5,
            locations: 19,
        };
        let Ok(doc) = async_graphql::parser::parse_schema(sdl) else {
            // Never for our own SDL; a generous guess otherwise.
            return Factors {
                types: 500,
                fields: 200,
                input_fields: 100,
                args: 20,
                enum_values: 100,
                interfaces: 10,
                possible_types: 100,
                directives: 20,
                locations: 19,
            };
        };
        let mut implementors: HashMap<String, u64> = HashMap::new();
        for def in &doc.definitions {
            match def {
                TypeSystemDefinition::Type(t) => {
                    f.types += 1;
                    match &t.node.kind {
                        TypeKind::Object(o) => {
                            f.fields = f.fields.max(o.fields.len() as u64);
                            f.interfaces = f.interfaces.max(o.implements.len() as u64);
                            for i in &o.implements {
                                *implementors.entry(i.node.to_string()).or_default() += 1;
                            }
                            for field in &o.fields {
                                f.args = f.args.max(field.node.arguments.len() as u64);
                            }
                        }
                        TypeKind::Interface(i) => {
                            f.fields = f.fields.max(i.fields.len() as u64);
                            f.interfaces = f.interfaces.max(i.implements.len() as u64);
                            for field in &i.fields {
                                f.args = f.args.max(field.node.arguments.len() as u64);
                            }
                        }
                        TypeKind::Union(u) => f.possible_types = f.possible_types.max(u.members.len() as u64),
                        TypeKind::Enum(e) => f.enum_values = f.enum_values.max(e.values.len() as u64),
                        TypeKind::InputObject(i) => f.input_fields = f.input_fields.max(i.fields.len() as u64),
                        TypeKind::Scalar => {}
                    }
                }
                TypeSystemDefinition::Directive(d) => {
                    f.directives += 1;
                    f.args = f.args.max(d.node.arguments.len() as u64);
                }
                TypeSystemDefinition::Schema(_) => {}
            }
        }
        if let Some(most) = implementors.values().max() {
            f.possible_types = f.possible_types.max(*most);
        }
        f
    }

    /// How many values one occurrence of an introspection field can stand for.
    fn of_field(&self, name: &str) -> u64 {
        match name {
            "types" => self.types,
            "possibleTypes" => self.possible_types,
            "interfaces" => self.interfaces,
            "fields" => self.fields,
            "inputFields" => self.input_fields,
            "args" => self.args,
            "enumValues" => self.enum_values,
            "directives" => self.directives,
            "locations" => self.locations,
            _ => 1,
        }
    }
}

/// What introspection may cost in one document.
#[derive(Clone, Copy, Debug)]
pub struct IntrospectionBudget {
    factors: Factors,
    /// The heaviest document allowed: twice the standard query.
    pub max_weight: u64,
    /// What the standard query weighs.
    pub standard_weight: u64,
}

impl IntrospectionBudget {
    /// The budget of the schema whose SDL this is.
    pub fn of_sdl(sdl: &str) -> IntrospectionBudget {
        let factors = Factors::of_sdl(sdl);
        let mut budget = IntrospectionBudget {
            factors,
            max_weight: u64::MAX,
            standard_weight: 0,
        };
        let doc = async_graphql::parser::parse_query(STANDARD_QUERY).expect("the standard introspection query parses");
        budget.standard_weight = budget.weight(&doc);
        budget.max_weight = budget.standard_weight.saturating_mul(2);
        budget
    }

    /// The weight of every `__schema` and `__type` the operations of `doc` select (at their
    /// root, directly or through fragments), each fragment counted once.
    pub fn weight(&self, doc: &ExecutableDocument) -> u64 {
        let mut memo = Memo::default();
        let mut total = 0u64;
        for (_, op) in doc.operations.iter() {
            total = total.saturating_add(self.roots(doc, &op.node.selection_set.node, &mut memo));
        }
        total
    }

    /// Refuses a document heavier than the budget.
    pub fn check(&self, doc: &ExecutableDocument) -> ServerResult<()> {
        let w = self.weight(doc);
        if w > self.max_weight {
            return Err(super::limits::refusal(format!(
                "query too complex: its introspection could answer about {w} values (limit {}, twice \
                 the whole schema); ask for the schema once",
                self.max_weight
            )));
        }
        Ok(())
    }

    /// Root level: only `__schema` and `__type` weigh (other fields are the complexity limit's).
    fn roots<'d>(&self, doc: &'d ExecutableDocument, set: &'d SelectionSet, memo: &mut Memo<'d>) -> u64 {
        let mut w = 0u64;
        for item in &set.items {
            let here = match &item.node {
                Selection::Field(f) => match f.node.name.node.as_str() {
                    "__schema" | "__type" => 1u64.saturating_add(self.inside(doc, &f.node.selection_set.node, memo)),
                    _ => 0,
                },
                Selection::InlineFragment(f) => self.roots(doc, &f.node.selection_set.node, memo),
                Selection::FragmentSpread(s) => {
                    let name = s.node.fragment_name.node.as_str();
                    match memo.roots.get(name) {
                        Some(w) => *w,
                        None => {
                            // A cycle is refused by the document bounds before this runs;
                            // counted as nothing meanwhile.
                            memo.roots.insert(name, 0);
                            let w = doc
                                .fragments
                                .get_key_value(name)
                                .map(|(_, frag)| self.roots(doc, &frag.node.selection_set.node, memo))
                                .unwrap_or(0);
                            memo.roots.insert(name, w);
                            w
                        }
                    }
                }
            };
            w = w.saturating_add(here);
        }
        w
    }

    /// Inside `__schema` / `__type`: every field is a value, lists multiply.
    fn inside<'d>(&self, doc: &'d ExecutableDocument, set: &'d SelectionSet, memo: &mut Memo<'d>) -> u64 {
        let mut w = 0u64;
        for item in &set.items {
            let here = match &item.node {
                Selection::Field(f) => {
                    let factor = self.factors.of_field(f.node.name.node.as_str());
                    factor.saturating_mul(1u64.saturating_add(self.inside(doc, &f.node.selection_set.node, memo)))
                }
                Selection::InlineFragment(f) => self.inside(doc, &f.node.selection_set.node, memo),
                Selection::FragmentSpread(s) => {
                    let name = s.node.fragment_name.node.as_str();
                    match memo.inside.get(name) {
                        Some(w) => *w,
                        None => {
                            memo.inside.insert(name, 0);
                            let w = doc
                                .fragments
                                .get_key_value(name)
                                .map(|(_, frag)| self.inside(doc, &frag.node.selection_set.node, memo))
                                .unwrap_or(0);
                            memo.inside.insert(name, w);
                            w
                        }
                    }
                }
            };
            w = w.saturating_add(here);
        }
        w
    }
}

#[derive(Default)]
struct Memo<'d> {
    roots: HashMap<&'d str, u64>,
    inside: HashMap<&'d str, u64>,
}

/// How many different introspection answers are kept.
const KEPT_ANSWERS: usize = 64;

/// The schema that answers introspection-only documents, and the answers it gave: the same
/// document (with the same operation name and variables) is answered from memory.
#[derive(Clone)]
pub struct Introspection {
    schema: AppSchema,
    answers: Arc<Mutex<HashMap<[u8; 32], async_graphql::Value>>>,
}

impl Introspection {
    pub fn new(schema: AppSchema) -> Introspection {
        Introspection {
            schema,
            answers: Default::default(),
        }
    }

    /// Answers an introspection-only request (see [`super::is_introspection_only`]).
    pub async fn execute(&self, request: async_graphql::Request) -> async_graphql::Response {
        let key = answer_key(&request);
        if let Some(data) = self.answers.lock().expect("introspection answers").get(&key) {
            return async_graphql::Response::new(data.clone());
        }
        let response = self.schema.execute(request).await;
        if response.errors.is_empty() && response.extensions.is_empty() {
            let mut answers = self.answers.lock().expect("introspection answers");
            if answers.len() >= KEPT_ANSWERS {
                // Documents that vary without end (comments, spacing) are answered, not kept.
                if let Some(k) = answers.keys().next().copied() {
                    answers.remove(&k);
                }
            }
            answers.insert(key, response.data.clone());
        }
        response
    }

    /// How many answers are kept (for tests).
    pub fn kept(&self) -> usize {
        self.answers.lock().expect("introspection answers").len()
    }
}

fn answer_key(request: &async_graphql::Request) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(request.query.as_bytes());
    h.update([0]);
    h.update(request.operation_name.as_deref().unwrap_or("").as_bytes());
    h.update([0]);
    h.update(serde_json::to_vec(&request.variables).unwrap_or_default());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget() -> IntrospectionBudget {
        IntrospectionBudget::of_sdl(&crate::graphql::sdl())
    }

    fn weight(b: &IntrospectionBudget, q: &str) -> u64 {
        b.weight(&async_graphql::parser::parse_query(q).unwrap())
    }

    #[test]
    fn aliases_fragments_and_repeats_add_up() {
        let b = budget();
        assert!(b.standard_weight > 1_000, "{b:?}");
        let one = "__schema { types { name fields { name args { name } type { name } } } }";
        let w1 = weight(&b, &format!("{{ {one} }}"));
        let many: String = (0..200).map(|i| format!("a{i}: {one} ")).collect();
        let w200 = weight(&b, &format!("{{ {many} }}"));
        assert_eq!(w200, w1 * 200);
        assert!(w200 > b.max_weight, "{w200} <= {}", b.max_weight);
        // The same through a fragment spread many times over.
        let spread: String = (0..200).map(|_| "...S ").collect();
        let q = format!("{{ {spread} }} fragment S on Query {{ {one} }}");
        assert_eq!(weight(&b, &q), w200);
        // Nested lists multiply: types inside types.
        let q = "{ __schema { a: types { name } b: types { name } } }";
        assert_eq!(weight(&b, q), 1 + 2 * b.factors.types * 2);
        // The standard query is within the budget, three copies of it are not.
        assert!(b.standard_weight <= b.max_weight);
        let doc = async_graphql::parser::parse_query(STANDARD_QUERY).unwrap();
        let body = STANDARD_QUERY.split_once("__schema").unwrap().1;
        let body = body.split_once("\n}\n").unwrap().0;
        let three = format!("query {{ a: __schema {body} b: __schema {body} c: __schema {body} }}");
        let three = STANDARD_QUERY.replacen(STANDARD_QUERY.split("\n\nfragment").next().unwrap(), &three, 1);
        assert_eq!(b.weight(&doc), b.standard_weight);
        let w3 = weight(&b, &three);
        assert_eq!(w3, 3 * b.standard_weight, "{three}");
        assert!(w3 > b.max_weight);
        eprintln!("introspection budget: {b:?}");
        // Fields outside introspection weigh nothing here.
        assert_eq!(weight(&b, "{ me { role } __typename }"), 0);
    }
}
