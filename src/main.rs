//! `fitorder`: one binary, several roles. `main` only parses and wires.

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: the GraphQL pages allocate many small values (B5).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use fitorder::auth::{issue_token, Role};
use fitorder::config::Config;
use fitorder::domain::Provider;
use fitorder::server::{self, ServeOptions};
use secrecy::ExposeSecret;

/// fitorder: the order backend of a chain of AI fitness studios.
///
/// Every setting is an environment variable and a flag before the command (`fitorder
/// --order-timeout 5m serve`); the variables are listed below with their defaults
/// (docs/configuration.md has the same table).
#[derive(Parser)]
#[command(name = "fitorder", version, max_term_width = 110)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    config: Config,
}

#[derive(Subcommand)]
enum Command {
    /// API, workers and scheduler (the default).
    Serve {
        /// An API-only instance: no outbox workers, no scheduler.
        #[arg(long)]
        no_workers: bool,
        /// Development mode (demo data, dev tokens, the provider sandbox) on `DATABASE_URL`;
        /// implied when `DATABASE_URL` is unset.
        #[arg(long)]
        dev: bool,
    },
    /// Workers and scheduler only.
    Worker {
        /// Development mode, as for `serve`.
        #[arg(long)]
        dev: bool,
    },
    /// Apply the database migrations.
    Migrate,
    /// Print a JWT signed with `FITORDER_JWT_SECRET`.
    Token {
        /// member, admin or ops.
        #[arg(long, value_parser = role)]
        role: Role,
        #[arg(long)]
        sub: String,
        /// Store ids, comma-separated (a store-limited admin).
        #[arg(long, value_delimiter = ',')]
        stores: Option<Vec<String>>,
        /// Lifetime (humantime), at most a year.
        #[arg(long, value_parser = ttl, default_value = "1h")]
        ttl: Duration,
    },
    /// Demo stores, members, catalog (idempotent).
    Seed,
    /// Reconcile one provider's bill of one day; exits non-zero when the run failed.
    Reconcile {
        #[arg(long, value_parser = provider)]
        provider: Provider,
        /// YYYY-MM-DD.
        #[arg(long)]
        date: chrono::NaiveDate,
        /// The bill to read (default: `FITORDER_STATEMENT_DIR`, else fetched).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Recent alerts and their deliveries.
    Alerts {
        /// Send DEAD deliveries again (a running worker picks them up).
        #[arg(long)]
        replay_dead: bool,
    },
    /// Print the GraphQL schema (SDL).
    Schema,
    /// Sign a payment notification with the dev keys and send it to a running server.
    SimulatePayment {
        #[arg(long)]
        order: String,
        #[arg(long, value_parser = provider, default_value = "wechatpay")]
        provider: Provider,
        /// In cents (default: what the server says the order wants paid online).
        #[arg(long)]
        amount: Option<i64>,
        /// The provider's transaction id (default: made up).
        #[arg(long)]
        txn: Option<String>,
        /// The server (default: `http://` and `FITORDER_ADDR`).
        #[arg(long)]
        url: Option<String>,
    },
    /// Play WeChat Pay and Alipay on loopback with the dev keys; prints the settings
    /// (KEY=VALUE) that point a fitorder at it.
    SandboxProvider {
        #[arg(long, default_value = "127.0.0.1:8090")]
        addr: String,
        #[arg(long, default_value = ".fitorder/dev-keys")]
        keys: PathBuf,
    },
}

fn role(raw: &str) -> Result<Role, String> {
    Role::parse(raw).ok_or_else(|| format!("unknown role {raw:?} (member, admin, ops)"))
}

fn provider(raw: &str) -> Result<Provider, String> {
    Provider::from_short_name(raw).ok_or_else(|| format!("unknown provider {raw:?} (wechatpay, alipay)"))
}

fn ttl(raw: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(raw).map_err(|_| format!("{raw:?} is not a duration like 1h"))?;
    if ttl.as_secs() > fitorder::auth::MAX_TOKEN_LIFETIME_SECS as u64 {
        return Err(format!("{raw:?} is longer than a year: such a token would be refused"));
    }
    Ok(ttl)
}

fn main() -> ExitCode {
    // The settings' variables as the one definition names them, a blank one counting as unset.
    let cmd = fitorder::config::reference::reading_env(Cli::command());
    let matches = match cmd.try_get_matches() {
        Ok(m) => m,
        Err(e) if e.use_stderr() => {
            let e = match e.kind() {
                clap::error::ErrorKind::ValueValidation | clap::error::ErrorKind::InvalidValue => {
                    fitorder::config::reference::explain(e)
                }
                _ => e.exit(),
            };
            eprintln!("fitorder: {e:#}");
            return ExitCode::from(2);
        }
        Err(e) => e.exit(),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    fitorder::logging::init(fitorder::logging::LogFormat::or_by_terminal(cli.config.log_format));
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fitorder: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let command = cli.command.unwrap_or(Command::Serve {
        no_workers: false,
        dev: false,
    });
    match command {
        Command::Schema => {
            print!("{}", fitorder::graphql::sdl());
            Ok(())
        }
        Command::SandboxProvider { addr, keys } => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(sandbox_provider(addr, keys))
        }
        Command::SimulatePayment {
            order,
            provider,
            amount,
            txn,
            url,
        } => {
            let config = cli.config.resolve()?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(simulate_payment(config, order, provider, amount, txn, url))
        }
        Command::Token { role, sub, stores, ttl } => {
            let config = cli.config.resolve()?;
            println!(
                "{}",
                issue_token(config.jwt_secret.expose_secret(), role, &sub, stores, ttl)
            );
            Ok(())
        }
        command => {
            let mut config = cli.config.resolve()?;
            // Development mode on a database of one's own (the private cluster implies it).
            config.dev_mode = matches!(
                command,
                Command::Serve { dev: true, .. } | Command::Worker { dev: true }
            );
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(async move {
                match command {
                    Command::Serve { no_workers, .. } => {
                        server::run(
                            config,
                            ServeOptions {
                                http: true,
                                workers: !no_workers,
                            },
                        )
                        .await
                    }
                    Command::Worker { .. } => {
                        server::run(
                            config,
                            ServeOptions {
                                http: false,
                                workers: true,
                            },
                        )
                        .await
                    }
                    Command::Migrate => {
                        let (url, dev) = server::resolve_database(&config).await?;
                        let r = fitorder::db::migrate(&url).await;
                        if let Some(dev) = dev {
                            tokio::task::spawn_blocking(move || dev.stop()).await.ok();
                        }
                        r
                    }
                    Command::Seed => {
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
                    Command::Alerts { replay_dead } => alerts(config, replay_dead).await,
                    Command::Reconcile { provider, date, file } => reconcile(config, provider, date, file).await,
                    _ => bail!("unreachable: handled above"),
                }
            })
        }
    }
}

/// `fitorder alerts [--replay-dead]`: the last 30 alerts with their deliveries; DEAD deliveries
/// sent again (a running worker picks them up).
async fn alerts(config: Config, replay_dead: bool) -> Result<()> {
    let (url, dev) = server::resolve_database(&config).await?;
    let result = async {
        let pool = fitorder::db::pool(&url, 1)?;
        let mut conn = pool.get().await?;
        if replay_dead {
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
async fn reconcile(config: Config, provider: Provider, date: chrono::NaiveDate, file: Option<PathBuf>) -> Result<()> {
    use std::io::Write;
    let path = file
        .clone()
        .unwrap_or_else(|| fitorder::reconciliation::statement_path(&config.statement_dir, provider, date));
    let (url, dev) = server::resolve_database(&config).await?;
    let result = async {
        fitorder::db::migrate(&url).await?;
        let pool = fitorder::db::pool(&url, 4)?;
        let keys = fitorder::providers::keys::ProviderKeys::load(&config)?;
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
async fn sandbox_provider(addr: String, dir: PathBuf) -> Result<()> {
    use fitorder::dev::devkeys::{dev_sandbox_keys, DevKeys};
    use fitorder::dev::sandbox_server::SandboxProvider;
    use std::io::Write;
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
async fn simulate_payment(
    config: Config,
    order_no: String,
    provider: Provider,
    amount: Option<i64>,
    txn: Option<String>,
    url: Option<String>,
) -> Result<()> {
    let base = url.unwrap_or_else(|| format!("http://{}", config.addr));
    let keys = fitorder::dev::devkeys::DevKeys::ensure(std::path::Path::new(".fitorder/dev-keys"))?;
    let http = reqwest::Client::new();
    let amount: i64 = match amount {
        Some(a) => a,
        None => {
            // Ask the server what the order wants paid online.
            let token = issue_token(
                config.jwt_secret.expose_secret(),
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
    let txn = txn.unwrap_or_else(|| format!("42{}", chrono::Utc::now().format("%Y%m%d%H%M%S%6f")));
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
