//! Bounds on text from outside, measured before any recursive parser sees it.
//!
//! async-graphql's parser recurses once per level of nesting inside a value (`[[[[…]]]]`,
//! `{a:{a:…}}`) and in list types (`[[[Int]]]`), with no limit of its own: 1,500 levels in a
//! 3 KB document overflowed a tokio worker's stack and aborted the process. Its cost also grows
//! with tokens, not bytes (31,000 integers in 62 KB took 45 ms and held 3.3 MB of tree). So a
//! GraphQL document's text is first scanned here, once, in a loop that allocates nothing and
//! cannot recurse: how many lexical tokens it has and how deep its brackets nest. A document
//! over either bound is refused before it is parsed.
//!
//! The scan lexes as the GraphQL specification (and async-graphql's grammar) does: comments
//! run to the end of the line, strings to their closing quote (`\"` escaped; a line break ends
//! an ordinary string, block strings `"""…"""` may hold them, `\"""` escaped), so brackets in
//! strings and comments are not counted, as the parser does not descend into them. Wherever
//! the scan could lex otherwise than the parser, it counts more nesting, never less: the parser
//! reaches a depth only through text that parses, and on such text both lex alike.
//!
//! JSON from outside (request bodies, variables, WebSocket messages, provider notifications,
//! tokens) is read by serde_json, whose own recursion limit (128 levels) refuses deeper input
//! with an error; nothing here enables its `unbounded_depth`.

/// What a GraphQL document's text weighs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    /// Lexical tokens: names, numbers, strings, punctuators (`...` is one; commas, white
    /// space and comments are none).
    pub tokens: usize,
    /// The deepest nesting of `{`, `[` and `(` together.
    pub nesting: usize,
}

/// The most tokens a document may have, by who sends it: a caller without a token runs only
/// the sign-in mutations (a few dozen tokens) and, where allowed, introspection (GraphiQL's
/// query has about 160); the member app's documents have a few hundred; staff tools more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct TokenBudget {
    /// Tokens of a GraphQL document sent without a token, counted before it is parsed.
    #[arg(id = "max-document-tokens-anonymous", long = "max-document-tokens-anonymous", env = "FITORDER_MAX_DOCUMENT_TOKENS_ANONYMOUS", value_name = "N",
        default_value_t = TokenBudget::DEFAULT.anonymous)]
    pub anonymous: usize,
    /// The same for a member's document.
    #[arg(id = "max-document-tokens-member", long = "max-document-tokens-member", env = "FITORDER_MAX_DOCUMENT_TOKENS_MEMBER", value_name = "N",
        default_value_t = TokenBudget::DEFAULT.member)]
    pub member: usize,
    /// The same for staff.
    #[arg(id = "max-document-tokens", long = "max-document-tokens", env = "FITORDER_MAX_DOCUMENT_TOKENS", value_name = "N",
        default_value_t = TokenBudget::DEFAULT.staff)]
    pub staff: usize,
}

impl TokenBudget {
    pub const DEFAULT: TokenBudget = TokenBudget {
        anonymous: 1_000,
        member: 4_000,
        staff: 20_000,
    };
}

/// The default deepest nesting of brackets in a document.
pub const DEFAULT_NESTING: usize = 32;

/// Measures `text`, stopping as soon as it has more than `stop.tokens` tokens or nests deeper
/// than `stop.nesting` (the answer then exceeds `stop`: the scan of a large refused document
/// costs no more than that of an admitted one).
pub fn graphql_shape(text: &str, stop: Shape) -> Shape {
    let b = text.as_bytes();
    let n = b.len();
    let mut i = 0;
    let mut shape = Shape::default();
    let mut depth = 0usize;
    while i < n {
        match b[i] {
            b' ' | b'\t' | b'\n' | b'\r' | b',' => i += 1,
            // U+FEFF (byte order mark) is white space to GraphQL.
            0xEF if b[i..].starts_with(&[0xEF, 0xBB, 0xBF]) => i += 3,
            b'#' => {
                while i < n && b[i] != b'\n' && b[i] != b'\r' {
                    i += 1;
                }
            }
            b'"' if b[i..].starts_with(b"\"\"\"") => {
                shape.tokens += 1;
                i += 3;
                while i < n {
                    if b[i..].starts_with(b"\\\"\"\"") {
                        i += 4;
                    } else if b[i..].starts_with(b"\"\"\"") {
                        i += 3;
                        break;
                    } else {
                        i += 1;
                    }
                }
            }
            b'"' => {
                shape.tokens += 1;
                i += 1;
                while i < n {
                    match b[i] {
                        b'"' => {
                            i += 1;
                            break;
                        }
                        // A line break ends the string for the scan (the parser refuses it).
                        b'\n' | b'\r' => break,
                        b'\\' if i + 1 < n && b[i + 1] != b'\n' && b[i + 1] != b'\r' => i += 2,
                        _ => i += 1,
                    }
                }
            }
            b'{' | b'[' | b'(' => {
                shape.tokens += 1;
                depth += 1;
                shape.nesting = shape.nesting.max(depth);
                i += 1;
            }
            b'}' | b']' | b')' => {
                shape.tokens += 1;
                depth = depth.saturating_sub(1);
                i += 1;
            }
            b'.' if b[i..].starts_with(b"...") => {
                shape.tokens += 1;
                i += 3;
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                shape.tokens += 1;
                while i < n && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                    i += 1;
                }
            }
            c if c == b'-' || c.is_ascii_digit() => {
                shape.tokens += 1;
                i += 1;
                while i < n && (b[i].is_ascii_digit() || matches!(b[i], b'.' | b'e' | b'E' | b'+' | b'-')) {
                    i += 1;
                }
            }
            // Every other character (a punctuator, or one GraphQL does not have) is a token.
            _ => {
                shape.tokens += 1;
                i += 1;
            }
        }
        if shape.tokens > stop.tokens || shape.nesting > stop.nesting {
            break;
        }
    }
    shape
}

/// Why a document's text is refused before it is parsed (None: within `limit`).
pub fn graphql_refusal(text: &str, limit: Shape) -> Option<String> {
    refusal(graphql_shape(text, limit), limit)
}

/// Why a document of `shape` is over `limit` (None: within it).
pub fn refusal(shape: Shape, limit: Shape) -> Option<String> {
    if shape.nesting > limit.nesting {
        Some(format!(
            "query too complex: brackets nested more than {} deep",
            limit.nesting
        ))
    } else if shape.tokens > limit.tokens {
        Some(format!(
            "query too complex: more than {} tokens (names, values and punctuation)",
            limit.tokens
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WIDE: Shape = Shape {
        tokens: usize::MAX,
        nesting: usize::MAX,
    };

    fn shape(text: &str) -> Shape {
        graphql_shape(text, WIDE)
    }

    #[test]
    fn counts_tokens_and_nesting_as_the_grammar_lexes() {
        assert_eq!(shape("{ me { role } }"), Shape { tokens: 6, nesting: 2 });
        // `...`, names, numbers (with sign, fraction, exponent), `$`, `:` and `!`.
        assert_eq!(
            shape("query Q($a: [Int!]!) { f(x: -1.5e+3, y: $a) { ...F } }"),
            Shape { tokens: 28, nesting: 2 }
        );
        // Commas, white space, a byte order mark and comments are no tokens.
        assert_eq!(shape("\u{feff}{a,b} # { [ (\n"), Shape { tokens: 4, nesting: 1 });
    }

    #[test]
    fn brackets_in_strings_and_comments_are_not_nesting() {
        assert_eq!(shape(r#"{ f(s: "[[[{{{") }"#).nesting, 2);
        assert_eq!(shape(r#"{ f(s: "\"[[[") }"#).nesting, 2);
        assert_eq!(shape("{ f(s: \"\"\"[[[\n{{{\\\"\"\"\"\"\") }").nesting, 2);
        assert_eq!(shape("{ f # [[[[\n }").nesting, 1);
        // A comment ends at a carriage return too.
        assert_eq!(shape("{ f # x\r [[[ }").nesting, 4);
    }

    #[test]
    fn what_the_parser_could_read_otherwise_counts_more_not_less() {
        // An ordinary string ends at a line break: the brackets after it count.
        assert_eq!(shape("{ f(s: \"abc\n [[[[ ]]]] \") }").nesting, 6);
        // A backslash before a line break escapes nothing.
        assert_eq!(shape("{ f(s: \"abc\\\n [[[[ \") }").nesting, 6);
        // Closing brackets of the wrong kind still close: the parser stops at them.
        assert_eq!(shape("[ ) [ ) [").nesting, 1);
        // An unterminated block string swallows the rest (the parser refuses it there).
        assert_eq!(shape("{ f(s: \"\"\" [[[[").nesting, 2);
    }

    #[test]
    fn stops_early_and_says_why() {
        let probe = format!(
            "# signOut\nquery S {{ __typename(x: {}1{}) }}",
            "[".repeat(1_500),
            "]".repeat(1_500)
        );
        let limit = Shape {
            tokens: 1_000,
            nesting: 32,
        };
        let s = graphql_shape(&probe, limit);
        assert_eq!(s.nesting, 33, "stopped at the first level past the bound");
        assert!(graphql_refusal(&probe, limit).unwrap().contains("nested more than 32"));
        let wide = format!(
            "mutation {{ signOut(refreshToken: \"x\", x: [{}]) }}",
            "1,".repeat(31_000)
        );
        let s = graphql_shape(&wide, limit);
        assert_eq!(s.tokens, 1_001);
        assert!(graphql_refusal(&wide, limit).unwrap().contains("more than 1000 tokens"));
        assert_eq!(graphql_refusal("{ me { role } }", limit), None);
    }
}
