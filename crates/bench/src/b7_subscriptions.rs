//! B7: many WebSocket subscribers of `compensationUpdates` (graphql-transport-ws), one event:
//! how long until every subscriber has it, and what each subscriber costs the server in RSS.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

use crate::env::{connect, Bench};
use crate::load::{ms, percentile};
use crate::report::Row;
use crate::{seed, Sizes};

const SUBSCRIPTION: &str = "subscription { compensationUpdates { id status } }";

/// One subscriber: connects, authenticates, subscribes, then reports the arrival time of every
/// `next` message until told to stop.
async fn subscriber(
    ws_url: String,
    token: String,
    ready: Arc<AtomicUsize>,
    deliveries: mpsc::UnboundedSender<Instant>,
    mut stop: watch::Receiver<bool>,
) -> Result<()> {
    let mut req = ws_url.into_client_request()?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("graphql-transport-ws"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .context("WebSocket connect")?;
    let init = serde_json::json!({"type": "connection_init", "payload": {"authorization": format!("Bearer {token}")}});
    ws.send(Message::text(init.to_string())).await?;
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) if t.as_str().contains("connection_ack") => break,
            Some(Ok(Message::Text(_))) | Some(Ok(Message::Ping(_))) | Some(Ok(Message::Pong(_))) => continue,
            other => bail!("no connection_ack: {other:?}"),
        }
    }
    let sub = serde_json::json!({"id": "1", "type": "subscribe", "payload": {"query": SUBSCRIPTION}});
    ws.send(Message::text(sub.to_string())).await?;
    ready.fetch_add(1, Ordering::SeqCst);
    loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Text(t))) => {
                    let t = t.as_str();
                    if t.contains("\"next\"") {
                        let _ = deliveries.send(Instant::now());
                    } else if t.contains("\"ping\"") {
                        ws.send(Message::text(r#"{"type":"pong"}"#)).await?;
                    } else if t.contains("\"error\"") {
                        bail!("subscription refused: {t}");
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => bail!("WebSocket: {e}"),
                None => bail!("the server closed the WebSocket"),
            },
            _ = stop.changed() => {
                let _ = ws.close(None).await;
                return Ok(());
            }
        }
    }
}

/// The server's gauge of live hub subscribers, from /metrics.
async fn hub_subscribers(http: &reqwest::Client, base: &str) -> Result<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .bearer_auth(crate::env::METRICS_TOKEN)
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix("fitorder_subscribers_hub "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

pub async fn run(bench: &mut Bench, s: &Sizes) -> Result<Row> {
    let url = seed::api_db(bench, s).await?;
    let token = bench.token("ops", "bench")?;
    let server = bench.start_server(&url, "server-b7").await?;
    let ws_url = server.base.replace("http://", "ws://") + "/graphql/ws";
    let http = reqwest::Client::new();
    let db = connect(&url).await?;
    let event_id: i64 = db
        .query_one("SELECT max(id) FROM compensation_events", &[])
        .await?
        .try_get::<_, Option<i64>>(0)?
        .context("no compensation event to announce")?;

    // One subscriber first, so that what is initialized once (schema, hub, TLS-free sockets)
    // is not charged to the thousand that follow.
    let (stop_tx, stop_rx) = watch::channel(false);
    {
        let (dtx, _drx) = mpsc::unbounded_channel();
        let ready = Arc::new(AtomicUsize::new(0));
        let (wstop_tx, wstop_rx) = watch::channel(false);
        let warm = tokio::spawn(subscriber(ws_url.clone(), token.clone(), ready.clone(), dtx, wstop_rx));
        let deadline = Instant::now() + Duration::from_secs(10);
        while ready.load(Ordering::SeqCst) == 0 && Instant::now() < deadline && !warm.is_finished() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = wstop_tx.send(true);
        warm.await??;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss0 = server.proc.status_kb("VmRSS").unwrap_or(0);

    say!("B7: opening {} subscriptions ...", s.subscribers);
    let ready = Arc::new(AtomicUsize::new(0));
    let (dtx, mut drx) = mpsc::unbounded_channel::<Instant>();
    let mut tasks = tokio::task::JoinSet::new();
    let opening = Instant::now();
    for i in 0..s.subscribers {
        tasks.spawn(subscriber(
            ws_url.clone(),
            token.clone(),
            ready.clone(),
            dtx.clone(),
            stop_rx.clone(),
        ));
        // Connect in waves, as a crowd of clients would, without flooding the accept queue.
        if i % 50 == 49 {
            while ready.load(Ordering::SeqCst) + 10 < i {
                if let Some(Ok(Err(e))) = tasks.try_join_next() {
                    bail!("a subscriber failed while connecting: {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    drop(dtx);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready.load(Ordering::SeqCst) < s.subscribers {
        if let Some(Ok(Err(e))) = tasks.try_join_next() {
            bail!("a subscriber failed: {e:#}");
        }
        if Instant::now() > deadline {
            bail!(
                "only {} of {} subscribed within 60 s",
                ready.load(Ordering::SeqCst),
                s.subscribers
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // `subscribe` is not acknowledged in graphql-transport-ws: the server's own gauge says when
    // every stream is live.
    let deadline = Instant::now() + Duration::from_secs(30);
    while hub_subscribers(&http, &server.base).await? < s.subscribers as f64 {
        if Instant::now() > deadline {
            bail!("the server reports fewer than {} live subscriptions", s.subscribers);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opened = opening.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss1 = server.proc.status_kb("VmRSS").unwrap_or(0);
    let per_subscriber_kb = rss1.saturating_sub(rss0) as f64 / s.subscribers as f64;

    let mut latencies = vec![];
    let mut missing = 0;
    for round in 0..s.subscriber_events {
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let t0 = Instant::now();
        db.execute(
            "WITH u AS (UPDATE compensation_events SET updated_at = now() WHERE id = $1 RETURNING id)
             SELECT pg_notify('fitorder_events', 'comp:' || id) FROM u",
            &[&event_id],
        )
        .await?;
        let mut got = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while got < s.subscribers {
            match tokio::time::timeout_at(deadline, drx.recv()).await {
                Ok(Some(at)) => {
                    latencies.push(at.saturating_duration_since(t0));
                    got += 1;
                }
                _ => break,
            }
        }
        missing += s.subscribers - got;
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    drop(server);
    latencies.sort_unstable();
    let p50 = percentile(&latencies, 50.0);
    let p99 = percentile(&latencies, 99.0);
    let max = latencies.last().copied().unwrap_or_default();
    say!(
        "B7: delivery p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {:.1} KB RSS per subscriber",
        ms(p50),
        ms(p99),
        ms(max),
        per_subscriber_kb
    );

    let mut r = Row::new(
        "B7",
        format!(
            "{} WebSocket subscribers of `compensationUpdates`, one event",
            s.subscribers
        ),
        "p99 delivery ≤ 200 ms; ≤ 64 KB RSS per subscriber",
    );
    r.ours = format!(
        "p99 {:.1} ms (p50 {:.1}, max {:.1}); {:.1} KB RSS per subscriber",
        ms(p99),
        ms(p50),
        ms(max),
        per_subscriber_kb
    );
    r.check(
        format!("p99 {:.1} ms > 200 ms", p99.as_secs_f64() * 1000.0),
        p99 <= Duration::from_millis(200),
    );
    r.check(
        format!("{per_subscriber_kb:.1} KB per subscriber > 64 KB"),
        per_subscriber_kb <= 64.0,
    );
    r.check("every subscriber got every event", missing == 0);
    r.note(format!(
        "{} graphql-transport-ws connections to /graphql/ws (ops token from `fitorder token` in connection_init), \
         each subscribed to `{SUBSCRIPTION}`; all live per the server's fitorder_subscribers_hub gauge after {:.1} s",
        s.subscribers,
        opened.as_secs_f64()
    ));
    r.note(format!(
        "RSS: server VmRSS {:.1} MB with one warm-up subscriber come and gone, {:.1} MB with all subscribed (1 s \
         after), difference / subscribers",
        rss0 as f64 / 1024.0,
        rss1 as f64 / 1024.0
    ));
    r.note(format!(
        "{} event(s), each by `UPDATE compensation_events … ; pg_notify('fitorder_events', 'comp:<id>')` from a SQL \
         client; latency from sending that statement to a subscriber task reading the `next` frame (both clocks in \
         the bench process), over {} deliveries; {missing} missing",
        s.subscriber_events,
        latencies.len()
    ));
    Ok(r)
}
