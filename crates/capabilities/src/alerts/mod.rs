//! Alerts that reach people: a row written in the transaction of what caused it (once per
//! cause: `dedupe_key` is unique, so a scheduler that finds the same DEAD event every minute
//! raises one alert) and, in the same transaction, one outbox effect per configured channel
//! ([`Effect::AlertDelivery`], written by [`outbox::enqueue`]). The outbox delivers them like
//! any other effect: claimed under a lease, retried with backoff, DEAD at the limit (logged and
//! counted: a lost chat message is visible), replayed by the outbox's replay
//! (`compensation::replay_dead_alerts`). Here are what is said ([`deliver`]), and a per-channel
//! rate limit, counted in the database, that holds for the whole cluster ([`take_send_slot`]).

pub mod channels;

use std::time::Duration;

use chrono::Utc;
use diesel::sql_types::{BigInt, Double, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel::{ExpressionMethods, QueryDsl, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::{json, Value};

use crate::config::Config;
use crate::db::models::{CompensationEvent, ExceptionTicket, Order};
use crate::db::sql::StaticQuery;
use crate::domain::effect::AlertPayload;
use crate::domain::money::format_yuan;
use crate::domain::{
    AlertCause, CompensationKind, CompensationStatus, Effect, Provider, ReconciliationStatus, TicketKind,
};
use crate::error::AppResult;
use crate::outbox;
use crate::trace::TraceId;
use channels::Message;

/// One alert, before it is written.
#[derive(Debug, Clone)]
pub struct Alert {
    /// What kind of thing happened (`COMPENSATION_DEAD`, `PAID_AFTER_CANCEL`, …).
    pub cause: AlertCause,
    /// The same cause found again raises nothing new.
    pub dedupe_key: String,
    pub title: String,
    pub lines: Vec<String>,
    pub order_no: Option<String>,
    pub trace_id: String,
    pub detail: Value,
}

/// What an effect does, in words (every effect has its words: no fallback).
fn action_zh(kind: CompensationKind) -> &'static str {
    match kind {
        CompensationKind::DoorAccessGrant => "开通门禁",
        CompensationKind::DoorAccessRevoke => "关闭门禁",
        CompensationKind::AiAccessGrant => "开通 AI 设备",
        CompensationKind::AiAccessRevoke => "关闭 AI 设备",
        CompensationKind::ProviderRefund => "原路退款",
        CompensationKind::AlertDelivery => "发送告警",
    }
}

/// The alert decision for each effect: does a DEAD event of `kind` raise an alert? An order's
/// effect does (people must act); an alert delivery does not (its alert would go to the
/// channels that are failing, and fail in turn): it is logged and counted
/// (`fitorder_alert_deliveries_dead`). A new effect must decide here: the `match` has no
/// wildcard.
pub fn alerts_when_dead(kind: CompensationKind) -> bool {
    match kind {
        CompensationKind::DoorAccessGrant
        | CompensationKind::DoorAccessRevoke
        | CompensationKind::AiAccessGrant
        | CompensationKind::AiAccessRevoke
        | CompensationKind::ProviderRefund => true,
        CompensationKind::AlertDelivery => false,
    }
}

/// The chat channel an effect is sent to, if it is a chat message (what the rate limit counts).
pub fn channel_of(effect: &Effect) -> Option<&str> {
    match effect {
        Effect::DoorAccessGrant(_)
        | Effect::DoorAccessRevoke(_)
        | Effect::AiAccessGrant(_)
        | Effect::AiAccessRevoke(_)
        | Effect::ProviderRefund(_) => None,
        Effect::AlertDelivery(p) => Some(&p.channel),
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
        TicketKind::RefundOverdue => "冷静期退款逾期",
        TicketKind::UnknownOrder | TicketKind::RejectedTransition => "其他",
    }
}

impl Alert {
    /// A compensation event that ran out of attempts; `None` when its kind raises no alert
    /// ([`alerts_when_dead`]).
    pub fn compensation_dead(e: &CompensationEvent, order: &Order) -> Option<Alert> {
        if !alerts_when_dead(e.kind) {
            return None;
        }
        let action = action_zh(e.kind);
        Some(Alert {
            cause: AlertCause::CompensationDead,
            dedupe_key: format!("COMPENSATION_DEAD:{}:{}", e.id, e.attempts),
            title: "补偿事件已放弃(DEAD),需要人工处理".into(),
            lines: vec![
                format!("订单:{}", order.order_no),
                format!("动作:{}({})", action, e.kind),
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
        })
    }

    /// A ticket people must act on now: a payment for a canceled order, an amount that differs
    /// from the order's, a cooling-off refund past its deadline. `None` for the other kinds.
    pub fn ticket(t: &ExceptionTicket) -> Option<Alert> {
        let (cause, title) = match t.kind {
            TicketKind::PaidAfterCancel => (AlertCause::PaidAfterCancel, "订单已取消后收到付款"),
            TicketKind::AmountMismatch => (AlertCause::AmountMismatch, "实付金额与订单金额不符"),
            TicketKind::RefundOverdue => (AlertCause::RefundOverdue, "冷静期退款到期未到账"),
            // Reconciliation's findings are told by its run's alert, a DEAD effect by its own
            // (`Alert::compensation_dead`); the others wait on the workbench.
            TicketKind::ProviderPaidLocalUnpaid
            | TicketKind::LocalPaidProviderMissing
            | TicketKind::RefundMismatch
            | TicketKind::CompensationDead
            | TicketKind::UnknownOrder
            | TicketKind::RejectedTransition => return None,
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
        if t.kind == TicketKind::RefundOverdue {
            if let Some(due) = t.detail.get("refundDueBy").and_then(|d| d.as_str()) {
                lines.push(format!("应退款日期:{due}(工作日计)"));
            }
            lines.push("渠道退款尚未确认到账:请查询渠道退款,必要时线下退款".into());
        }
        lines.push(format!("工单:#{}({})", t.id, ticket_kind_zh(t.kind)));
        Some(Alert {
            cause,
            dedupe_key: format!("TICKET:{}", t.id),
            title: title.into(),
            lines,
            order_no: t.order_no.clone(),
            trace_id: t.trace_id.clone(),
            detail: json!({"ticketId": t.id.to_string(), "kind": t.kind.as_str()}),
        })
    }
}

/// Writes an alert in the caller's transaction unless the same cause raised one already and,
/// in the same transaction, its deliveries: one outbox effect per channel configured here
/// (announced to the workers on commit). Returns the new alert's id.
pub async fn raise(conn: &mut AsyncPgConnection, config: &Config, a: Alert) -> AppResult<Option<i64>> {
    #[derive(QueryableByName)]
    struct Raised {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = Timestamptz)]
        created_at: chrono::DateTime<Utc>,
    }
    let raised: Option<Raised> = StaticQuery::new(include_str!("raise.sql"))
        .bind::<Text, _>(a.cause.as_str())
        .bind::<Text, _>(&a.dedupe_key)
        .bind::<Text, _>(&a.title)
        .bind::<Jsonb, _>(json!(a.lines))
        .bind::<Nullable<Text>, _>(a.order_no.as_deref())
        .bind::<Text, _>(&a.trace_id)
        .bind::<Jsonb, _>(&a.detail)
        .bind::<diesel::sql_types::Bool, _>(!config.alert_channels.is_empty())
        .get_result(conn)
        .await
        .optional()?;
    let Some(Raised { id, created_at }) = raised else {
        return Ok(None);
    };
    let written = Written {
        id,
        cause: a.cause.as_str().to_string(),
        title: a.title.clone(),
        lines: a.lines.clone(),
        order_no: a.order_no.clone(),
        trace_id: a.trace_id.clone(),
        created_at,
    };
    enqueue_deliveries(conn, config, &written).await?;
    tracing::error!(alert = id, cause = a.cause.as_str(), order_no = ?a.order_no, trace_id = %a.trace_id,
        "ALERT: {}", a.title);
    metrics::counter!("fitorder_alerts_raised_total", "cause" => a.cause.as_str()).increment(1);
    Ok(Some(id))
}

/// An alert as written.
struct Written {
    id: i64,
    cause: String,
    title: String,
    lines: Vec<String>,
    order_no: Option<String>,
    trace_id: String,
    created_at: chrono::DateTime<Utc>,
}

/// The alert's deliveries, one per configured channel, written by the one outbox enqueue.
async fn enqueue_deliveries(conn: &mut AsyncPgConnection, config: &Config, a: &Written) -> AppResult<usize> {
    let effects: Vec<Effect> = config
        .alert_channels
        .iter()
        .map(|c| {
            Effect::AlertDelivery(AlertPayload {
                alert_id: a.id.to_string(),
                channel: c.id.clone(),
                cause: a.cause.clone(),
                title: a.title.clone(),
                lines: a.lines.clone(),
                order_no: a.order_no.clone(),
                raised_at: a.created_at,
            })
        })
        .collect();
    if effects.is_empty() {
        return Ok(0);
    }
    let ids = outbox::enqueue(
        conn,
        None,
        &effects,
        &TraceId(a.trace_id.clone()),
        config.alert_max_attempts,
    )
    .await?;
    Ok(ids.len())
}

/// Alerts written while no channel was configured (or by a build that fanned out later) get
/// their deliveries now, at most 200 a call; rows another instance is fanning out are skipped.
/// Nothing when no channel is configured here. Returns how many alerts were fanned out.
pub async fn fan_out_waiting(conn: &mut AsyncPgConnection, config: &Config) -> AppResult<usize> {
    if config.alert_channels.is_empty() {
        return Ok(0);
    }
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = BigInt)]
        id: i64,
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
    conn.transaction(async |conn| -> AppResult<usize> {
        let rows: Vec<Row> = StaticQuery::new(include_str!("fan_out.sql")).load(conn).await?;
        for r in &rows {
            let written = Written {
                id: r.id,
                cause: r.cause.clone(),
                title: r.title.clone(),
                lines: lines_of(&r.lines),
                order_no: r.order_no.clone(),
                trace_id: r.trace_id.clone(),
                created_at: r.created_at,
            };
            enqueue_deliveries(conn, config, &written).await?;
        }
        Ok(rows.len())
    })
    .await
}

fn lines_of(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|l| l.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Opens a ticket ([`crate::tickets::open`], the one ticket writer) and, when it is about money
/// that needs a person now ([`Alert::ticket`]), raises its alert in the same transaction.
/// Returns the ticket when newly opened.
pub async fn open_ticket(
    conn: &mut AsyncPgConnection,
    config: &Config,
    t: crate::tickets::NewTicket<'_>,
    trace: &TraceId,
) -> AppResult<Option<ExceptionTicket>> {
    let opened = crate::tickets::open(conn, t, trace).await?;
    if let Some(alert) = opened.as_ref().and_then(Alert::ticket) {
        raise(conn, config, alert).await?;
    }
    Ok(opened)
}

use diesel::OptionalExtension;

/// One attempt of an alert delivery (an outbox event of kind `ALERT_DELIVERY` with trace id
/// `trace_id`): the message to its channel as configured here. `Err` says what went wrong,
/// never the URL (it holds the token).
pub async fn deliver(http: &reqwest::Client, config: &Config, p: &AlertPayload, trace_id: &str) -> Result<(), String> {
    let Some(channel) = config.alert_channels.iter().find(|c| c.id == p.channel) else {
        return Err("channel not configured on this instance".to_string());
    };
    let m = Message {
        alert_id: p.alert_id.parse().unwrap_or_default(),
        cause: p.cause.clone(),
        title: p.title.clone(),
        lines: p.lines.clone(),
        order_no: p.order_no.clone(),
        trace_id: trace_id.to_string(),
        ops_url: config.ops_url(),
        created_at: p.raised_at,
    };
    let result = channels::send(http, channel, &m).await;
    let kind = channel.kind.as_str();
    let outcome = if result.is_ok() { "ok" } else { "failed" };
    metrics::counter!("fitorder_alert_attempts_total", "channel" => kind, "outcome" => outcome).increment(1);
    match &result {
        Ok(()) => tracing::info!(alert = %p.alert_id, channel = %p.channel, trace_id, "alert delivered"),
        Err(e) => tracing::warn!(alert = %p.alert_id, channel = %p.channel, error = %e, "alert delivery failed"),
    }
    result
}

/// A DEAD alert delivery: logged and counted, never alerted ([`alerts_when_dead`]).
pub fn delivery_dead(e: &CompensationEvent) {
    let channel = e.payload["channel"].as_str().unwrap_or("");
    let kind = channel.split('-').next().unwrap_or("unknown").to_string();
    metrics::counter!("fitorder_alert_deliveries_dead_total", "channel" => kind).increment(1);
    tracing::error!(event = e.id, alert = ?e.payload["alertId"].as_str(), channel, attempts = e.attempts,
        error = ?e.last_error, trace_id = %e.trace_id, "ALERT delivery is DEAD: a chat message was not delivered");
}

/// Takes one request from `channel`'s allowance of `rate` a minute (a token bucket in the
/// database, taken in one statement: the rate holds across every worker of every process).
/// `None`: send now; `Some(wait)`: over the rate, try again after `wait`.
pub async fn take_send_slot(conn: &mut AsyncPgConnection, channel: &str, rate: i64) -> AppResult<Option<Duration>> {
    #[derive(QueryableByName)]
    struct Left {
        #[diesel(sql_type = Double)]
        #[allow(dead_code)]
        tokens: f64,
    }
    let rate = rate.max(1) as f64;
    let left: Option<Left> = StaticQuery::new(include_str!("take_slot.sql"))
        .bind::<Text, _>(channel)
        .bind::<Double, _>(rate)
        .get_result(conn)
        .await
        .optional()?;
    Ok(match left {
        Some(_) => None,
        None => Some(Duration::from_secs_f64(60.0 / rate)),
    })
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
pub async fn reconciliation_run(conn: &mut AsyncPgConnection, config: &Config, run_id: i64) -> AppResult<Option<i64>> {
    let rows = reconciliation_rows(conn, Some(run_id)).await?;
    let mut raised = None;
    for r in rows {
        raised = raise(conn, config, reconciliation_alert(&r)).await?.or(raised);
    }
    Ok(raised)
}

/// Raises the alerts of every recently finished run that FAILED or found differences and has
/// none yet (what the scheduler calls right after a reconciliation task).
pub async fn reconciliation_recent(conn: &mut AsyncPgConnection, config: &Config) -> AppResult<usize> {
    let mut n = 0;
    for r in reconciliation_rows(conn, None).await? {
        n += raise(conn, config, reconciliation_alert(&r)).await?.is_some() as usize;
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
            AlertCause::ReconciliationFailed
        } else {
            AlertCause::ReconciliationDifferences
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
    fan_out_waiting(conn, config).await?;
    let mut raised = reconciliation_recent(conn, config).await? as i64;
    let mut count = |r: Option<i64>| raised += r.is_some() as i64;
    for (id, task, instance) in stuck_runs {
        count(
            raise(
                conn,
                config,
                Alert {
                    cause: AlertCause::TaskStuck,
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
                config,
                Alert {
                    cause: AlertCause::OutboxOverdue,
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
                        config,
                        Alert {
                            cause: AlertCause::BillNotReconciled,
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
                AlertCause::ProviderBadSignature,
                "支付回调验签失败多次",
                format!("10 分钟内 {} 次未通过签名校验(密钥或证书是否过期?是否有人伪造?)", f.n),
            )
        } else {
            (
                AlertCause::ProviderFailing,
                "支付渠道接口连续失败",
                format!("10 分钟内退款调用失败 {} 次", f.n),
            )
        };
        count(
            raise(
                conn,
                config,
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
    use crate::db::schema::compensation_events as ce;
    let dead: i64 = ce::table
        .filter(ce::kind.eq(CompensationKind::AlertDelivery.as_str()))
        .filter(ce::status.eq(CompensationStatus::Dead.as_str()))
        .count()
        .get_result(conn)
        .await?;
    metrics::gauge!("fitorder_alert_deliveries_dead").set(dead as f64);
    Ok(raised)
}
