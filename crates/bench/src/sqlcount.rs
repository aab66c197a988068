//! A counting proxy for the PostgreSQL wire protocol: a server pointed at it talks to the real
//! PostgreSQL through it, and every statement the server sends is counted (simple `Query`
//! messages and extended-protocol `Execute`s, classified by their SQL), as is every round trip
//! (`Sync` or `Query`). Exact and immediate, unlike pg_stat_database, which backends publish
//! seconds late. Used only for counting phases: the timed phases talk to PostgreSQL directly.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Counters {
    statements: AtomicU64,
    transaction_control: AtomicU64,
    pings: AtomicU64,
    round_trips: AtomicU64,
    parses: AtomicU64,
    /// Parses by statement text.
    parsed: std::sync::Mutex<HashMap<String, u64>>,
    /// The last values bound to each statement text (B13: the ledger's statement explained with
    /// the binds the server sent).
    bound: std::sync::Mutex<HashMap<String, Bound>>,
}

/// The parameters one execution of a statement was bound with, as they came over the wire.
#[derive(Clone, Debug)]
struct Bound {
    oids: Vec<u32>,
    formats: Vec<i16>,
    values: Vec<Option<Vec<u8>>>,
}

/// A statement the server executed, with the values it was last bound with, decoded to SQL
/// literals (for `PREPARE … ; EXPLAIN EXECUTE …`).
#[derive(Clone, Debug)]
pub struct Captured {
    pub sql: String,
    /// The parameters' types as PostgreSQL names them, when the driver declared them.
    pub types: Vec<Option<&'static str>>,
    /// The values as SQL text (None: NULL).
    pub values: Vec<Option<String>>,
    /// Why the values could not be decoded (then `values` is empty).
    pub undecoded: Option<String>,
}

fn type_name(oid: u32) -> Option<&'static str> {
    Some(match oid {
        16 => "boolean",
        20 => "bigint",
        21 => "smallint",
        23 => "integer",
        25 => "text",
        1043 => "varchar",
        1082 => "date",
        1114 => "timestamp",
        1184 => "timestamptz",
        _ => return None,
    })
}

/// A bound value as text: text-format values as they are, binary ones decoded for the types
/// the statements of fitorder bind.
fn decode(oid: u32, format: i16, v: &[u8]) -> Result<String> {
    if format == 0 {
        return Ok(String::from_utf8_lossy(v).into_owned());
    }
    let int = |n: usize| -> Result<i64> {
        anyhow::ensure!(v.len() == n, "a {n}-byte value of type {oid} has {} bytes", v.len());
        let mut b = [0u8; 8];
        b[8 - n..].copy_from_slice(v);
        // Sign-extend.
        let shift = 64 - 8 * n as u32;
        Ok((i64::from_be_bytes(b) << shift) >> shift)
    };
    let epoch = chrono::NaiveDate::from_ymd_opt(2000, 1, 1).expect("a date");
    Ok(match oid {
        16 => (v.first() == Some(&1)).to_string(),
        20 => int(8)?.to_string(),
        21 => int(2)?.to_string(),
        23 => int(4)?.to_string(),
        25 | 1043 | 19 => String::from_utf8_lossy(v).into_owned(),
        1082 => (epoch + chrono::Duration::days(int(4)?)).to_string(),
        1114 | 1184 => {
            let at = epoch.and_hms_opt(0, 0, 0).expect("midnight") + chrono::Duration::microseconds(int(8)?);
            format!(
                "{}{}",
                at.format("%Y-%m-%d %H:%M:%S%.6f"),
                if oid == 1184 { "+00" } else { "" }
            )
        }
        other => anyhow::bail!("a binary value of type oid {other}"),
    })
}

impl Bound {
    fn decode(&self, sql: &str) -> Captured {
        let types = (0..self.values.len())
            .map(|i| type_name(self.oids.get(i).copied().unwrap_or(0)))
            .collect();
        match self.values() {
            Ok(values) => Captured {
                sql: sql.to_string(),
                types,
                values,
                undecoded: None,
            },
            Err(e) => Captured {
                sql: sql.to_string(),
                types,
                values: vec![],
                undecoded: Some(format!("{e:#}")),
            },
        }
    }

    fn values(&self) -> Result<Vec<Option<String>>> {
        let n = self.values.len();
        let format = |i: usize| match self.formats.len() {
            0 => 0,
            1 => self.formats[0],
            _ => self.formats.get(i).copied().unwrap_or(0),
        };
        let oid = |i: usize| self.oids.get(i).copied().unwrap_or(0);
        let mut values = Vec::with_capacity(n);
        for (i, v) in self.values.iter().enumerate() {
            values.push(match v {
                None => None,
                Some(b) => Some(decode(oid(i), format(i), b)?),
            });
        }
        Ok(values)
    }
}

/// Counts since the proxy started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Statements doing work (SELECT, INSERT, UPDATE, …), pings and BEGIN/COMMIT excluded.
    pub statements: u64,
    /// BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE.
    pub transaction_control: u64,
    /// The pool's connection check on checkout (diesel-async's `SELECT $1`).
    pub pings: u64,
    /// Client waits for the server: one per Sync or simple Query.
    pub round_trips: u64,
    /// Statements PostgreSQL had to parse, analyze and rewrite (extended-protocol Parse; a
    /// statement prepared once per connection and reused costs none afterwards).
    pub parses: u64,
}

impl Counts {
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            statements: self.statements - earlier.statements,
            transaction_control: self.transaction_control - earlier.transaction_control,
            pings: self.pings - earlier.pings,
            round_trips: self.round_trips - earlier.round_trips,
            parses: self.parses - earlier.parses,
        }
    }

    pub fn all(&self) -> u64 {
        self.statements + self.transaction_control + self.pings
    }

    /// "14.0 statements per payment (10.0 doing work, 2.0 BEGIN/COMMIT, 2.0 pool connection
    /// checks) in 22.1 round trips, 8.0 of them parsed anew".
    pub fn per(&self, n: usize, unit: &str) -> String {
        let n = n.max(1) as f64;
        // Batched work costs a fraction of a statement per unit: show two decimals then.
        let f = |x: u64| {
            let v = x as f64 / n;
            if v > 0.0 && v < 1.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.1}")
            }
        };
        format!(
            "{} statements per {unit} ({} doing work, {} BEGIN/COMMIT, {} pool connection checks) in {} round trips; \
             {} statements parsed anew (not reusing a prepared statement)",
            f(self.all()),
            f(self.statements),
            f(self.transaction_control),
            f(self.pings),
            f(self.round_trips),
            f(self.parses)
        )
    }
}

pub struct SqlCounter {
    pub port: u16,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl SqlCounter {
    /// Listens on 127.0.0.1 and forwards every connection to `upstream` (host:port).
    pub async fn start(upstream: String) -> Result<SqlCounter> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let c = c.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        let back = tokio::spawn(async move {
                            let (mut sr, mut cw) = (sr, cw);
                            let _ = tokio::io::copy(&mut sr, &mut cw).await;
                        });
                        let _ = pump(cr, sw, c).await;
                        back.abort();
                    }
                });
            }
        });
        Ok(SqlCounter { port, counters, task })
    }

    pub fn counts(&self) -> Counts {
        let c = &self.counters;
        Counts {
            statements: c.statements.load(Ordering::SeqCst),
            transaction_control: c.transaction_control.load(Ordering::SeqCst),
            pings: c.pings.load(Ordering::SeqCst),
            round_trips: c.round_trips.load(Ordering::SeqCst),
            parses: c.parses.load(Ordering::SeqCst),
        }
    }

    /// How many times PostgreSQL was asked to parse a statement whose text contains `needle`
    /// (on any connection, since the proxy started). The integration tests' check of the
    /// statement cache.
    #[allow(dead_code)]
    pub fn parses_of(&self, needle: &str) -> u64 {
        let parsed = self.counters.parsed.lock().unwrap_or_else(|e| e.into_inner());
        parsed
            .iter()
            .filter(|(sql, _)| sql.contains(needle))
            .map(|(_, n)| n)
            .sum()
    }

    /// The statements executed with parameters since the proxy started (or since the last call),
    /// each with the values of its last execution; forgets them.
    pub fn take_captured(&self) -> Vec<Captured> {
        let bound = std::mem::take(&mut *self.counters.bound.lock().unwrap_or_else(|e| e.into_inner()));
        bound.iter().map(|(sql, b)| b.decode(sql)).collect()
    }

    /// Every statement text parsed since the proxy started, with how many times.
    #[allow(dead_code)]
    pub fn parsed(&self) -> Vec<(String, u64)> {
        let parsed = self.counters.parsed.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(String, u64)> = parsed.iter().map(|(s, n)| (s.clone(), *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all
    }
}

impl Drop for SqlCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// host:port of a postgres:// URL (TCP only).
pub fn upstream_of(url: &str) -> Result<String> {
    let rest = url.split_once("://").map(|(_, r)| r).context("not a URL")?;
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let hostport = authority.rsplit_once('@').map(|(_, h)| h).unwrap_or(authority);
    let hostport = if hostport.is_empty() { "localhost" } else { hostport };
    Ok(if hostport.contains(':') && !hostport.ends_with(']') {
        hostport.to_string()
    } else {
        format!("{hostport}:5432")
    })
}

/// `url` with its host and port replaced by the proxy's.
pub fn via(url: &str, port: u16) -> Result<String> {
    let (scheme, rest) = url.split_once("://").context("not a URL")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    Ok(format!("{scheme}://{userinfo}127.0.0.1:{port}{tail}"))
}

fn cstr(b: &[u8]) -> (&[u8], &[u8]) {
    match b.iter().position(|&x| x == 0) {
        Some(i) => (&b[..i], &b[i + 1..]),
        None => (b, &[]),
    }
}

fn classify(c: &Counters, sql: &str) {
    let s = sql.trim_start().to_ascii_uppercase();
    let counter = if [
        "BEGIN",
        "COMMIT",
        "ROLLBACK",
        "START TRANSACTION",
        "SAVEPOINT",
        "RELEASE",
        "END",
    ]
    .iter()
    .any(|k| s.starts_with(k))
    {
        &c.transaction_control
    } else if s.trim_end().trim_end_matches(';') == "SELECT $1" {
        &c.pings
    } else {
        &c.statements
    };
    counter.fetch_add(1, Ordering::SeqCst);
}

fn be16(b: &[u8], at: usize) -> Option<i16> {
    Some(i16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The parameter type OIDs at the end of a Parse message (after its statement text).
fn param_types(rest: &[u8]) -> Vec<u32> {
    let n = be16(rest, 0).unwrap_or(0).max(0) as usize;
    (0..n).map_while(|i| be32(rest, 2 + 4 * i).map(|o| o as u32)).collect()
}

/// A Bind message's parameter formats and values (after its portal and statement names).
/// A Bind message's parameter formats and values (NULL as `None`).
type BindValues = (Vec<i16>, Vec<Option<Vec<u8>>>);

fn bind_values(rest: &[u8]) -> Option<BindValues> {
    let nf = be16(rest, 0)?.max(0) as usize;
    let formats = (0..nf).map(|i| be16(rest, 2 + 2 * i)).collect::<Option<Vec<_>>>()?;
    let mut at = 2 + 2 * nf;
    let nv = be16(rest, at)?.max(0) as usize;
    at += 2;
    let mut values = Vec::with_capacity(nv);
    for _ in 0..nv {
        let len = be32(rest, at)?;
        at += 4;
        if len < 0 {
            values.push(None);
        } else {
            let len = len as usize;
            values.push(Some(rest.get(at..at + len)?.to_vec()));
            at += len;
        }
    }
    Some((formats, values))
}

/// Client to server: forwards every message, counting as it goes.
async fn pump(
    mut client: tokio::net::tcp::OwnedReadHalf,
    mut server: tokio::net::tcp::OwnedWriteHalf,
    c: Arc<Counters>,
) -> std::io::Result<()> {
    // Untyped messages first: SSL / GSSAPI requests (answered with one byte), then the startup.
    loop {
        let mut len = [0u8; 4];
        client.read_exact(&mut len).await?;
        let n = u32::from_be_bytes(len) as usize;
        let mut body = vec![0u8; n.saturating_sub(4)];
        client.read_exact(&mut body).await?;
        server.write_all(&len).await?;
        server.write_all(&body).await?;
        let code = body.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if !matches!(code, Some(80877103) | Some(80877104)) {
            break;
        }
    }
    let mut statements: HashMap<Vec<u8>, (String, Vec<u32>)> = HashMap::new();
    let mut portals: HashMap<Vec<u8>, String> = HashMap::new();
    loop {
        let mut head = [0u8; 5];
        client.read_exact(&mut head).await?;
        let n = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; n.saturating_sub(4)];
        client.read_exact(&mut body).await?;
        match head[0] {
            b'Q' => {
                let (sql, _) = cstr(&body);
                let sql = String::from_utf8_lossy(sql);
                for part in sql.split(';').filter(|p| !p.trim().is_empty()) {
                    classify(&c, part);
                }
                c.round_trips.fetch_add(1, Ordering::SeqCst);
            }
            b'P' => {
                c.parses.fetch_add(1, Ordering::SeqCst);
                let (name, rest) = cstr(&body);
                let (sql, rest) = cstr(rest);
                let sql = String::from_utf8_lossy(sql).to_string();
                *c.parsed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(sql.clone())
                    .or_default() += 1;
                statements.insert(name.to_vec(), (sql, param_types(rest)));
            }
            b'B' => {
                let (portal, rest) = cstr(&body);
                let (stmt, rest) = cstr(rest);
                let (sql, oids) = statements.get(stmt).cloned().unwrap_or_default();
                if let Some((formats, values)) = bind_values(rest) {
                    if !values.is_empty() {
                        c.bound
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(sql.clone(), Bound { oids, formats, values });
                    }
                }
                portals.insert(portal.to_vec(), sql);
            }
            b'E' => {
                let (portal, _) = cstr(&body);
                classify(&c, portals.get(portal).map(String::as_str).unwrap_or(""));
            }
            b'S' => {
                c.round_trips.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        server.write_all(&head).await?;
        server.write_all(&body).await?;
        if head[0] == b'X' {
            return Ok(());
        }
    }
}
