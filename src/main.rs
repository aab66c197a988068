//! `fitorder`: one binary, several roles. `main` only parses and wires.

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the GraphQL pages allocate many small values (B5).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{bail, Context, Result};
use fitorder::auth::{issue_token, Role};
use fitorder::config::{Config, ENV_HELP};
use fitorder::domain::Provider;
use fitorder::server::{self, ServeOptions};

const USAGE: &str = "\
fitorder: the order backend of a chain of AI fitness studios

Usage:
  fitorder [serve] [--no-workers] [--dev]
                                    API, workers and scheduler (default); --dev: development
                                    mode (demo data, dev tokens, the provider sandbox) on
                                    DATABASE_URL — implied when DATABASE_URL is unset
  fitorder worker [--dev]           workers and scheduler only
  fitorder migrate                  apply database migrations
  fitorder token --role R --sub S [--stores a,b] [--ttl 1h]
                                    print a JWT (role: member, admin, ops)
  fitorder seed                     demo stores, members, catalog
  fitorder reconcile --provider wechatpay|alipay --date YYYY-MM-DD [--file F]
  fitorder alerts [--replay-dead]   recent alerts and their deliveries; send DEAD ones again
  fitorder schema                   print the GraphQL schema (SDL)
  fitorder simulate-payment --order NO [--provider wechatpay|alipay] [--amount CENTS] [--txn ID] [--url URL]
                                    sign a payment notification with the dev keys and send it
  fitorder sandbox-provider [--addr 127.0.0.1:8090] [--keys .fitorder/dev-keys]
                                    play WeChat Pay and Alipay on loopback with the dev keys; prints
                                    the settings (KEY=VALUE) that point a fitorder at it
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h" || a == "help") {
        print!("{USAGE}\n{ENV_HELP}");
        return ExitCode::SUCCESS;
    }
    fitorder::logging::init(fitorder::logging::LogFormat::from_env());
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fitorder: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| {
            let prefix = format!("{name}=");
            args.iter().find_map(|a| a.strip_prefix(&prefix).map(str::to_string))
        })
}

fn run(args: Vec<String>) -> Result<()> {
    let command = args
        .first()
        .map(String::as_str)
        .filter(|a| !a.starts_with('-'))
        .unwrap_or("serve");
    let rest = if args.first().is_some_and(|a| !a.starts_with('-')) {
        &args[1..]
    } else {
        &args[..]
    };
    match command {
        "simulate-payment" => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(simulate_payment(Config::from_env()?, rest))
        }
        "sandbox-provider" => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(sandbox_provider(rest))
        }
        "schema" => {
            print!("{}", fitorder::graphql::sdl());
            Ok(())
        }
        "token" => {
            let config = Config::from_env()?;
            let role = flag(rest, "--role").context("--role is required (member, admin, ops)")?;
            let role = Role::parse(&role).with_context(|| format!("unknown role {role:?}"))?;
            let sub = flag(rest, "--sub").context("--sub is required")?;
            let stores = flag(rest, "--stores").map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
            let ttl = match flag(rest, "--ttl") {
                Some(t) => {
                    let ttl = humantime::parse_duration(&t).with_context(|| format!("--ttl {t:?}"))?;
                    anyhow::ensure!(
                        ttl.as_secs() <= fitorder::auth::MAX_TOKEN_LIFETIME_SECS as u64,
                        "--ttl {t:?} is longer than a year: such a token would be refused"
                    );
                    ttl
                }
                None => std::time::Duration::from_secs(3600),
            };
            println!("{}", issue_token(&config.jwt_secret, role, &sub, stores, ttl));
            Ok(())
        }
        "serve" | "worker" | "migrate" | "seed" | "reconcile" | "alerts" => {
            let mut config = Config::from_env()?;
            // Development mode on a database of one's own (the private cluster implies it).
            config.dev_mode = rest.iter().any(|a| a == "--dev");
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(async move {
                match command {
                    "serve" => {
                        let workers = !rest.iter().any(|a| a == "--no-workers");
                        server::run(config, ServeOptions { http: true, workers }).await
                    }
                    "worker" => {
                        server::run(
                            config,
                            ServeOptions {
                                http: false,
                                workers: true,
                            },
                        )
                        .await
                    }
                    "migrate" => {
                        let (url, dev) = server::resolve_database(&config).await?;
                        let r = fitorder::db::migrate(&url).await;
                        if let Some(dev) = dev {
                            tokio::task::spawn_blocking(move || dev.stop()).await.ok();
                        }
                        r
                    }
                    "seed" => {
                        let (url, dev) = server::resolve_database(&config).await?;
                        let r = async {
                            fitorder::db::migrate(&url).await?;
                            let pool = fitorder::db::pool(&url, 2)?;
                            let mut conn = pool.get().await?;
                            let s = fitorder::dev::seed::seed(&mut conn)
                                .await
                                .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
                            println!(
                                "demo data {}: stores {:?}, members {:?}",
                                if s.created { "created" } else { "already present" },
                                s.store_ids,
                                s.member_ids
                            );
                            Ok::<_, anyhow::Error>(())
                        }
                        .await;
                        if let Some(dev) = dev {
                            tokio::task::spawn_blocking(move || dev.stop()).await.ok();
                        }
                        r
                    }
                    "alerts" => alerts(config, rest).await,
                    _ => reconcile(config, rest).await,
                }
            })
        }
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}

/// `fitorder alerts [--replay-dead]`: the last 30 alerts with their deliveries; DEAD deliveries
/// sent again (a running worker picks them up).
async fn alerts(config: Config, rest: &[String]) -> Result<()> {
    let (url, dev) = server::resolve_database(&config).await?;
    let result = async {
        let pool = fitorder::db::pool(&url, 1)?;
        let mut conn = pool.get().await?;
        if rest.iter().any(|a| a == "--replay-dead") {
            let ctx = fitorder::domain::Ctx {
                actor: fitorder::domain::Actor::system("alerts --replay-dead"),
                trace: fitorder::trace::TraceId::new(),
            };
            let n = fitorder::compensation::replay_dead_alerts(&mut conn, None, &ctx, config.alert_max_attempts)
                .await
                .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
            println!("{n} DEAD deliveries sent again");
        }
        for line in fitorder::alerts::recent(&mut conn, 30)
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message()))?
        {
            println!("{line}");
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if let Some(dev) = dev {
        tokio::task::spawn_blocking(move || dev.stop()).await.ok();
    }
    result
}

/// `fitorder reconcile --provider wechatpay|alipay --date YYYY-MM-DD [--file F]`: prints what it
/// does as it goes, and exits non-zero when the run failed.
async fn reconcile(config: Config, rest: &[String]) -> Result<()> {
    use std::io::Write;
    let provider = flag(rest, "--provider").context("--provider wechatpay|alipay is required")?;
    let provider = Provider::from_short_name(&provider).with_context(|| format!("unknown provider {provider:?}"))?;
    let date = flag(rest, "--date").context("--date YYYY-MM-DD is required")?;
    let date = chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d").with_context(|| format!("--date {date:?}"))?;
    let file = flag(rest, "--file").map(std::path::PathBuf::from);
    let path = file
        .clone()
        .unwrap_or_else(|| fitorder::reconciliation::statement_path(&config.statement_dir, provider, date));
    let (url, dev) = server::resolve_database(&config).await?;
    let result = async {
        fitorder::db::migrate(&url).await?;
        let pool = fitorder::db::pool(&url, 4)?;
        let keys = fitorder::payments::keys::ProviderKeys::load(&config)?;
        let state = fitorder::app::AppState::with_keys(
            pool,
            config.clone(),
            keys,
            fitorder::events::EventHub::detached(),
            url.clone(),
        );
        eprint!("reconciling {provider} {date} from {} ... ", path.display());
        let _ = std::io::stderr().flush();
        let started = std::time::Instant::now();
        let trace = fitorder::trace::TraceId::new();
        let run = fitorder::reconciliation::run(&state, provider, date, file, &trace)
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        eprintln!("{} in {:.1}s", run.status, started.elapsed().as_secs_f64());
        // A failed run or one with differences is told to the chat groups (the workers send it).
        if let Ok(mut conn) = state.pool.get().await {
            let _ = fitorder::alerts::reconciliation_run(&mut conn, &state.config, run.id).await;
        }
        println!(
            "run {}: {} provider rows, {} local rows, {} matched, {} tickets opened{}",
            run.id,
            run.provider_rows,
            run.local_rows,
            run.matched,
            run.tickets_opened,
            run.error.as_ref().map(|e| format!("; error: {e}")).unwrap_or_default()
        );
        if run.status != fitorder::domain::ReconciliationStatus::Succeeded {
            bail!("reconciliation {}", run.status);
        }
        Ok(())
    }
    .await;
    if let Some(dev) = dev {
        tokio::task::spawn_blocking(move || dev.stop()).await.ok();
    }
    result
}

/// The development sandbox on its own: WeChat Pay and Alipay over HTTP with the dev keys of
/// `--keys`, until SIGINT or SIGTERM. Standard output gets the settings for fitorder, one
/// `KEY=VALUE` a line (`set -a; . file` reads them), then `# ready`.
async fn sandbox_provider(rest: &[String]) -> Result<()> {
    use fitorder::dev::devkeys::{dev_sandbox_keys, DevKeys};
    use fitorder::dev::sandbox_server::SandboxProvider;
    use std::io::Write;
    let addr = flag(rest, "--addr").unwrap_or_else(|| "127.0.0.1:8090".into());
    let dir = std::path::PathBuf::from(flag(rest, "--keys").unwrap_or_else(|| ".fitorder/dev-keys".into()));
    let keys = tokio::task::spawn_blocking(move || DevKeys::ensure(&dir)).await??;
    let sandbox = SandboxProvider::start(dev_sandbox_keys(&keys), &addr).await?;
    let mut out = std::io::stdout().lock();
    for (k, v) in keys.sandbox_env(&sandbox.wechat_api_base(), &sandbox.alipay_gateway()) {
        writeln!(out, "{k}={v}")?;
    }
    writeln!(
        out,
        "# ready: the cashier of a trade is {}/cashier/{{wechat|alipay}}/<orderNo>",
        sandbox.base_url
    )?;
    out.flush()?;
    drop(out);
    tracing::info!(base = %sandbox.base_url, "sandbox provider running");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}

/// Pays an order the way the provider would: a notification signed (and for WeChat Pay,
/// encrypted) with the dev keys of `./.fitorder/dev-keys`, sent to the running server.
async fn simulate_payment(config: Config, rest: &[String]) -> Result<()> {
    let order_no = flag(rest, "--order").context("--order <orderNo> is required")?;
    let provider = match flag(rest, "--provider") {
        Some(name) => Provider::from_short_name(&name).context("--provider wechatpay|alipay")?,
        None => Provider::WechatPay,
    };
    let base = flag(rest, "--url").unwrap_or_else(|| format!("http://{}", config.addr));
    let keys = fitorder::dev::devkeys::DevKeys::ensure(std::path::Path::new(".fitorder/dev-keys"))?;
    let http = reqwest::Client::new();
    let amount: i64 = match flag(rest, "--amount") {
        Some(a) => a.parse().context("--amount is in cents")?,
        None => {
            // Ask the server what the order wants paid online.
            let token = issue_token(
                &config.jwt_secret,
                Role::Admin,
                "simulator",
                None,
                std::time::Duration::from_secs(60),
            );
            let q = serde_json::json!({"query": "query($n: String!) { order(orderNo: $n) { amountCents walletAmountCents } }",
                                       "variables": {"n": order_no}});
            let r: serde_json::Value = http
                .post(format!("{base}/graphql"))
                .bearer_auth(token)
                .json(&q)
                .send()
                .await?
                .json()
                .await?;
            let o = &r["data"]["order"];
            anyhow::ensure!(!o.is_null(), "order {order_no} not found at {base}: {r}");
            o["amountCents"].as_i64().unwrap_or(0) - o["walletAmountCents"].as_i64().unwrap_or(0)
        }
    };
    let txn = flag(rest, "--txn").unwrap_or_else(|| format!("42{}", chrono::Utc::now().format("%Y%m%d%H%M%S%6f")));
    let resp = if provider == Provider::WechatPay {
        let w = keys.wechat();
        let n = w.notification(
            "TRANSACTION.SUCCESS",
            &w.transaction(&order_no, &txn, amount),
            chrono::Utc::now().timestamp(),
        );
        let mut req = http
            .post(format!("{base}/pay/wechat/notify"))
            .header("content-type", "application/json");
        for (k, v) in &n.headers {
            req = req.header(*k, v);
        }
        req.body(n.body).send().await?
    } else {
        let form = keys.alipay().payment(
            &order_no,
            &txn,
            "TRADE_SUCCESS",
            &fitorder::domain::money::format_yuan(amount),
        );
        http.post(format!("{base}/pay/alipay/notify"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await?
    };
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    println!("{provider} notification for {order_no} ({amount} cents, transaction {txn}): HTTP {status} {text}");
    anyhow::ensure!(status.is_success(), "the server refused the notification");
    Ok(())
}
