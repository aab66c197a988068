//! Wiring: find or start the database, migrate, serve HTTP, run the background tasks, shut
//! down cleanly on SIGTERM/SIGINT.

use crate::config::ExposeSecret;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::app::AppState;
use crate::config::Config;
use crate::db::{self, redact};
use crate::dev::dev_pg::DevPostgres;

/// The database to use: `DATABASE_URL`, or the private cluster under `./.fitorder/pg`
/// (started here, stopped by the returned handle's `stop`).
pub async fn resolve_database(config: &Config) -> Result<(String, Option<Arc<DevPostgres>>)> {
    if let Some(url) = &config.database_url {
        return Ok((url.to_string(), None));
    }
    let dev = tokio::task::spawn_blocking(|| DevPostgres::ensure(Path::new("./.fitorder/pg")))
        .await?
        .context("DATABASE_URL is unset, so fitorder starts its own PostgreSQL under ./.fitorder/pg")?;
    let dev = Arc::new(dev);
    ensure_database(&dev.url("postgres"), "fitorder").await?;
    Ok((dev.url("fitorder"), Some(dev)))
}

/// Creates database `name` through the maintenance database `admin_url` if it is missing.
pub async fn ensure_database(admin_url: &str, name: &str) -> Result<()> {
    use diesel_async::RunQueryDsl;
    let mut conn = AsyncPgConnection::establish(admin_url)
        .await
        .with_context(|| format!("connecting to {}", redact(admin_url)))?;
    #[derive(diesel::QueryableByName)]
    struct Exists {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        exists: bool,
    }
    let found: Exists = diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS exists")
        .bind::<diesel::sql_types::Text, _>(name)
        .get_result(&mut conn)
        .await?;
    if !found.exists {
        // Two processes may race here; the loser's "already exists" is fine.
        if let Err(e) = diesel::sql_query(format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
        {
            if !e.to_string().contains("already exists") {
                return Err(e.into());
            }
        }
    }
    Ok(())
}

pub struct ServeOptions {
    pub http: bool,
    pub workers: bool,
}

pub async fn run(config: Config, opts: ServeOptions) -> Result<()> {
    crate::http::metrics::install();
    let (url, dev) = resolve_database(&config).await?;
    let result = run_with_database(config, opts, &url, dev.is_some()).await;
    if let Some(dev) = dev {
        tokio::task::spawn_blocking(move || dev.stop()).await.ok();
    }
    result
}

/// A process's shared state, built in this one place for `serve`, `worker` and the tests'
/// `TestApp`: the providers' keys, the pool, the LISTEN connection.
pub fn app_state(config: Config, url: &str) -> Result<AppState> {
    let keys = crate::providers::keys::ProviderKeys::load(&config)?;
    let pool = db::pool_with(url, config.db_pool_size, config.statement_timeout)?;
    // LISTEN needs a session of its own: behind PgBouncer in transaction pooling it goes to the
    // database directly (FITORDER_LISTEN_DATABASE_URL).
    let direct = config.listen_database_url.as_deref().unwrap_or(url).to_string();
    let events = crate::events::EventHub::start(direct, pool.clone());
    Ok(AppState::with_keys(pool, config, keys, events, url.to_string()))
}

async fn run_with_database(config: Config, opts: ServeOptions, url: &str, dev_mode: bool) -> Result<()> {
    // Migrations hold a session-level advisory lock: on the direct connection too.
    let direct = config.listen_database_url.as_deref().unwrap_or(url).to_string();
    db::migrate(&direct).await?;
    let mut config = config;
    // Development mode: the private cluster of `cargo run`, or an explicit `--dev`. Anywhere
    // else nothing demo-only happens: no made-up secret, no demo data, no sandbox, no tokens.
    let dev_mode = dev_mode || config.dev_mode;
    config.dev_mode = dev_mode;
    anyhow::ensure!(
        dev_mode || !config.jwt_secret_generated,
        "FITORDER_JWT_SECRET is not set: outside development mode (DATABASE_URL is set) every instance \
         needs the same secret; set it (or run with --dev on a database of your own)"
    );
    if !dev_mode {
        crate::config::check_jwt_secret(config.jwt_secret.expose_secret())?;
    }
    config.keep_dev_secret();
    config.check_public_url()?;
    let no_provider = config.wechatpay.mch_id.is_none() && config.alipay.app_id.is_none();
    let mut sandbox = None;
    let mut dev_keys = None;
    if dev_mode && no_provider {
        let keys =
            tokio::task::spawn_blocking(|| crate::dev::devkeys::DevKeys::ensure(Path::new(".fitorder/dev-keys")))
                .await??;
        // The sandbox plays WeChat Pay and Alipay on loopback; workers of the same checkout
        // call the one `serve` runs.
        let addr = config.sandbox_addr.clone();
        if opts.http {
            let s = keys
                .start_sandbox(&mut config, &addr)
                .await
                .with_context(|| format!("starting the provider sandbox on {addr}"))?;
            // Members sign in through the sandbox's stand-in of WeChat's mini-program API.
            if config.sign_in.app_id.is_none() {
                use crate::dev::sandbox_server::miniprogram;
                config.sign_in.app_id = Some(miniprogram::DEV_MINIPROGRAM_APP_ID.into());
                config.sign_in.secret = Some(miniprogram::DEV_MINIPROGRAM_SECRET.into());
                config.sign_in.api_base = miniprogram::api_base(&s.base_url);
            }
            sandbox = Some(s);
            dev_keys = Some(keys);
        } else {
            let base = format!("http://{addr}");
            keys.configure_sandbox(
                &mut config,
                &format!("{base}/wechatpay"),
                &format!("{base}/alipay/gateway.do"),
            );
        }
    }
    // The configuration in effect (its `Debug` shows no secret).
    tracing::info!(config = ?config, "configuration");
    let state = app_state(config.clone(), url)?;
    // Several processes may share a database with different keys: each says what it serves.
    let served: Vec<&str> = crate::compensation::worker::served_providers(&state)
        .iter()
        .map(|p| p.as_str())
        .collect();
    tracing::info!(
        providers = ?served,
        "payment providers served here (callbacks, trades, refunds); refunds through any other are left to a process that has its keys"
    );
    if let Err(e) = crate::tasks::refresh_provider_keys(state.clone()).await {
        // Notifications and answers naming a certificate fail until it is fetched; the hourly
        // task and the first unknown serial try again.
        tracing::warn!(error = %e.message(), "a provider's keys could not be refreshed at start");
    }
    if dev_mode {
        let mut conn = state.pool.get().await?;
        let seeded = crate::dev::seed::seed(&mut conn)
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        print_dev_banner(&config, &seeded, sandbox.as_ref());
        // A first start's workbench has something to look at: the demo's stories, told through
        // the server's own routes once it listens (`dev::stories`).
        if let (true, Some(keys)) = (seeded.created, dev_keys.take()) {
            let state = state.clone();
            tokio::spawn(async move {
                match crate::dev::stories::tell(state, &keys, &seeded).await {
                    Ok(told) => println!(
                        "  demo stories: {} exception tickets on the workbench (a payment after cancel, a bill difference)",
                        told.tickets
                    ),
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "the demo stories were not told"),
                }
            });
        }
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let background = if opts.workers {
        crate::tasks::spawn_background(&state, &stop_rx)
    } else {
        vec![]
    };
    let shutdown = async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    };
    if !opts.http {
        match &config.metrics_addr {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr}"))?;
                tracing::info!(addr = %listener.local_addr()?, "worker running (metrics and health only)");
                let limits = crate::http::ServeLimits::from_config(&config);
                crate::http::serve_with(listener, crate::http::ops_router(state), limits, shutdown).await?;
            }
            None => {
                tracing::info!("worker running (no HTTP)");
                shutdown.await;
            }
        }
        for task in background {
            let _ = task.await;
        }
        return Ok(());
    }
    // The staff issuer's keys, fetched while the server starts: the log says at once whether the
    // issuer answers, and the first staff request does not wait for them.
    if let Some(issuer) = state.oidc.clone() {
        tokio::spawn(async move { issuer.refresh().await });
    }
    let listener = tokio::net::TcpListener::bind(&config.addr)
        .await
        .with_context(|| format!("binding {}", config.addr))?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    // FITORDER_METRICS_ADDR: `/metrics`, `/healthz` and `/readyz` on a listener of their own
    // (outside development mode the API port serves `/metrics` only with FITORDER_METRICS_TOKEN).
    let (ops_stop_tx, mut ops_stop_rx) = tokio::sync::watch::channel(false);
    let ops = match &config.metrics_addr {
        Some(addr) => {
            let ops_listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr} (FITORDER_METRICS_ADDR)"))?;
            tracing::info!(addr = %ops_listener.local_addr()?, "metrics and health listening");
            let limits = crate::http::ServeLimits::from_config(&config);
            let router = crate::http::ops_router(state.clone());
            Some(tokio::spawn(async move {
                let stopped = async move {
                    let _ = ops_stop_rx.changed().await;
                };
                crate::http::serve_with(ops_listener, router, limits, stopped).await
            }))
        }
        None => None,
    };
    let limits = crate::http::ServeLimits::from_config(&config);
    crate::http::serve_with(listener, crate::http::router(state), limits, shutdown).await?;
    let _ = ops_stop_tx.send(true);
    if let Some(ops) = ops {
        let _ = ops.await;
    }
    for task in background {
        let _ = task.await;
    }
    tracing::info!("stopped");
    Ok(())
}

fn print_dev_banner(
    config: &Config,
    seeded: &crate::dev::seed::Seeded,
    sandbox: Option<&crate::dev::sandbox_server::SandboxProvider>,
) {
    use crate::auth::{issue_token, Role};
    let ttl = std::time::Duration::from_secs(30 * 24 * 3600);
    let admin = issue_token(config.jwt_secret.expose_secret(), Role::Admin, "staff-1", None, ttl);
    let ops = issue_token(config.jwt_secret.expose_secret(), Role::Ops, "ops-1", None, ttl);
    let member = seeded.member_ids.first().map(|m| {
        issue_token(
            config.jwt_secret.expose_secret(),
            Role::Member,
            &m.to_string(),
            None,
            ttl,
        )
    });
    println!();
    println!(
        "fitorder is up (dev mode: demo data {}).",
        if seeded.created { "seeded" } else { "present" }
    );
    println!("  GraphiQL:  http://{}/graphql", config.addr);
    println!("  ops watch: http://{}/ops#token={}", config.addr, ops);
    println!(
        "  JWT secret (FITORDER_JWT_SECRET): {}",
        config.jwt_secret.expose_secret()
    );
    println!("  admin token:  {admin}");
    println!("  ops token:    {ops}");
    if let Some(member) = member {
        println!("  member token: {member}   (member {})", seeded.member_ids[0]);
    }
    println!(
        "  demo stores: {:?}, members: {:?}",
        seeded.store_ids, seeded.member_ids
    );
    println!("  In GraphiQL, set the header {{\"Authorization\": \"Bearer <token>\"}}.");
    if let Some(s) = sandbox {
        if config.sign_in.api_base == crate::dev::sandbox_server::miniprogram::api_base(&s.base_url) {
            println!(
                "  Sign in as a member: {} hands out WeChat codes for SignInWithWechat (no token needed).",
                crate::dev::sandbox_server::miniprogram::sign_in_page(&s.base_url)
            );
        }
        println!("  Provider sandbox (WeChat Pay + Alipay on loopback): {}", s.base_url);
        println!("  Pay an order: run the member's PlaceOrder in GraphiQL (member token), open");
        println!("    payment.qrCode (or payUrl) in a browser: the sandbox cashier. Press Pay; the");
        println!("    signed notification pays the order, and the ops watch shows it live.");
    }
    println!();
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
