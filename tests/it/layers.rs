//! Issues 15 and 25: layers point one way. The layers are the workspace's crates ([`CRATES`]),
//! and inside them the modules are ranked by [`RANKS`] (longest module-path prefix wins). Every
//! `crates/*/src/**/*.rs` and `src/**/*.rs` is read; the module paths its code uses (`use`
//! declarations and inline paths starting with `crate::`, `super::`, `self::` or a child
//! module's name; comments, literals and `#[cfg(test)]` items left out) are resolved to the
//! modules' names across the workspace (each crate reaches the lower layers under their own
//! names, `crate::domain::…`), and the file and each target are ranked. A module may use its own
//! rank or lower ones, and within rank 5 only the modules listed before it. Each crate holds
//! only modules of its ranks and depends only on crates below it; every `.sql` statement that
//! writes a table sits in the module that owns the table ([`TABLES`]). ARCHITECTURE.md's
//! "Layers" table is generated from these tables and checked here
//! (`FITORDER_BLESS=1 cargo test --test it layers` writes it).

use std::fmt;
use std::path::{Path, PathBuf};

/// Module-path prefix, rank, and place within the rank (only rank 5 orders its members).
const RANKS: &[(&str, u8, u8)] = &[
    // 0: the pure rules (no async-graphql, no diesel, no I/O).
    ("domain", 0, 0),
    // 1: what everything shares.
    ("trace", 1, 0),
    ("error", 1, 0),
    ("config", 1, 0),
    ("auth", 1, 0),
    // The per-key rate limiter (sign-in, placing orders).
    ("ratelimit", 1, 0),
    // Bounds on text from outside, measured before any recursive parser sees it.
    ("bounds", 1, 0),
    ("logging", 1, 0),
    // 2: the database and its notifications.
    ("db", 2, 0),
    ("events", 2, 0),
    // 3: the payment providers' clients.
    ("providers::provider", 3, 0),
    ("providers::api", 3, 0),
    ("providers::keys", 3, 0),
    ("providers::wechat", 3, 0),
    ("providers::alipay", 3, 0),
    ("providers::crypto", 3, 0),
    ("providers::platform_keys", 3, 0),
    ("providers::seen", 3, 0),
    ("providers::sampling", 3, 0),
    // The providers' bills: unpacking and parsing (each provider's `Plugin` names its own).
    ("providers::bills", 3, 0),
    // WeChat's mini-program API (members signing in).
    ("miniprogram", 3, 0),
    // 4: the shared state.
    ("app", 4, 0),
    // 5: the capabilities, each using only those before it. Tickets are a leaf the others call.
    ("tickets", 5, 0),
    // The outbox: effects enqueued in the transaction of the change that causes them (alert
    // deliveries too, so before `alerts`).
    ("outbox", 5, 1),
    ("alerts", 5, 2),
    // Prepaid money: the rules, the caps, the calendar, the ledger (read by the wallet, orders
    // and the catalog where money comes in; its overdue sweep opens tickets with alerts).
    ("prepaid", 5, 3),
    ("wallet", 5, 4),
    // Membership cards: their state machine, freezing and transferring (the transfer's fee
    // from the wallet, the new holder's prepaid caps); orders start and revoke cards here.
    ("memberships", 5, 5),
    ("compensation", 5, 9),
    ("orders", 5, 6),
    ("catalog", 5, 7),
    // Members signing in and their sessions (binding makes members through the catalog).
    ("sessions", 5, 8),
    // Trades and applying payments.
    ("payments", 5, 8),
    // What closing a ticket does to orders and money (above orders, payments and the outbox).
    ("ticket_resolution", 5, 9),
    // A coach's session canceled: its bookings canceled or refunded (above orders and payments:
    // trades are closed first).
    ("slot_cancel", 5, 9),
    // The day's takings per date and payment method (reads only).
    ("sales", 5, 9),
    // The outbox's delivery: the worker and the downstream calls it makes.
    ("compensation::worker", 5, 10),
    ("compensation::downstream", 5, 10),
    ("expiry", 5, 11),
    ("reconciliation", 5, 12),
    ("timeline", 5, 13),
    ("anomalies", 5, 14),
    // Every scheduled task and background loop is registered here.
    ("tasks", 5, 15),
    // 6: the API.
    ("graphql", 6, 0),
    ("http", 6, 0),
    // 7: the development tools (the provider sandbox, the dev keys, the private PostgreSQL,
    // demo data, fuzzing entry points), the wiring and the binary.
    ("dev", 7, 0),
    ("server", 7, 0),
    ("main", 7, 0),
];

/// The workspace's crates, lowest first: directory, the ranks its modules have, how its own
/// top-level modules are named across the workspace (`db`'s `models` is `db::models`), the
/// modules it keeps at their own names, and the name it calls itself by (`use crate as db`).
struct Crate {
    dir: &'static str,
    ranks: std::ops::RangeInclusive<u8>,
    mount: &'static str,
    unmounted: &'static [&'static str],
    /// What its `lib.rs` is, when it is more than a list of modules.
    root: Option<&'static str>,
    what: &'static str,
}

const CRATES: &[Crate] = &[
    Crate { dir: "crates/domain", ranks: 0..=0, mount: "domain", unmounted: &[], root: Some("domain"),
        what: "the pure rules: the vocabulary, the state machine, money, schedules, `Actor`, `Ctx`, `TraceId`; no I/O (diesel's TEXT mapping of the words only behind its `diesel` feature, `domain::sql`)" },
    Crate { dir: "crates/base", ranks: 1..=1, mount: "", unmounted: &[], root: None,
        what: "what every layer shares" },
    Crate { dir: "crates/db", ranks: 2..=2, mount: "db", unmounted: &["events"], root: Some("db"),
        what: "pools, migrations, schema, rows, `StaticQuery`, the LISTEN loop" },
    Crate { dir: "crates/providers", ranks: 3..=3, mount: "providers", unmounted: &["miniprogram"], root: None,
        what: "the providers' clients: WeChat Pay, Alipay, their keys and certificates; WeChat's mini-program API" },
    Crate { dir: "crates/capabilities", ranks: 4..=5, mount: "", unmounted: &[], root: None,
        what: "the shared state and the capabilities" },
    Crate { dir: "crates/api", ranks: 6..=6, mount: "", unmounted: &[], root: None,
        what: "GraphQL (the schema, apart from any transport) and HTTP" },
    Crate { dir: "crates/dev", ranks: 7..=7, mount: "dev", unmounted: &[], root: None,
        what: "development tools, used by the binary's wiring only" },
    Crate { dir: ".", ranks: 7..=7, mount: "", unmounted: &[], root: None,
        what: "the binary (`main.rs` parses and wires) and `server` (the roles' wiring)" },
];

/// The crate a package directory names (`crates/db` is `fitorder-db`, `.` is `fitorder`).
fn package_name(c: &Crate) -> String {
    match c.dir.strip_prefix("crates/") {
        Some(d) => format!("fitorder-{d}"),
        None => "fitorder".to_string(),
    }
}

/// Uses that break the rule but are being fixed on another branch: (using module prefix, used
/// module prefix). An entry nothing matches any more fails the test, so it is removed when the
/// fix lands.
const PENDING: &[(&str, &str)] = &[];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rank {
    rank: u8,
    place: u8,
    entry: &'static str,
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rank == 5 {
            write!(f, "rank 5.{} `{}`", self.place, self.entry)
        } else {
            write!(f, "rank {} `{}`", self.rank, self.entry)
        }
    }
}

fn rank_of(module: &[String]) -> Option<Rank> {
    RANKS
        .iter()
        .filter(|(prefix, ..)| {
            let p: Vec<&str> = prefix.split("::").collect();
            p.len() <= module.len() && p.iter().zip(module).all(|(a, b)| *a == b)
        })
        .max_by_key(|(prefix, ..)| prefix.split("::").count())
        .map(|&(entry, rank, place)| Rank { rank, place, entry })
}

/// May a module of rank `from` use one of rank `to`?
fn allowed(from: Rank, to: Rank) -> bool {
    to.rank < from.rank || (to.rank == from.rank && (from.rank != 5 || to.place <= from.place))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
    /// A string literal's text (escapes left as written), outside attributes: where a write
    /// of SQL written in Rust is looked for.
    Str(String),
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    line: usize,
}

impl Token {
    fn is(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }
    fn ident(&self) -> Option<&str> {
        match &self.tok {
            Tok::Ident(s) => Some(s),
            _ => None,
        }
    }
}

/// The tokens that matter here: identifiers, `::` and single punctuation. Comments, string,
/// char and number literals and lifetimes are dropped.
fn lex(src: &str) -> Vec<Token> {
    let cs: Vec<char> = src.chars().collect();
    let n = cs.len();
    let at = |i: usize| cs.get(i).copied().unwrap_or('\0');
    let mut out: Vec<Token> = Vec::new();
    let (mut i, mut line) = (0, 1);
    // Inside `#[...]`: its bracket depth.
    let mut attr_depth = 0i32;
    // Skips a quoted literal starting at the opening quote `i`; returns the index after it.
    let skip_quoted = |mut i: usize, line: &mut usize| {
        i += 1;
        while i < n && cs[i] != '"' {
            if cs[i] == '\\' {
                i += 1;
            }
            if at(i) == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i + 1
    };
    while i < n {
        let c = cs[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < n && cs[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < n {
                if cs[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if cs[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if cs[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            let (start, at_line) = (i, line);
            i = skip_quoted(i, &mut line);
            if attr_depth == 0 {
                let text: String = cs[start + 1..i.saturating_sub(1).max(start + 1)].iter().collect();
                out.push(Token {
                    tok: Tok::Str(text),
                    line: at_line,
                });
            }
            // A path named in an attribute's string (`#[graphql(remote = "crate::domain::X")]`).
            if attr_depth > 0 {
                let text: String = cs[start + 1..i.saturating_sub(1).max(start + 1)].iter().collect();
                let is_path = text.split("::").count() > 1
                    && text
                        .split("::")
                        .all(|seg| !seg.is_empty() && seg.chars().all(|c| c.is_alphanumeric() || c == '_'));
                if is_path {
                    out.extend(lex(&text).into_iter().map(|t| Token { line: at_line, ..t }));
                }
            }
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char literal: '\n', '\'', '\u{..}'.
                i += 3;
                while i < n && cs[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or label.
                i += 1;
                while i < n && (cs[i].is_alphanumeric() || cs[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while i < n && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < n && (cs[i].is_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            let word: String = cs[start..i].iter().collect();
            if matches!(word.as_str(), "r" | "br" | "cr") && (at(i) == '"' || at(i) == '#') {
                let mut hashes = 0;
                while at(i + hashes) == '#' {
                    hashes += 1;
                }
                if at(i + hashes) == '"' {
                    // A raw string: ends at a quote followed by as many hashes.
                    let at_line = line;
                    i += hashes + 1;
                    let start = i;
                    while i < n && !(cs[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                        if cs[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                    if attr_depth == 0 {
                        out.push(Token {
                            tok: Tok::Str(cs[start..i.min(n)].iter().collect()),
                            line: at_line,
                        });
                    }
                    i += hashes + 1;
                    continue;
                }
                if word == "r" && hashes == 1 {
                    // A raw identifier, r#type.
                    i += 1;
                    continue;
                }
            }
            if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                i = skip_quoted(i, &mut line);
                continue;
            }
            out.push(Token {
                tok: Tok::Ident(word),
                line,
            });
        } else if c == ':' && at(i + 1) == ':' {
            out.push(Token { tok: Tok::Sep, line });
            i += 2;
        } else {
            if c == '[' {
                let opens_attr = out.last().is_some_and(|t: &Token| t.is('#'))
                    || (out.last().is_some_and(|t: &Token| t.is('!')) && out.len() >= 2 && out[out.len() - 2].is('#'));
                if attr_depth > 0 || opens_attr {
                    attr_depth += 1;
                }
            } else if c == ']' && attr_depth > 0 {
                attr_depth -= 1;
            }
            out.push(Token {
                tok: Tok::Punct(c),
                line,
            });
            i += 1;
        }
    }
    out
}

/// The index after the bracket group opening at `i` (`(`, `[` or `{`).
fn skip_group(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    while i < toks.len() {
        match toks[i].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

fn is_cfg_test(toks: &[Token], i: usize) -> bool {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    toks.len() >= i + want.len()
        && want.iter().zip(&toks[i..]).all(|(w, t)| match &t.tok {
            Tok::Ident(s) => s == w,
            Tok::Punct(c) => w.len() == 1 && w.starts_with(*c),
            Tok::Sep | Tok::Str(_) => false,
        })
}

/// Drops every item marked `#[cfg(test)]`; returns the rest and the names of the modules so
/// marked that live in their own files (`#[cfg(test)] mod samples;`).
fn without_test_items(toks: Vec<Token>) -> (Vec<Token>, Vec<String>) {
    let mut kept = Vec::with_capacity(toks.len());
    let mut test_files = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if !is_cfg_test(&toks, i) {
            kept.push(toks[i].clone());
            i += 1;
            continue;
        }
        i += 7;
        // Further attributes of the same item.
        while i < toks.len() && toks[i].is('#') {
            i = skip_group(&toks, i + 1);
        }
        let start = i;
        // The item ends at its first `;` outside brackets or with its body's closing brace.
        while i < toks.len() {
            if toks[i].is(';') {
                i += 1;
                break;
            }
            if toks[i].is('{') {
                i = skip_group(&toks, i);
                break;
            }
            if toks[i].is('(') || toks[i].is('[') {
                i = skip_group(&toks, i);
                continue;
            }
            i += 1;
        }
        let item = &toks[start..i];
        let words: Vec<_> = item.iter().map(|t| t.ident()).collect();
        if let Some(m) = words.iter().position(|w| *w == Some("mod")) {
            if item.last().is_some_and(|t| t.is(';')) {
                if let Some(Some(name)) = words.get(m + 1) {
                    test_files.push(name.to_string());
                }
            }
        }
    }
    (kept, test_files)
}

/// One module path used by a file, as written and where.
#[derive(Debug, Clone)]
struct Use {
    line: usize,
    /// The path as written, the first segment `crate`, `super`, `self` or a child module.
    path: Vec<String>,
    /// The module the file (or the inline module around the use) is.
    within: Vec<String>,
}

fn use_tree(toks: &[Token], mut i: usize, prefix: &[String], out: &mut Vec<(usize, Vec<String>)>) -> usize {
    let mut path = prefix.to_vec();
    let mut line = None;
    if toks.get(i).is_some_and(|t| t.tok == Tok::Sep) {
        i += 1;
    }
    while let Some(t) = toks.get(i) {
        match &t.tok {
            Tok::Ident(s) => {
                line.get_or_insert(t.line);
                path.push(s.clone());
                i += 1;
                if toks.get(i).is_some_and(|t| t.tok == Tok::Sep) {
                    i += 1;
                    continue;
                }
                break;
            }
            Tok::Punct('{') => {
                i += 1;
                while toks.get(i).is_some_and(|t| !t.is('}')) {
                    i = use_tree(toks, i, &path, out);
                    if toks.get(i).is_some_and(|t| t.is(',')) {
                        i += 1;
                    }
                }
                return i + 1;
            }
            Tok::Punct('*') => {
                i += 1;
                break;
            }
            _ => break,
        }
    }
    if toks.get(i).and_then(Token::ident) == Some("as") {
        i += 2;
    }
    if path.len() > prefix.len() || line.is_some() {
        out.push((line.unwrap_or(toks.get(i).map_or(0, |t| t.line)), path));
    }
    i
}

/// The module paths a file's code uses; `module` is the file's own module path.
fn uses_in(src: &str, module: &[String]) -> (Vec<Use>, Vec<String>) {
    let (toks, test_files) = without_test_items(lex(src));
    // Child modules declared here, by name: `trades::start(..)` in payments/mod.rs is a use.
    let mut children: Vec<String> = Vec::new();
    for w in toks.windows(3) {
        if let (Some("mod"), Some(name)) = (w[0].ident(), w[1].ident()) {
            if w[2].is(';') {
                children.push(name.to_string());
            }
        }
    }
    let mut out = Vec::new();
    // Inline modules open around the current token: (name, brace depth inside it).
    let mut inline: Vec<(String, i32)> = Vec::new();
    let mut depth = 0i32;
    let mut i = 0;
    while i < toks.len() {
        let within: Vec<String> = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(m, _)| m.clone()))
            .collect();
        let t = &toks[i];
        let prev_sep = i > 0 && toks[i - 1].tok == Tok::Sep;
        match t.tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            _ => {}
        }
        let word = t.ident();
        if word == Some("mod") {
            if let (Some(name), Some(true)) = (
                toks.get(i + 1).and_then(Token::ident),
                toks.get(i + 2).map(|t| t.is('{')),
            ) {
                inline.push((name.to_string(), depth + 1));
                depth += 1;
                i += 3;
                continue;
            }
        }
        if word == Some("use") && !prev_sep && !toks.get(i + 1).is_some_and(|t| t.is('<')) {
            let mut found = Vec::new();
            i = use_tree(&toks, i + 1, &[], &mut found);
            for (line, path) in found {
                let first = path[0].as_str();
                let local = matches!(first, "crate" | "super" | "self")
                    || (inline.is_empty() && children.iter().any(|c| c == first));
                if local {
                    out.push(Use {
                        line,
                        path,
                        within: within.clone(),
                    });
                }
            }
            continue;
        }
        let starts_path = match word {
            Some("crate" | "super" | "self") => true,
            Some(w) => inline.is_empty() && children.iter().any(|c| c == w),
            None => false,
        };
        if starts_path && !prev_sep && toks.get(i + 1).is_some_and(|t| t.tok == Tok::Sep) {
            let line = t.line;
            let mut path = vec![word.unwrap().to_string()];
            i += 1;
            while toks.get(i).is_some_and(|t| t.tok == Tok::Sep) {
                match toks.get(i + 1).and_then(Token::ident) {
                    Some(s) => path.push(s.to_string()),
                    None => break,
                }
                i += 2;
            }
            out.push(Use { line, path, within });
            continue;
        }
        i += 1;
    }
    (out, test_files)
}

/// The module (or item) a path names, from the crate root.
fn resolve(u: &Use) -> Vec<String> {
    let mut base = u.within.clone();
    let mut rest = &u.path[..];
    match rest[0].as_str() {
        "crate" => {
            base.clear();
            rest = &rest[1..];
        }
        "self" => rest = &rest[1..],
        _ => {}
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest = &rest[1..];
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    base
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// src/orders/mod.rs -> orders, src/payments/trades.rs -> payments::trades,
/// src/lib.rs -> the crate root, src/main.rs -> main.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib") {
        parts.push(stem.to_string());
    }
    parts
}

#[derive(Debug)]
struct Finding {
    file: String,
    line: usize,
    written: String,
    from: Rank,
    to: Rank,
}

/// Every use in the crate's sources that points up, and every file or target the table does not
/// rank; and how many uses were looked at.
fn scan(krate: &Crate) -> (Vec<Finding>, Vec<String>, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(krate.dir);
    let src_dir = &root.join("src");
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    files.sort();
    // The crate's own top-level modules (`pub mod x;` in lib.rs): paths through them are mounted.
    let lib = std::fs::read_to_string(src_dir.join("lib.rs")).unwrap_or_default();
    let (lib_toks, _) = without_test_items(lex(&lib));
    let own: Vec<String> = lib_toks
        .windows(3)
        .filter(|w| w[0].ident() == Some("mod") && w[2].is(';'))
        .filter_map(|w| w[1].ident().map(String::from))
        .collect();
    let mount = |physical: Vec<String>| -> Vec<String> {
        let mut p = physical;
        // `crate::db::…` inside `fitorder-db` (`use crate as db`) is the crate itself.
        let name = krate.root.unwrap_or(krate.mount);
        let via_self = !name.is_empty() && p.first().is_some_and(|f| f == name);
        if via_self {
            p.remove(0);
        }
        let root = || krate.root.map(|r| vec![r.to_string()]).unwrap_or_default();
        match p.first() {
            None => root(),
            Some(first)
                if own.contains(first) && !krate.unmounted.contains(&first.as_str()) && !krate.mount.is_empty() =>
            {
                std::iter::once(krate.mount.to_string()).chain(p).collect()
            }
            // A module of its own at its own name.
            Some(first) if own.contains(first) => p,
            // An item of the crate's root, reached through its own name.
            Some(_) if via_self => root().into_iter().chain(p).collect(),
            // A lower layer under its name.
            Some(_) if rank_of(&p).is_some() => p,
            // An item of the crate's root (`super::DbPool` in a module of `fitorder-db`).
            Some(_) => root().into_iter().chain(p).collect(),
        }
    };
    let mut parsed = Vec::new();
    let mut test_modules: Vec<Vec<String>> = Vec::new();
    for f in &files {
        let module = module_of(f.strip_prefix(src_dir).unwrap());
        if krate.dir == "." && module.first().is_some_and(|m| m == "bin") {
            continue;
        }
        let src = std::fs::read_to_string(f).unwrap();
        let (uses, test_files) = uses_in(&src, &module);
        test_modules.extend(
            test_files
                .into_iter()
                .map(|t| module.iter().cloned().chain([t]).collect()),
        );
        parsed.push((f, module, uses));
    }
    let (mut findings, mut unranked, mut looked) = (Vec::new(), Vec::new(), 0);
    for (f, module, uses) in parsed {
        let file = format!(
            "{}",
            f.strip_prefix(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap().display()
        );
        // Modules compiled only for tests.
        if test_modules.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let logical = mount(module.clone());
        // The crate root when it only declares modules and names the lower layers.
        if logical.is_empty() {
            continue;
        }
        let Some(from) = rank_of(&logical) else {
            unranked.push(format!("{file}: module `{}` has no rank", logical.join("::")));
            continue;
        };
        if !krate.ranks.contains(&from.rank) {
            unranked.push(format!(
                "{file}: module `{}` is {from}, not a rank of {}",
                logical.join("::"),
                krate.dir
            ));
        }
        for u in uses {
            looked += 1;
            let target = mount(resolve(&u));
            let Some(to) = rank_of(&target) else {
                unranked.push(format!(
                    "{file}:{}: `{}` names nothing ranked",
                    u.line,
                    u.path.join("::")
                ));
                continue;
            };
            if !allowed(from, to) {
                let written = u
                    .path
                    .iter()
                    .filter(|s| *s != "self" || u.path[0] == **s)
                    .cloned()
                    .collect::<Vec<_>>();
                findings.push(Finding {
                    file: file.clone(),
                    line: u.line,
                    written: written.join("::"),
                    from,
                    to,
                });
            }
        }
    }
    (findings, unranked, looked)
}

#[test]
fn no_module_uses_a_layer_above_it() {
    let (mut findings, mut unranked, mut looked) = (Vec::new(), Vec::new(), 0);
    for krate in CRATES {
        let (f, u, l) = scan(krate);
        // The scan really read each crate.
        assert!(
            l > 10 || krate.dir == ".",
            "only {l} module paths found in {}",
            krate.dir
        );
        findings.extend(f);
        unranked.extend(u);
        looked += l;
    }
    assert!(looked > 1000, "only {looked} module paths found in the workspace");
    assert!(
        unranked.is_empty(),
        "add these to RANKS (and ARCHITECTURE.md):\n{}",
        unranked.join("\n")
    );

    let pending = |f: &Finding| {
        PENDING
            .iter()
            .any(|&(from, to)| f.from.entry.starts_with(from) && f.to.entry.starts_with(to))
    };
    let stale: Vec<_> = PENDING
        .iter()
        .filter(|&&(from, to)| {
            !findings
                .iter()
                .any(|f| f.from.entry.starts_with(from) && f.to.entry.starts_with(to))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "these PENDING entries are fixed, remove them: {stale:?}"
    );

    let up: Vec<String> = findings
        .iter()
        .filter(|f| !pending(f))
        .map(|f| {
            format!(
                "{}:{}: `{}` is {} but uses {} (`{}`)",
                f.file, f.line, f.from.entry, f.from, f.to, f.written
            )
        })
        .collect();
    assert!(up.is_empty(), "{} uses point up a layer:\n{}", up.len(), up.join("\n"));
}

/// Crates the pure rules may not name: no GraphQL, no database, no runtime, no network.
const IMPURE: &[&str] = &[
    "async_graphql",
    "diesel",
    "diesel_async",
    "tokio",
    "reqwest",
    "axum",
    "hyper",
];

/// Impure crates still named in `domain` while another branch moves them out: (file, crate).
/// Like [`PENDING`], an entry nothing matches any more fails the test.
const PENDING_IMPURE: &[(&str, &str)] = &[];

#[test]
fn domain_names_no_framework_database_or_io_crate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/domain/src");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    // diesel's TEXT mapping of the words, compiled only with the `diesel` feature.
    files.retain(|f| !f.ends_with("sql.rs"));
    files.sort();
    assert!(files.len() >= 5, "only {} files in {}", files.len(), dir.display());
    let mut found = Vec::new();
    for f in files {
        let file = format!("crates/domain/src/{}", f.strip_prefix(&dir).unwrap().display());
        let (toks, _) = without_test_items(lex(&std::fs::read_to_string(&f).unwrap()));
        for (i, t) in toks.iter().enumerate() {
            let Some(name) = t.ident().filter(|n| IMPURE.contains(n)) else {
                continue;
            };
            // A segment inside some other path (`x::tokio`) is not the crate.
            if !(i > 0 && toks[i - 1].tok == Tok::Sep) {
                found.push((file.clone(), name.to_string(), t.line));
            }
        }
    }
    let stale: Vec<_> = PENDING_IMPURE
        .iter()
        .filter(|(file, name)| !found.iter().any(|(f, n, _)| f == file && n == name))
        .collect();
    assert!(
        stale.is_empty(),
        "these PENDING_IMPURE entries are fixed, remove them: {stale:?}"
    );
    let impure: Vec<String> = found
        .iter()
        .filter(|(f, n, _)| !PENDING_IMPURE.iter().any(|(pf, pn)| pf == f && pn == n))
        .map(|(f, n, line)| format!("{f}:{line}: `{n}`"))
        .collect();
    assert!(impure.is_empty(), "domain is pure, but names:\n{}", impure.join("\n"));
}

/// What every layer shares names no GraphQL server crate: how an `AppError` reaches a GraphQL
/// client is the API's (`graphql::error`), and trusted documents are parsed with
/// `async-graphql-parser` alone.
#[test]
fn base_names_no_graphql_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/base");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let named: Vec<&str> = manifest
        .lines()
        .filter(|l| {
            let name = l.split(['=', '.', ' ']).next().unwrap_or_default();
            name == "async-graphql"
        })
        .collect();
    assert!(
        named.is_empty(),
        "crates/base/Cargo.toml depends on async-graphql: {named:?}"
    );
    let dir = root.join("src");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    files.sort();
    assert!(files.len() >= 5, "only {} files in {}", files.len(), dir.display());
    let mut found = Vec::new();
    for f in files {
        let (toks, _) = without_test_items(lex(&std::fs::read_to_string(&f).unwrap()));
        for t in toks.iter().filter(|t| t.ident() == Some("async_graphql")) {
            found.push(format!(
                "crates/base/src/{}:{}",
                f.strip_prefix(&dir).unwrap().display(),
                t.line
            ));
        }
    }
    assert!(found.is_empty(), "base names async_graphql:\n{}", found.join("\n"));
}

/// Resolvers call a capability and map its result: the mutation resolvers neither write to the
/// database themselves (no diesel, no table of `db::schema`) nor drop a result (`let _ =`).
#[test]
fn mutation_resolvers_leave_the_database_to_the_capabilities() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/api/src/graphql/mutation.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let (toks, _) = without_test_items(lex(&text));
    let diesel: Vec<usize> = toks
        .iter()
        .filter(|t| t.ident() == Some("diesel"))
        .map(|t| t.line)
        .collect();
    assert!(
        diesel.is_empty(),
        "src/graphql/mutation.rs uses diesel on lines {diesel:?}"
    );
    let dropped: Vec<usize> = toks
        .windows(3)
        .filter(|w| w[0].ident() == Some("let") && w[1].ident() == Some("_") && w[2].is('='))
        .map(|w| w[0].line)
        .collect();
    assert!(
        dropped.is_empty(),
        "src/graphql/mutation.rs drops results on lines {dropped:?}"
    );
    let (uses, _) = uses_in(&text, &["graphql".to_string(), "mutation".to_string()]);
    assert!(uses.len() > 10, "only {} paths read in {}", uses.len(), path.display());
    let tables: Vec<String> = uses
        .iter()
        .filter(|u| resolve(u).starts_with(&["db".to_string(), "schema".to_string()]))
        .map(|u| format!("line {}: {}", u.line, u.path.join("::")))
        .collect();
    assert!(tables.is_empty(), "src/graphql/mutation.rs names tables: {tables:?}");
}

/// The scanner itself: groups, inline paths, `super`, child modules, and what it must skip.
#[test]
fn the_layer_scan_reads_paths_like_the_compiler() {
    let src = r##"
        //! crate::graphql in a doc comment
        use crate::{db::models::Order, orders::{self, Ctx as C}};
        use super::keys::ProviderKeys;
        use std::fmt;
        mod sub;
        fn f<'a>(x: &'a str) -> char {
            let _ = "crate::graphql::X";
            let _ = r#"crate::http"#;
            crate::alerts::raise(x);
            sub::go();
            '"'
        }
        mod inner {
            use super::Thing;
            #[graphql(remote = "crate::domain::payment::PayChannel", name = "a::")]
            enum E {}
        }
        #[cfg(test)]
        mod tests {
            use crate::graphql::schema;
        }
        #[cfg(test)]
        mod samples;
    "##;
    let module: Vec<String> = vec!["payments".into(), "trades".into()];
    let (uses, test_files) = uses_in(src, &module);
    let got: Vec<(usize, String)> = uses.iter().map(|u| (u.line, resolve(u).join("::"))).collect();
    assert_eq!(
        got,
        vec![
            (3, "db::models::Order".to_string()),
            (3, "orders".to_string()),
            (3, "orders::Ctx".to_string()),
            (4, "payments::keys::ProviderKeys".to_string()),
            (10, "alerts::raise".to_string()),
            (11, "payments::trades::sub::go".to_string()),
            (15, "payments::trades::Thing".to_string()),
            (16, "domain::payment::PayChannel".to_string()),
        ]
    );
    assert_eq!(test_files, vec!["samples".to_string()]);

    let r = |p: &str| rank_of(&p.split("::").map(String::from).collect::<Vec<_>>()).unwrap();
    assert_eq!(r("dev::sandbox_server::wechat").entry, "dev");
    assert_eq!(r("providers::wechat::client").rank, 3);
    assert_eq!(r("payments::trades").rank, 5);
    assert!(allowed(r("orders"), r("wallet")));
    assert!(!allowed(r("wallet"), r("orders")));
    assert!(!allowed(r("db::models"), r("orders")));
    assert!(allowed(r("compensation::worker"), r("payments")));
    assert!(!allowed(r("outbox"), r("payments")));
    assert!(!allowed(r("outbox"), r("orders")));
    assert!(allowed(r("config"), r("auth")));
    assert!(!allowed(r("providers::wechat"), r("payments")));
}

/// Each crate depends (in its Cargo.toml) only on the workspace's crates below it.
#[test]
fn crates_depend_only_on_the_crates_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    for (i, krate) in CRATES.iter().enumerate() {
        let manifest = std::fs::read_to_string(root.join(krate.dir).join("Cargo.toml")).unwrap();
        // Only `[dependencies]`: dev-dependencies serve the tests.
        let deps = manifest
            .split("\n[dependencies]\n")
            .nth(1)
            .map(|d| d.split("\n[").next().unwrap_or(""))
            .unwrap_or("");
        for line in deps.lines() {
            let Some(name) = line.split([' ', '=', '.']).next().filter(|n| n.starts_with("fitorder")) else {
                continue;
            };
            match CRATES.iter().position(|c| package_name(c) == name) {
                Some(j) if CRATES[j].ranks.end() < krate.ranks.start() || (j < i && krate.dir == ".") => {}
                Some(j) => wrong.push(format!(
                    "{} depends on {} (not below it)",
                    package_name(krate),
                    package_name(&CRATES[j])
                )),
                None => wrong.push(format!(
                    "{} depends on {name}, which is not in CRATES",
                    package_name(krate)
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // Every crate of the workspace is a layer.
    let dirs: Vec<String> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| format!("crates/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|d| d != "crates/bench")
        .collect();
    for d in dirs {
        assert!(
            CRATES.iter().any(|c| c.dir == d),
            "{d} is not in CRATES (and ARCHITECTURE.md)"
        );
    }
}

/// Who writes each table (module-path prefixes): the owner first, then any other writer with
/// the reason it may. A write of a table (a `.sql` statement's INSERT, UPDATE or DELETE; in
/// Rust, diesel's `insert_into`/`update`/`delete` or SQL in a string) sits in one of these
/// modules; a table not listed here cannot be written at all.
const TABLES: &[(&str, &[(&str, &str)])] = &[
    ("stores", &[("catalog", "")]),
    (
        "members",
        &[
            ("catalog", ""),
            ("sessions", "binding a WeChat account makes or finds the member"),
            ("payments::trades", "a JSAPI payment keeps the WeChat openid it was started with"),
        ],
    ),
    ("membership_plans", &[("catalog", "")]),
    ("catalog_changes", &[("catalog", "")]),
    (
        "class_packs",
        &[
            ("catalog", ""),
            (
                "orders",
                "`orders/transition.sql` puts back the seat or stock unit of a canceled or refunded order",
            ),
        ],
    ),
    (
        "coach_slots",
        &[
            ("catalog", ""),
            (
                "orders",
                "`orders/transition.sql` puts back the seat or stock unit of a canceled or refunded order",
            ),
            (
                "slot_cancel",
                "`cancelCoachSlot` marks a session canceled once, and settled once its bookings are",
            ),
        ],
    ),
    (
        "orders",
        &[
            ("orders", ""),
            (
                "memberships",
                "a transfer passes the card's order to the new holder (`orders.member_id`) in the transfer's transaction",
            ),
        ],
    ),
    ("order_prepaid", &[("orders", "")]),
    ("prepaid_rules", &[("prepaid", "")]),
    ("business_days", &[("prepaid", "")]),
    ("prepaid_ledger_days", &[("prepaid", "")]),
    ("order_transitions", &[("orders", "")]),
    (
        "wallet_ledger",
        &[
            ("wallet", ""),
            (
                "orders",
                "`orders/transition.sql` unfreezes or refunds the wallet part in the transition's statement",
            ),
        ],
    ),
    ("memberships", &[("memberships", "")]),
    ("membership_freezes", &[("memberships", "")]),
    ("membership_events", &[("memberships", "")]),
    ("check_ins", &[("orders", "")]),
    (
        "payments",
        &[
            ("payments", ""),
            (
                "orders",
                "`orders/pay.sql`: the payment is applied in one statement (ARCHITECTURE.md)",
            ),
        ],
    ),
    (
        "refunds",
        &[
            ("payments", ""),
            (
                "orders::lifecycle",
                "the refund transition opens its refund row in its own transaction (`payments` ranks above `orders`)",
            ),
        ],
    ),
    (
        "payment_callbacks",
        &[
            ("payments", ""),
            (
                "orders",
                "`orders/pay.sql` records the callback's outcome in the payment's statement",
            ),
            ("tasks", "`tasks/data_cleanup.sql`: retention"),
        ],
    ),
    (
        "payment_keys",
        &[("payments", ""), ("tasks", "`tasks/data_cleanup.sql`: retention")],
    ),
    ("payment_trades", &[("payments", "")]),
    (
        "stray_payment_refunds",
        &[
            ("payments", ""),
            (
                "ticket_resolution",
                "a ticket's refund of a stray payment claims it by key in the resolution's transaction",
            ),
        ],
    ),
    ("alipay_public_certs", &[("providers::alipay", "")]),
    ("wechat_platform_certs", &[("providers::platform_keys", "")]),
    ("wechat_platform_cert_refreshes", &[("providers::platform_keys", "")]),
    (
        "compensation_events",
        &[
            ("outbox", ""),
            ("compensation", "the outbox's delivery: claims and completions"),
            (
                "orders",
                "`orders/pay.sql` enqueues the grants in the payment's statement",
            ),
            (
                "payments",
                "`payments/refund_confirmed.sql`: a refund the provider confirmed completes its effect",
            ),
            ("tasks", "`tasks/data_cleanup.sql`: retention"),
        ],
    ),
    (
        "compensation_attempts",
        &[
            ("compensation", ""),
            (
                "payments",
                "`payments/refund_confirmed.sql` records the confirming attempt",
            ),
            ("tasks", "`tasks/data_cleanup.sql`: retention"),
        ],
    ),
    ("compensation_replays", &[("compensation", "")]),
    (
        "anomaly_events",
        &[
            ("anomalies", ""),
            (
                "orders::check_in",
                "a duplicate check-in is recorded in the check-in's transaction (`anomalies` ranks above `orders`)",
            ),
        ],
    ),
    ("exception_tickets", &[("tickets", "")]),
    (
        "reconciliation_runs",
        &[
            ("reconciliation", ""),
            ("tasks", "`tasks/stuck_runs.sql` ends runs nobody works on"),
        ],
    ),
    ("reconciliation_heals", &[("reconciliation", "")]),
    // The timeline fence runs with the migrations, under their lock (`crates/db/src/fence.sql`).
    ("timeline_fences", &[("db", "")]),
    (
        "bill_rows",
        &[
            ("reconciliation", ""),
            (
                "tasks",
                "`tasks/stuck_runs.sql` drops the half-read rows of a run it ends",
            ),
        ],
    ),
    ("task_runs", &[("tasks", "")]),
    ("read_your_writes", &[("db::replica", "")]),
    ("alert_channel_tokens", &[("alerts", "")]),
    ("alerts", &[("alerts", "")]),
    ("alert_deliveries", &[("alerts", "")]),
    ("alert_attempts", &[("alerts", "")]),
    ("expiry_claims", &[("expiry", "")]),
    ("wechat_access_tokens", &[("miniprogram", "")]),
    ("wechat_bindings", &[("sessions", "")]),
    ("member_sessions", &[("sessions", "")]),
    ("refresh_tokens", &[("sessions", "")]),
];

/// Writes that break [`TABLES`] but are being fixed on another branch: (module prefix, table).
/// An entry nothing matches any more fails the test.
const PENDING_WRITES: &[(&str, &str)] = &[];

/// The tables a piece of SQL writes: `INSERT INTO t`, `UPDATE t` (not `FOR UPDATE`, `DO
/// UPDATE`), `DELETE FROM t`; comments and string literals left out.
fn tables_written(sql: &str) -> Vec<String> {
    let mut text = String::new();
    for line in sql.lines() {
        let line = line.split("--").next().unwrap_or("");
        text.push_str(line);
        text.push('\n');
    }
    // Drop '...' literals.
    let mut plain = String::new();
    let mut quoted = false;
    for c in text.chars() {
        if c == '\'' {
            quoted = !quoted;
        } else if !quoted {
            plain.push(c);
        }
    }
    let words: Vec<String> = plain
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| words[j].as_str());
        let next = words.get(i + 1).map(String::as_str);
        let table = match (w.as_str(), next) {
            ("insert", Some("into")) | ("delete", Some("from")) => words.get(i + 2),
            ("update", _) if !matches!(prev, Some("for" | "do" | "key")) => words.get(i + 1),
            _ => None,
        };
        if let Some(t) = table.filter(|t| !matches!(t.as_str(), "only" | "of")) {
            out.push(t.clone());
        }
    }
    out
}

fn sql_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sql_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "sql") {
            out.push(path);
        }
    }
}

#[test]
fn every_sql_write_sits_in_the_module_that_owns_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut wrong, mut seen, mut looked) = (Vec::new(), Vec::new(), 0);
    for krate in CRATES.iter().filter(|c| c.dir != ".") {
        let src = root.join(krate.dir).join("src");
        let mut files = Vec::new();
        sql_files(&src, &mut files);
        for f in files {
            // The module of the directory the file sits in, named across the workspace.
            let rel = f.parent().unwrap().strip_prefix(&src).unwrap();
            let mut module: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if !krate.mount.is_empty() && !module.first().is_some_and(|m| krate.unmounted.contains(&m.as_str())) {
                module.insert(0, krate.mount.to_string());
            }
            let module = module.join("::");
            let file = f.strip_prefix(root).unwrap().display().to_string();
            for table in tables_written(&std::fs::read_to_string(&f).unwrap()) {
                looked += 1;
                let Some((_, writers)) = TABLES.iter().find(|(t, _)| *t == table) else {
                    wrong.push(format!("{file}: writes `{table}`, which has no owner in TABLES"));
                    continue;
                };
                let ok = writers
                    .iter()
                    .any(|(w, _)| module == *w || module.starts_with(&format!("{w}::")));
                if ok {
                    continue;
                }
                if PENDING_WRITES.iter().any(|&(m, t)| module.starts_with(m) && t == table) {
                    seen.push((module.clone(), table.clone()));
                    continue;
                }
                wrong.push(format!(
                    "{file}: `{module}` writes `{table}`, owned by `{}`",
                    writers[0].0
                ));
            }
        }
    }
    assert!(looked > 40, "only {looked} writes found in the .sql files");
    let stale: Vec<_> = PENDING_WRITES
        .iter()
        .filter(|&&(m, t)| !seen.iter().any(|(sm, st)| sm.starts_with(m) && st == t))
        .collect();
    assert!(
        stale.is_empty(),
        "these PENDING_WRITES are fixed, remove them: {stale:?}"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The tables a Rust file writes outside its `#[cfg(test)]` items, with their lines: diesel's
/// query builder (`diesel::insert_into(t::table)`, `diesel::update(t::table…)`,
/// `diesel::delete(t…)`, a schema module renamed by `as` resolved) and SQL written in string
/// literals (`sql_query("UPDATE … SET …")`). A builder call whose table the scan cannot name is
/// reported as `?` followed by what it saw, so a new way of writing cannot slip past.
fn rust_writes(src: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let (toks, test_files) = without_test_items(lex(src));
    let known = |t: &str| TABLES.iter().any(|(name, _)| *name == t);
    // `schema::{reconciliation_runs as rr}`, `schema::stray_payment_refunds as spr`.
    let mut aliases: Vec<(String, String)> = Vec::new();
    for w in toks.windows(3) {
        if let (Some(table), Some("as"), Some(alias)) = (w[0].ident(), w[1].ident(), w[2].ident()) {
            if known(table) {
                aliases.push((alias.to_string(), table.to_string()));
            }
        }
    }
    let table_of = |name: &str| -> Option<String> {
        if known(name) {
            return Some(name.to_string());
        }
        aliases.iter().find(|(a, _)| a == name).map(|(_, t)| t.clone())
    };
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if let Tok::Str(text) = &t.tok {
            let sql = text.contains("INSERT INTO")
                || text.contains("DELETE FROM")
                || (text.contains("UPDATE ") && text.contains(" SET "));
            if sql {
                out.extend(tables_written(text).into_iter().map(|table| (t.line, table)));
            }
            continue;
        }
        let Some(f @ ("insert_into" | "update" | "delete")) = t.ident() else {
            continue;
        };
        let via_diesel = i >= 2 && toks[i - 1].tok == Tok::Sep && toks[i - 2].ident() == Some("diesel");
        let bare_insert = f == "insert_into" && !(i >= 1 && toks[i - 1].tok == Tok::Sep);
        if !(via_diesel || bare_insert) || !toks.get(i + 1).is_some_and(|t| t.is('(')) {
            continue;
        }
        // The first path inside the call: `orders::table…`, `rr::table…`, `orders.filter(…)`.
        let first = toks.get(i + 2).and_then(Token::ident).unwrap_or("");
        match table_of(first) {
            Some(table) => out.push((t.line, table)),
            None => out.push((t.line, format!("? diesel::{f}({first}…"))),
        }
    }
    (out, test_files)
}

#[test]
fn every_rust_write_sits_in_the_module_that_owns_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (mut wrong, mut looked) = (Vec::new(), 0);
    for krate in CRATES {
        let src = root.join(krate.dir).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        let mut scanned = Vec::new();
        let mut test_modules: Vec<Vec<String>> = Vec::new();
        for f in &files {
            let module = module_of(f.strip_prefix(&src).unwrap());
            let (writes, test_files) = rust_writes(&std::fs::read_to_string(f).unwrap());
            test_modules.extend(
                test_files
                    .into_iter()
                    .map(|t| module.iter().cloned().chain([t]).collect()),
            );
            scanned.push((f, module, writes));
        }
        for (f, physical, writes) in scanned {
            // Modules compiled only for tests (`#[cfg(test)] mod tests;`) and the binary's bins.
            if test_modules.iter().any(|t| physical.starts_with(t))
                || (krate.dir == "." && physical.first().is_some_and(|m| m == "bin"))
            {
                continue;
            }
            let mut module = physical;
            if !krate.mount.is_empty() && !module.first().is_some_and(|m| krate.unmounted.contains(&m.as_str())) {
                module.insert(0, krate.mount.to_string());
            }
            let module = module.join("::");
            let file = f.strip_prefix(root).unwrap().display().to_string();
            for (line, table) in writes {
                looked += 1;
                if table.starts_with('?') {
                    wrong.push(format!(
                        "{file}:{line}: a write the scan cannot name the table of: {table}"
                    ));
                    continue;
                }
                let Some((_, writers)) = TABLES.iter().find(|(t, _)| *t == table) else {
                    wrong.push(format!("{file}:{line}: writes `{table}`, which has no owner in TABLES"));
                    continue;
                };
                let ok = writers
                    .iter()
                    .any(|(w, _)| module == *w || module.starts_with(&format!("{w}::")));
                if !ok && !PENDING_WRITES.iter().any(|&(m, t)| module.starts_with(m) && t == table) {
                    wrong.push(format!(
                        "{file}:{line}: `{module}` writes `{table}`, owned by `{}`",
                        writers[0].0
                    ));
                }
            }
        }
    }
    assert!(looked > 40, "only {looked} writes found in the Rust sources");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_rust_scan_finds_builder_and_literal_writes() {
    let src = r##"
        use crate::db::schema::{reconciliation_runs as rr, orders};
        fn f() {
            diesel::insert_into(rr::table).values(x);
            diesel::update(orders::table.find(1)).set(y);
            diesel::delete(orders.filter(z));
            diesel::sql_query("UPDATE stores SET name = $1");
            let _ = "update the card's state";
            diesel::update(somewhere_new::table);
            orders::table.for_update();
        }
        #[cfg(test)]
        mod tests { fn g() { diesel::delete(members::table); } }
    "##;
    let (writes, _) = rust_writes(src);
    let tables: Vec<&str> = writes.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        tables,
        [
            "reconciliation_runs",
            "orders",
            "orders",
            "stores",
            "? diesel::update(somewhere_new…"
        ]
    );
}

#[test]
fn the_sql_scan_finds_writes_and_only_writes() {
    let sql = "-- UPDATE orders in a comment\nWITH x AS (SELECT 1 FROM t FOR UPDATE SKIP LOCKED)\n\
               INSERT INTO a (v) VALUES ('update b') ON CONFLICT DO UPDATE SET v = 1;\n\
               UPDATE c SET v = 2; DELETE FROM d; SELECT * FROM e FOR NO KEY UPDATE";
    assert_eq!(tables_written(sql), vec!["a", "c", "d"]);
}

/// ARCHITECTURE.md's "Layers" table, made from [`CRATES`] and [`RANKS`].
fn layers_table() -> String {
    let mut out = String::from("| crate | rank | modules |\n| --- | --- | --- |\n");
    for krate in CRATES {
        for rank in krate.ranks.clone() {
            let mut entries: Vec<(u8, &str)> = RANKS
                .iter()
                .filter(|(e, r, _)| {
                    *r == rank && {
                        let first = e.split("::").next().unwrap();
                        // The module lives in this crate?
                        if krate.dir == "." {
                            matches!(first, "server" | "main")
                        } else if krate.mount.is_empty() {
                            !matches!(
                                first,
                                "domain" | "db" | "events" | "providers" | "miniprogram" | "dev" | "server" | "main"
                            )
                        } else {
                            first == krate.mount || krate.unmounted.contains(&first)
                        }
                    }
                })
                .map(|(e, _, p)| (*p, *e))
                .collect();
            entries.sort_by_key(|(p, _)| *p);
            let mut names: Vec<String> = Vec::new();
            for (place, e) in entries {
                let name = format!("`{e}`");
                if !names.contains(&name) {
                    names.push(if rank == 5 { format!("{place}. {name}") } else { name });
                }
            }
            out.push_str(&format!(
                "| `{}` ({}) | {rank} | {} |\n",
                package_name(krate),
                krate.what,
                names.join(", ")
            ));
        }
    }
    out
}

#[test]
fn architecture_md_shows_the_layers_of_this_test() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = (
        "<!-- layers: generated by tests/it/layers.rs -->\n",
        "<!-- layers: end -->",
    );
    let want = layers_table();
    let (Some(a), Some(b)) = (doc.find(begin), doc.find(end)) else {
        panic!("ARCHITECTURE.md has no `{}` … `{end}` block", begin.trim());
    };
    let have = &doc[a + begin.len()..b];
    if have != want {
        if std::env::var_os("FITORDER_BLESS").is_some() {
            let new = format!("{}{want}{}", &doc[..a + begin.len()], &doc[b..]);
            std::fs::write(&path, new).unwrap();
        } else {
            panic!("ARCHITECTURE.md's Layers table differs from tests/it/layers.rs; run FITORDER_BLESS=1 cargo test --test it layers, or write:\n{want}");
        }
    }
}
