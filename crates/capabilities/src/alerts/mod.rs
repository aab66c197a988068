//! Alerts that reach people: a row written in the transaction of what caused it (once per
//! cause: `dedupe_key` is unique, so a scheduler that finds the same DEAD event every minute
//! raises one alert), then fanned out to every configured channel and delivered by the outbox
//! workers like any other effect: claimed under a lease, retried with backoff, DEAD at the
//! limit (logged and counted: a lost chat message is visible), replayable. A per-channel rate
//! limit, counted in the database, holds for the whole cluster.

pub mod channels;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use diesel::sql_types::{Array, BigInt, Double, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel::{ExpressionMethods, QueryDsl, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::{json, Value};

use crate::config::Config;
use crate::db::models::{CompensationEvent, ExceptionTicket, Order};
use crate::db::sql::{lock_keys, pg_advisory_xact_lock, StaticQuery};
use crate::db::DbPool;
use crate::domain::money::format_yuan;
use crate::domain::retry::backoff;
use crate::domain::{Provider, ReconciliationStatus, TicketKind};
use crate::error::AppResult;
use channels::{Channel, Message};

/// One alert, before it is written.
#[derive(Debug, Clone)]
pub struct Alert {
    /// What kind of thing happened (`COMPENSATION_DEAD`, `PAID_AFTER_CANCEL`, …).
    pub cause: &'static str,
    /// The same cause found again raises nothing new.
    pub dedupe_key: String,
    pub title: String,
    pub lines: Vec<String>,
    pub order_no: Option<String>,
    pub trace_id: String,
    pub detail: Value,
}

fn action_zh(kind: &str) -> &'static str {
    match kind {
        "DOOR_ACCESS_GRANT" => "开通门禁",
        "DOOR_ACCESS_REVOKE" => "关闭门禁",
        "AI_ACCESS_GRANT" => "开通 AI 设备",
        "AI_ACCESS_REVOKE" => "关闭 AI 设备",
        "PROVIDER_REFUND" => "原路退款",
        _ => "下游动作",
    }
}

fn provider_zh(p: Provider) -> &'static str {
    match p {
        Provider::WechatPay => "微信支付",
        Provider::Alipay => "支付宝",
    }
}

/// A provider named by a text that is not a column of providers (an outbox payload).
fn provider_text_zh(p: &str) -> &'static str {
    Provider::parse(p)
        .or_else(|| Provider::from_short_name(p))
        .map_or("支付渠道", provider_zh)
}

fn ticket_kind_zh(kind: TicketKind) -> &'static str {
    match kind {
        TicketKind::PaidAfterCancel => "取消后付款",
        TicketKind::AmountMismatch => "金额不符",
        TicketKind::ProviderPaidLocalUnpaid => "渠道已付、本地未付",
        TicketKind::LocalPaidProviderMissing => "本地已付、渠道无记录",
        TicketKind::RefundMismatch => "退款不符",
        TicketKind::CompensationDead => "补偿失败",
        TicketKind::UnknownOrder | TicketKind::RejectedTransition => "其他",
    }
}

impl Alert {
    /// A compensation event that ran out of attempts.
    pub fn compensation_dead(e: &CompensationEvent, order: &Order) -> Alert {
        Alert {
            cause: "COMPENSATION_DEAD",
            dedupe_key: format!("COMPENSATION_DEAD:{}:{}", e.id, e.attempts),
            title: "补偿事件已放弃(DEAD),需要人工处理".into(),
            lines: vec![
                format!("订单:{}", order.order_no),
                format!("动作:{}({})", action_zh(&e.kind), e.kind),
                format!("已尝试:{} 次", e.attempts),
                format!(
                    "最后错误:{}",
                    e.last_error
                        .as_deref()
                        .unwrap_or("—")
                        .chars()
                        .take(300)
                        .collect::<String>()
                ),
                format!("事件编号:{};处理后可在运维页面重放(Replay)", e.id),
            ],
            order_no: Some(order.order_no.clone()),
            trace_id: e.trace_id.clone(),
            detail: json!({"eventId": e.id.to_string(), "kind": e.kind, "attempts": e.attempts}),
        }
    }

    /// A ticket people must act on now: a payment for a canceled order, or an amount that
    /// differs from the order's. `None` for the other kinds.
    pub fn ticket(t: &ExceptionTicket) -> Option<Alert> {
        let title = match t.kind {
            TicketKind::PaidAfterCancel => "订单已取消后收到付款",
            TicketKind::AmountMismatch => "实付金额与订单金额不符",
            _ => return None,
        };
        let mut lines = vec![format!("订单:{}", t.order_no.as_deref().unwrap_or("(未知订单)"))];
        if let Some(p) = t.provider {
            lines.push(format!("支付渠道:{}", provider_zh(p)));
        }
        if let Some(c) = t.local_amount_cents {
            lines.push(format!("订单金额:¥{}", format_yuan(c)));
        }
        if let Some(c) = t.provider_amount_cents {
            lines.push(format!("实付金额:¥{}", format_yuan(c)));
        }
        if let Some(txn) = &t.provider_txn_id {
            lines.push(format!("渠道流水号:{txn}"));
        }
        if t.kind == TicketKind::PaidAfterCancel {
            lines.push("订单不会恢复;已自动发起原路退款".into());
        }
        lines.push(format!("工单:#{}({})", t.id, ticket_kind_zh(t.kind)));
        Some(Alert {
            // The cause is the ticket's kind (one of the two above).
            cause: t.kind.as_str(),
            dedupe_key: format!("TICKET:{}", t.id),
            title: title.into(),
            lines,
            order_no: t.order_no.clone(),
            trace_id: t.trace_id.clone(),
            detail: json!({"ticketId": t.id.to_string(), "kind": t.kind.as_str()}),
        })
    }
}

/// Writes an alert in the caller's transaction unless the same cause raised one already, and
/// wakes the workers (on commit). Returns the new alert's id.
pub async fn raise(conn: &mut AsyncPgConnection, a: Alert) -> AppResult<Option<i64>> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = BigInt)]
        id: i64,
    }
    let id: Option<Id> = StaticQuery::new(include_str!("raise.sql"))
        .bind::<Text, _>(a.cause)
        .bind::<Text, _>(&a.dedupe_key)
        .bind::<Text, _>(&a.title)
        .bind::<Jsonb, _>(json!(a.lines))
        .bind::<Nullable<Text>, _>(a.order_no.as_deref())
        .bind::<Text, _>(&a.trace_id)
        .bind::<Jsonb, _>(&a.detail)
        .get_result(conn)
        .await
        .optional()?;
    if let Some(Id { id }) = id {
        tracing::error!(alert = id, cause = a.cause, order_no = ?a.order_no, trace_id = %a.trace_id,
            "ALERT: {}", a.title);
        metrics::counter!("fitorder_alerts_raised_total", "cause" => a.cause).increment(1);
        return Ok(Some(id));
    }
    Ok(None)
}

/// Opens a ticket ([`crate::tickets::open`]) and, when it is about money that needs a person now
/// ([`Alert::ticket`]), raises its alert in the same transaction. Returns the ticket when newly
/// opened.
pub async fn open_ticket(
    conn: &mut AsyncPgConnection,
    t: crate::tickets::NewTicket<'_>,
    trace: &crate::trace::TraceId,
) -> AppResult<Option<ExceptionTicket>> {
    let opened = crate::tickets::open(conn, t, trace).await?;
    if let Some(alert) = opened.as_ref().and_then(Alert::ticket) {
        raise(conn, alert).await?;
    }
    Ok(opened)
}

use diesel::OptionalExtension;

#[derive(QueryableByName, Debug, Clone)]
struct Due {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    channel: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Integer)]
    max_attempts: i32,
    #[diesel(sql_type = BigInt)]
    alert_id: i64,
    #[diesel(sql_type = Text)]
    cause: String,
    #[diesel(sql_type = Text)]
    title: String,
    #[diesel(sql_type = Jsonb)]
    lines: Value,
    #[diesel(sql_type = Nullable<Text>)]
    order_no: Option<String>,
    #[diesel(sql_type = Text)]
    trace_id: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: chrono::DateTime<Utc>,
}

/// Delivers alerts for one outbox worker.
#[derive(Clone)]
pub struct Deliverer {
    config: Arc<Config>,
    http: reqwest::Client,
    worker: String,
}

impl Deliverer {
    pub fn new(config: Arc<Config>, worker: String) -> Deliverer {
        let http = reqwest::Client::builder()
            .timeout(config.downstream_timeout)
            .build()
            .expect("an HTTP client without TLS settings builds");
        Deliverer { config, http, worker }
    }

    fn lease(&self) -> Duration {
        self.config.downstream_timeout * 2 + Duration::from_secs(5)
    }

    /// Fans new alerts out to the channels, claims what is due within each channel's rate,
    /// delivers and records it. Returns how many deliveries were attempted.
    pub async fn run_once(&self, pool: &DbPool) -> AppResult<usize> {
        let channels = &self.config.alert_channels;
        if channels.is_empty() {
            return Ok(0);
        }
        let ids: Vec<String> = channels.iter().map(|c| c.id.clone()).collect();
        let mut conn = pool.get().await?;
        StaticQuery::new(include_str!("fan_out.sql"))
            .bind::<Array<Text>, _>(&ids)
            .bind::<Integer, _>(self.config.alert_max_attempts)
            .execute(&mut conn)
            .await?;
        let lease = self.lease().as_secs_f64();
        let rate = self.config.alert_rate_per_minute;
        let worker = self.worker.clone();
        // Claims are serialized by a transaction-scoped advisory lock so that the rate counted
        // (requests in the last minute plus deliveries in flight) holds across all workers.
        let due: Vec<Due> = conn
            .transaction(async |conn| -> AppResult<Vec<Due>> {
                diesel::select(pg_advisory_xact_lock(lock_keys::ALERT_CLAIMS))
                    .execute(conn)
                    .await?;
                Ok(StaticQuery::new(include_str!("claim_due.sql"))
                    .bind::<Text, _>(&worker)
                    .bind::<Double, _>(lease)
                    .bind::<Array<Text>, _>(&ids)
                    .bind::<BigInt, _>(rate)
                    .load(conn)
                    .await?)
            })
            .await?;
        drop(conn);
        let n = due.len();
        let ops_url = self.config.ops_url();
        let outcomes = futures_util::future::join_all(due.into_iter().map(|d| {
            let ops_url = ops_url.clone();
            async move {
                let channel = channels.iter().find(|c| c.id == d.channel);
                let started = Instant::now();
                let result = match channel {
                    Some(channel) => channels::send(&self.http, channel, &message(&d, ops_url)).await,
                    None => Err("channel not configured on this instance".to_string()),
                };
                (d, channel.cloned(), result, started.elapsed())
            }
        }))
        .await;
        for (d, channel, result, took) in outcomes {
            if let Err(e) = self.complete(pool, &d, channel.as_ref(), &result, took).await {
                tracing::warn!(delivery = d.id, error = %e.message(), "alert attempt not recorded; the lease will expire");
            }
        }
        Ok(n)
    }

    async fn complete(
        &self,
        pool: &DbPool,
        d: &Due,
        channel: Option<&Channel>,
        result: &Result<(), String>,
        took: Duration,
    ) -> AppResult<()> {
        let attempt = d.attempts + 1;
        let (status, error, next) = match result {
            Ok(()) => ("SUCCEEDED", None, None),
            Err(e) if attempt >= d.max_attempts => ("DEAD", Some(e.clone()), None),
            Err(e) => {
                let jitter: f64 = {
                    use rand::Rng;
                    rand::rng().random_range(-1.0..=1.0)
                };
                let delay = chrono::Duration::from_std(backoff(self.config.alert_retry_base, attempt, jitter))
                    .unwrap_or_default();
                ("RETRYING", Some(e.clone()), Some(Utc::now() + delay))
            }
        };
        let mut conn = pool.get().await?;
        let recorded = StaticQuery::new(include_str!("record_attempt.sql"))
            .bind::<BigInt, _>(d.id)
            .bind::<Text, _>(&self.worker)
            .bind::<Text, _>(status)
            .bind::<Nullable<Text>, _>(error.as_deref())
            .bind::<Nullable<Timestamptz>, _>(next)
            .bind::<Integer, _>(d.attempts)
            .bind::<Integer, _>(took.as_millis().min(i32::MAX as u128) as i32)
            .execute(&mut conn)
            .await?;
        if recorded == 0 {
            tracing::warn!(delivery = d.id, "alert lease lost before the attempt was recorded");
            return Ok(());
        }
        let kind = channel.map(|c| c.kind.as_str()).unwrap_or("unknown");
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        metrics::counter!("fitorder_alert_attempts_total", "channel" => kind, "outcome" => outcome).increment(1);
        match status {
            "SUCCEEDED" => {
                tracing::info!(alert = d.alert_id, channel = %d.channel, trace_id = %d.trace_id, "alert delivered")
            }
            "DEAD" => {
                metrics::counter!("fitorder_alert_deliveries_dead_total", "channel" => kind).increment(1);
                tracing::error!(alert = d.alert_id, channel = %d.channel, attempts = attempt, error = ?error,
                    trace_id = %d.trace_id, "ALERT delivery is DEAD: a chat message was not delivered")
            }
            _ => {
                tracing::warn!(alert = d.alert_id, channel = %d.channel, attempt, error = ?error, "alert delivery failed; retrying")
            }
        }
        Ok(())
    }
}

fn message(d: &Due, ops_url: String) -> Message {
    Message {
        alert_id: d.alert_id,
        cause: d.cause.clone(),
        title: d.title.clone(),
        lines: d
            .lines
            .as_array()
            .map(|a| a.iter().filter_map(|l| l.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
        order_no: d.order_no.clone(),
        trace_id: d.trace_id.clone(),
        ops_url,
        created_at: d.created_at,
    }
}

/// DEAD deliveries (of one alert, or all) go back to PENDING with a fresh allowance.
pub async fn replay_dead(conn: &mut AsyncPgConnection, alert_id: Option<i64>, more_attempts: i32) -> AppResult<usize> {
    Ok(StaticQuery::new(include_str!("replay_dead.sql"))
        .bind::<Nullable<BigInt>, _>(alert_id)
        .bind::<Integer, _>(more_attempts)
        .execute(conn)
        .await?)
}

#[derive(QueryableByName)]
struct RunRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    provider: Provider,
    #[diesel(sql_type = diesel::sql_types::Date)]
    bill_date: chrono::NaiveDate,
    #[diesel(sql_type = Text)]
    status: ReconciliationStatus,
    #[diesel(sql_type = Nullable<Text>)]
    error: Option<String>,
    #[diesel(sql_type = Text)]
    trace_id: String,
    #[diesel(sql_type = Jsonb)]
    kinds: Value,
}

/// Raises the alert of a finished reconciliation run that FAILED or opened tickets (counts by
/// kind); nothing for a clean run. Call it where the run's outcome is written (it is also
/// swept up by `alert:check` every minute, and raises once either way).
pub async fn reconciliation_run(conn: &mut AsyncPgConnection, run_id: i64) -> AppResult<Option<i64>> {
    let rows = reconciliation_rows(conn, Some(run_id)).await?;
    let mut raised = None;
    for r in rows {
        raised = raise(conn, reconciliation_alert(&r)).await?.or(raised);
    }
    Ok(raised)
}

/// Raises the alerts of every recently finished run that FAILED or found differences and has
/// none yet (what the scheduler calls right after a reconciliation task).
pub async fn reconciliation_recent(conn: &mut AsyncPgConnection) -> AppResult<usize> {
    let mut n = 0;
    for r in reconciliation_rows(conn, None).await? {
        n += raise(conn, reconciliation_alert(&r)).await?.is_some() as usize;
    }
    Ok(n)
}

/// One line per recent alert and its deliveries, for `fitorder alerts`.
pub async fn recent(conn: &mut AsyncPgConnection, limit: i64) -> AppResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Line {
        #[diesel(sql_type = Text)]
        line: String,
    }
    let rows: Vec<Line> = StaticQuery::new(include_str!("recent.sql"))
        .bind::<BigInt, _>(limit)
        .load(conn)
        .await?;
    Ok(rows.into_iter().map(|r| r.line).collect())
}

async fn reconciliation_rows(conn: &mut AsyncPgConnection, run_id: Option<i64>) -> AppResult<Vec<RunRow>> {
    Ok(StaticQuery::new(include_str!("reconciliation_runs.sql"))
        .bind::<Nullable<BigInt>, _>(run_id)
        .load(conn)
        .await?)
}

fn reconciliation_alert(r: &RunRow) -> Alert {
    let mut lines = vec![
        format!("渠道:{}", provider_zh(r.provider)),
        format!("账单日期:{}", r.bill_date),
    ];
    let failed = r.status == ReconciliationStatus::Failed;
    let title = if failed {
        lines.push(format!(
            "原因:{}",
            r.error.as_deref().unwrap_or("—").chars().take(300).collect::<String>()
        ));
        "对账失败"
    } else {
        if let Some(kinds) = r.kinds.as_object() {
            for (k, n) in kinds {
                let zh = TicketKind::parse(k).map_or("其他", ticket_kind_zh);
                lines.push(format!("差异:{zh}({k})× {n}"));
            }
        }
        lines.push("请在运维页面处理对应工单".into());
        "对账发现差异"
    };
    Alert {
        cause: if failed {
            "RECONCILIATION_FAILED"
        } else {
            "RECONCILIATION_DIFFERENCES"
        },
        dedupe_key: format!("RECONCILIATION:{}", r.id),
        title: title.into(),
        lines,
        order_no: None,
        trace_id: r.trace_id.clone(),
        detail: json!({"runId": r.id.to_string(), "kinds": r.kinds}),
    }
}

/// Formerly the bill-late cut-off after `FITORDER_RECONCILE_AT`; the cut-off is now
/// [`crate::domain::schedule::BILL_WAIT_UNTIL`].
pub const BILL_GRACE: chrono::Duration = chrono::Duration::hours(1);

/// `alert:check`'s part: raises what the rows say needs people. Returns alerts raised.
pub async fn sweep(
    conn: &mut AsyncPgConnection,
    config: &Config,
    providers: &[Provider],
    stuck_runs: &[(i64, String, String)],
) -> AppResult<i64> {
    let trace = crate::trace::TraceId::new().0;
    let mut raised = reconciliation_recent(conn).await? as i64;
    let mut count = |r: Option<i64>| raised += r.is_some() as i64;
    for (id, task, instance) in stuck_runs {
        count(
            raise(
                conn,
                Alert {
                    cause: "TASK_STUCK",
                    dedupe_key: format!("TASK_STUCK:{id}"),
                    title: "定时任务卡住,已标记为失败".into(),
                    lines: vec![
                        format!("任务:{task}"),
                        format!("实例:{instance}(可能已退出)"),
                        "下一个周期会重新运行".into(),
                    ],
                    order_no: None,
                    trace_id: trace.clone(),
                    detail: json!({"runId": id.to_string(), "task": task}),
                },
            )
            .await?,
        );
    }
    // The outbox overdue by more than five minutes: one alert per episode (named by the oldest
    // overdue event), not one per minute.
    #[derive(QueryableByName)]
    struct Overdue {
        #[diesel(sql_type = Nullable<BigInt>)]
        oldest: Option<i64>,
        #[diesel(sql_type = BigInt)]
        n: i64,
        #[diesel(sql_type = Nullable<Integer>)]
        minutes: Option<i32>,
    }
    let o: Overdue = StaticQuery::new(include_str!("outbox_overdue.sql"))
        .get_result(conn)
        .await?;
    if let Some(oldest) = o.oldest {
        count(
            raise(
                conn,
                Alert {
                    cause: "OUTBOX_OVERDUE",
                    dedupe_key: format!("OUTBOX_OVERDUE:{oldest}"),
                    title: "补偿队列积压超过 5 分钟".into(),
                    lines: vec![
                        format!("逾期事件:{} 个", o.n),
                        format!("最久逾期:{} 分钟", o.minutes.unwrap_or(0)),
                        "是否没有 worker 在运行,或下游不可达?".into(),
                    ],
                    order_no: None,
                    trace_id: trace.clone(),
                    detail: json!({"overdue": o.n, "oldestEventId": oldest.to_string()}),
                },
            )
            .await?,
        );
    }
    // Yesterday's bill not reconciled by the cut-off.
    let now_local = Utc::now().with_timezone(&config.timezone);
    // The cut-off is when a bill not made yet stops being asked for (18:00): a day that has a
    // WAITING or FAILED run gets that run's alert instead, so a late bill is alerted once.
    let cutoff = crate::domain::schedule::BILL_WAIT_UNTIL;
    if now_local.time() >= cutoff {
        let yesterday = now_local.date_naive() - chrono::Duration::days(1);
        for p in providers {
            use crate::db::schema::reconciliation_runs as rr;
            let done: bool = diesel::select(diesel::dsl::exists(
                rr::table
                    .filter(rr::provider.eq(*p))
                    .filter(rr::bill_date.eq(yesterday))
                    .filter(rr::status.eq_any([
                        ReconciliationStatus::Succeeded,
                        ReconciliationStatus::Waiting,
                        ReconciliationStatus::Failed,
                    ])),
            ))
            .get_result(conn)
            .await?;
            if !done {
                count(
                    raise(
                        conn,
                        Alert {
                            cause: "BILL_NOT_RECONCILED",
                            dedupe_key: format!("BILL_NOT_RECONCILED:{p}:{yesterday}"),
                            title: "截止时间已过,昨日账单仍未对账".into(),
                            lines: vec![
                                format!("渠道:{}", provider_zh(*p)),
                                format!("账单日期:{yesterday}"),
                                format!("截止:{}({})", cutoff.format("%H:%M"), config.timezone),
                                format!("账单目录:{}", config.statement_dir.display()),
                            ],
                            order_no: None,
                            trace_id: trace.clone(),
                            detail: json!({"provider": p.as_str(), "billDate": yesterday.to_string()}),
                        },
                    )
                    .await?,
                );
            }
        }
    }
    // A provider answering with bad signatures, or its API failing, repeatedly: at most one
    // alert per provider, finding and hour.
    #[derive(QueryableByName)]
    struct Failing {
        #[diesel(sql_type = Text)]
        what: String,
        #[diesel(sql_type = Text)]
        provider: String,
        #[diesel(sql_type = BigInt)]
        n: i64,
        #[diesel(sql_type = Text)]
        hour: String,
    }
    let failing: Vec<Failing> = StaticQuery::new(include_str!("failing_providers.sql"))
        .load(conn)
        .await?;
    for f in failing {
        let (cause, title, line) = if f.what == "BAD_SIGNATURE" {
            (
                "PROVIDER_BAD_SIGNATURE",
                "支付回调验签失败多次",
                format!("10 分钟内 {} 次未通过签名校验(密钥或证书是否过期?是否有人伪造?)", f.n),
            )
        } else {
            (
                "PROVIDER_FAILING",
                "支付渠道接口连续失败",
                format!("10 分钟内退款调用失败 {} 次", f.n),
            )
        };
        count(
            raise(
                conn,
                Alert {
                    cause,
                    dedupe_key: format!("{cause}:{}:{}", f.provider, f.hour),
                    title: title.into(),
                    lines: vec![format!("渠道:{}", provider_text_zh(&f.provider)), line],
                    order_no: None,
                    trace_id: trace.clone(),
                    detail: json!({"provider": f.provider, "count": f.n}),
                },
            )
            .await?,
        );
    }
    use crate::db::schema::alert_deliveries as ad;
    let dead: i64 = ad::table.filter(ad::status.eq("DEAD")).count().get_result(conn).await?;
    metrics::gauge!("fitorder_alert_deliveries_dead").set(dead as f64);
    Ok(raised)
}
