//! Where the slow requests of a pass waited (issue 29: "find the stalls first"). While the pass
//! runs, a sampler asks PostgreSQL every 10 ms what each backend is doing (`pg_stat_activity`:
//! the state and wait event of the pass's database's sessions, and of PostgreSQL's own
//! processes) and the server every 50 ms how many requests wait for a pool connection (its
//! `fitorder_db_pool_waiting` gauge). Afterwards the samples taken while a slow request was in
//! flight are set against the others, with what PostgreSQL's own counters (WAL, checkpoints)
//! did over the pass.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tokio::task::JoinHandle;

use crate::env::connect;
use crate::load::Outcome;

/// One look at PostgreSQL: how many backends were in each state.
struct Tick {
    at: Instant,
    states: Vec<(String, u32)>,
}

struct Samples {
    ticks: Vec<Tick>,
    pool: Vec<(Instant, f64)>,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    pg: JoinHandle<Result<Vec<Tick>>>,
    pool: Option<JoinHandle<Vec<(Instant, f64)>>>,
    counters0: Counters,
    admin: tokio_postgres::Client,
}

/// PostgreSQL's cumulative counters that say whether it flushed, synced or checkpointed.
#[derive(Default, Clone, Copy)]
struct Counters {
    wal_records: i64,
    wal_buffers_full: i64,
    wal_write: i64,
    wal_sync: i64,
    checkpoints: i64,
    buffers_backend_fsync: i64,
}

const COUNTERS: &str = "SELECT w.wal_records::int8, w.wal_buffers_full::int8, w.wal_write::int8, w.wal_sync::int8,
        (b.checkpoints_timed + b.checkpoints_req)::int8, b.buffers_backend_fsync::int8
   FROM pg_stat_wal w, pg_stat_bgwriter b";

async fn counters(db: &tokio_postgres::Client) -> Result<Counters> {
    let r = db.query_one(COUNTERS, &[]).await?;
    Ok(Counters {
        wal_records: r.get(0),
        wal_buffers_full: r.get(1),
        wal_write: r.get(2),
        wal_sync: r.get(3),
        checkpoints: r.get(4),
        buffers_backend_fsync: r.get(5),
    })
}

/// The state of each backend of `datname` (client sessions: "active CPU", "active
/// LWLock:WALWrite", "idle in transaction", "idle") and of PostgreSQL's own processes when they
/// are doing something ("checkpointer IO:DataFileWrite", "autovacuum worker CPU").
const SAMPLE: &str = r#"SELECT CASE WHEN backend_type = 'client backend'
                  THEN CASE WHEN state = 'active'
                            THEN 'active ' || coalesce(wait_event_type || ':' || wait_event, 'CPU')
                                 || ' (' || left(regexp_replace(ltrim(regexp_replace(query, '^(\s*--[^\n]*\n)+', '')), '\s+', ' ', 'g'), 28) || '…)'
                            ELSE coalesce(state, '?') END
                  ELSE backend_type || ' ' || coalesce(wait_event_type || ':' || wait_event, 'CPU') END,
             count(*)::int4
        FROM pg_stat_activity
       WHERE pid <> pg_backend_pid()
         AND (datname = $1 OR backend_type <> 'client backend')
         AND NOT (backend_type <> 'client backend' AND wait_event IN
                  ('CheckpointerMain', 'BgWriterMain', 'BgWriterHibernate', 'WalWriterMain',
                   'AutoVacuumMain', 'LogicalLauncherMain', 'ArchiverMain', 'WalSenderMain',
                   'WalSenderWaitForWAL', 'WalReceiverMain', 'RecoveryWalStream'))
       GROUP BY 1"#;

impl Sampler {
    /// Starts sampling the sessions of database `datname` (through `admin_url`) and, when given,
    /// the server at `server_base`.
    pub async fn start(admin_url: &str, datname: &str, server_base: Option<&str>) -> Result<Sampler> {
        let admin = connect(admin_url).await?;
        let counters0 = counters(&admin).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let db = connect(admin_url).await?;
        let name = datname.to_string();
        let flag = stop.clone();
        let pg = tokio::spawn(async move {
            let stmt = db.prepare(SAMPLE).await?;
            let mut ticks = vec![];
            let mut every = tokio::time::interval(Duration::from_millis(10));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !flag.load(Ordering::Relaxed) {
                every.tick().await;
                let at = Instant::now();
                let rows = db.query(&stmt, &[&name]).await?;
                ticks.push(Tick {
                    at,
                    states: rows
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, i32>(1) as u32))
                        .collect(),
                });
            }
            Ok(ticks)
        });
        let pool = server_base.map(|base| {
            let url = format!("{base}/metrics");
            let flag = stop.clone();
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut seen = vec![];
                let mut every = tokio::time::interval(Duration::from_millis(50));
                while !flag.load(Ordering::Relaxed) {
                    every.tick().await;
                    let at = Instant::now();
                    let Ok(r) = http.get(&url).bearer_auth(crate::env::METRICS_TOKEN).send().await else {
                        continue;
                    };
                    let text = r.text().await.unwrap_or_default();
                    if let Some(v) = text
                        .lines()
                        .find_map(|l| l.strip_prefix("fitorder_db_pool_waiting "))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                    {
                        seen.push((at, v));
                    }
                }
                seen
            })
        });
        Ok(Sampler {
            stop,
            pg,
            pool,
            counters0,
            admin,
        })
    }

    /// Stops sampling and says where the requests of `out` slower than `slow` waited.
    pub async fn finish(self, out: &Outcome, slow: Duration, unit: &str) -> Result<String> {
        self.stop.store(true, Ordering::Relaxed);
        let ticks = self.pg.await??;
        let pool = match self.pool {
            Some(p) => p.await?,
            None => vec![],
        };
        let c1 = counters(&self.admin).await?;
        let samples = Samples { ticks, pool };
        Ok(describe(&samples, out, slow, unit, &self.counters0, &c1))
    }
}

/// The union of the slow requests' flight times, as sorted disjoint intervals.
fn bursts(out: &Outcome, slow: Duration) -> Vec<(Instant, Instant)> {
    let Some(start) = out.started else {
        return vec![];
    };
    let mut spans: Vec<(Instant, Instant)> = out
        .timeline
        .iter()
        .filter(|(_, took)| *took > slow)
        .map(|(sent, took)| (start + *sent, start + *sent + *took))
        .collect();
    spans.sort();
    let mut merged: Vec<(Instant, Instant)> = vec![];
    for (a, b) in spans {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

fn inside(spans: &[(Instant, Instant)], t: Instant) -> bool {
    let i = spans.partition_point(|s| s.1 < t);
    i < spans.len() && spans[i].0 <= t
}

fn shares(tally: &BTreeMap<String, u64>, top: usize) -> String {
    let total: u64 = tally.values().sum();
    if total == 0 {
        return "no samples".into();
    }
    let mut v: Vec<(&String, &u64)> = tally.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.iter()
        .take(top)
        .map(|(k, n)| format!("{k} {:.0} %", 100.0 * **n as f64 / total as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(s: &Samples, out: &Outcome, slow: Duration, unit: &str, c0: &Counters, c1: &Counters) -> String {
    let spans = bursts(out, slow);
    let slow_n = out.timeline.iter().filter(|(_, t)| *t > slow).count();
    let covered: Duration = spans.iter().map(|(a, b)| *b - *a).sum();
    let mut in_burst: BTreeMap<String, u64> = BTreeMap::new();
    let mut outside: BTreeMap<String, u64> = BTreeMap::new();
    let (mut ticks_in, mut ticks_out) = (0u64, 0u64);
    let mut own_in: BTreeMap<String, u64> = BTreeMap::new();
    for t in &s.ticks {
        let b = inside(&spans, t.at);
        if b {
            ticks_in += 1;
        } else {
            ticks_out += 1;
        }
        for (state, n) in &t.states {
            let client = state.starts_with("active ") || state.starts_with("idle");
            let tally = if client {
                if b {
                    &mut in_burst
                } else {
                    &mut outside
                }
            } else {
                &mut own_in
            };
            let key = if client {
                state.clone()
            } else {
                format!("{state}{}", if b { " (in a burst)" } else { "" })
            };
            *tally.entry(key).or_default() += *n as u64;
        }
    }
    let pool_in: Vec<f64> = s.pool.iter().filter(|(t, _)| inside(&spans, *t)).map(|p| p.1).collect();
    let pool_out: Vec<f64> = s
        .pool
        .iter()
        .filter(|(t, _)| !inside(&spans, *t))
        .map(|p| p.1)
        .collect();
    let stat = |v: &[f64]| {
        if v.is_empty() {
            "—".to_string()
        } else {
            format!(
                "mean {:.1}, max {:.0}",
                v.iter().sum::<f64>() / v.len() as f64,
                v.iter().cloned().fold(0.0, f64::max)
            )
        }
    };
    let own: Vec<String> = {
        let mut v: Vec<(&String, &u64)> = own_in.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.iter().take(6).map(|(k, n)| format!("{k} ×{n}")).collect()
    };
    let records = (c1.wal_records - c0.wal_records).max(1);
    format!(
        "stalls (PostgreSQL's pg_stat_activity sampled every 10 ms, {} samples; the server's pool every 50 ms): \
         {slow_n} of {} {unit} took over {} ms, in {} bursts covering {:.1} s of the pass's {:.1} s. Sessions of the \
         database, in the bursts' {ticks_in} samples: {}; in the other {ticks_out}: {}. Requests waiting for one of \
         the server's pool connections: in bursts {}, otherwise {}. PostgreSQL's own processes seen busy: {}. Over \
         the pass: {} WAL records, {} WAL writes and {} WAL syncs ({:.1} records a sync), WAL buffers full {} times, \
         {} checkpoints, {} fsyncs by backends",
        s.ticks.len(),
        out.timeline.len(),
        slow.as_millis(),
        spans.len(),
        covered.as_secs_f64(),
        out.elapsed.as_secs_f64(),
        shares(&in_burst, 6),
        shares(&outside, 6),
        stat(&pool_in),
        stat(&pool_out),
        if own.is_empty() {
            "none".to_string()
        } else {
            own.join(", ")
        },
        c1.wal_records - c0.wal_records,
        c1.wal_write - c0.wal_write,
        c1.wal_sync - c0.wal_sync,
        records as f64 / (c1.wal_sync - c0.wal_sync).max(1) as f64,
        c1.wal_buffers_full - c0.wal_buffers_full,
        c1.checkpoints - c0.checkpoints,
        c1.buffers_backend_fsync - c0.buffers_backend_fsync,
    )
}
