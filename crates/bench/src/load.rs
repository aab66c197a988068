//! The load generator: N concurrent keep-alive HTTP connections (one client each, so one TCP
//! connection each, like wrk's `-c`), each sending its next request as soon as the previous one
//! answered (closed loop). Latencies are kept whole and sorted for the percentiles.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;

/// One request, prepared before the clock starts: a POST of `body`, or a GET when `body` is
/// empty.
#[derive(Clone)]
pub struct Prepared {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// What a load run saw.
#[derive(Default)]
pub struct Outcome {
    /// When the run started (the origin of `timeline`).
    pub started: Option<Instant>,
    pub elapsed: Duration,
    /// Responses with the expected status (and, when asked, a body without `"errors"`).
    pub ok: usize,
    /// Everything else, by status (0: transport error), with one example body each.
    pub other: BTreeMap<u16, (usize, String)>,
    /// Latencies of the ok responses, sorted.
    pub latencies: Vec<Duration>,
    /// Every ok response as (sent, took), `sent` counted from the run's start: when the slow
    /// ones happened (bursts or spread), for [`crate::stalls`].
    pub timeline: Vec<(Duration, Duration)>,
}

impl Outcome {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }

    pub fn failures(&self) -> usize {
        self.other.values().map(|(n, _)| n).sum()
    }

    pub fn describe_failures(&self) -> String {
        self.other
            .iter()
            .map(|(s, (n, ex))| format!("{n} × HTTP {s} (e.g. {})", ex.chars().take(160).collect::<String>()))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn merge(&mut self, other: Outcome) {
        self.ok += other.ok;
        for (s, (n, ex)) in other.other {
            let e = self.other.entry(s).or_insert((0, ex));
            e.0 += n;
        }
        self.latencies.extend(other.latencies);
        self.timeline.extend(other.timeline);
    }
}

/// The p-th percentile (0..=100) of sorted values: the smallest value with at least p % of the
/// values at or below it.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// When a run stops: after a fixed list of requests, or after a time.
pub enum Until {
    /// Each prepared request is sent once.
    Exhausted,
    /// The prepared requests are sent round-robin until the time is up.
    Elapsed(Duration),
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a plain-HTTP client always builds")
}

/// Sends `requests` over `connections` concurrent connections. A response counts as ok when
/// its status is `expect` and, with `reject_errors`, its body has no `"errors"` key.
pub async fn run(
    requests: Arc<Vec<Prepared>>,
    connections: usize,
    until: Until,
    expect: u16,
    reject_errors: bool,
) -> Result<Outcome> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = match until {
        Until::Exhausted => None,
        Until::Elapsed(d) => Some(started + d),
    };
    let mut tasks = vec![];
    for _ in 0..connections {
        let requests = requests.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let http = client();
            let mut out = Outcome::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let req = match deadline {
                    None if i >= requests.len() => break,
                    None => &requests[i],
                    Some(d) if Instant::now() >= d => break,
                    Some(_) => &requests[i % requests.len()],
                };
                let mut builder = if req.body.is_empty() {
                    http.get(&req.url)
                } else {
                    http.post(&req.url).body(req.body.clone())
                };
                for (k, v) in &req.headers {
                    builder = builder.header(k, v);
                }
                let sent = Instant::now();
                let (status, body) = match builder.send().await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let body = resp.bytes().await.unwrap_or_default();
                        (status, body)
                    }
                    Err(e) => (0, Bytes::from(e.to_string())),
                };
                let took = sent.elapsed();
                let errors = reject_errors && memfind(&body, b"\"errors\"");
                if status == expect && !errors {
                    out.ok += 1;
                    out.latencies.push(took);
                    out.timeline.push((sent - started, took));
                } else {
                    let e = out
                        .other
                        .entry(status)
                        .or_insert((0, String::from_utf8_lossy(&body).to_string()));
                    e.0 += 1;
                }
            }
            out
        }));
    }
    let mut total = Outcome::default();
    for t in tasks {
        total.merge(t.await?);
    }
    total.elapsed = started.elapsed();
    total.started = Some(started);
    total.latencies.sort_unstable();
    total.timeline.sort_unstable();
    Ok(total)
}

fn memfind(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
