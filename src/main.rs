//! `fitorder`: one binary, several roles. `main` only parses and wires.

use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use fitorder::auth::{issue_token, Role};
use fitorder::config::{Config, ENV_HELP};
use fitorder::server::{self, ServeOptions};

const USAGE: &str = "\
fitorder: the order backend of a chain of AI fitness studios

Usage:
  fitorder [serve] [--no-workers]   API, workers and scheduler (default)
  fitorder worker                   workers and scheduler only
  fitorder migrate                  apply database migrations
  fitorder token --role R --sub S [--stores a,b] [--ttl 1h]
                                    print a JWT (role: member, admin, ops)
  fitorder seed                     demo stores, members, catalog
  fitorder reconcile --provider wechatpay|alipay --date YYYY-MM-DD [--file F]
  fitorder schema                   print the GraphQL schema (SDL)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h" || a == "help") {
        print!("{USAGE}\n{ENV_HELP}");
        return ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=warn,diesel_migrations=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
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
                Some(t) => humantime::parse_duration(&t).with_context(|| format!("--ttl {t:?}"))?,
                None => std::time::Duration::from_secs(3600),
            };
            println!("{}", issue_token(&config.jwt_secret, role, &sub, stores, ttl));
            Ok(())
        }
        "serve" | "worker" | "migrate" | "seed" | "reconcile" => {
            let config = Config::from_env()?;
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
                            let s = fitorder::seed::seed(&mut conn)
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
                    _ => reconcile(config, rest).await,
                }
            })
        }
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}

/// `fitorder reconcile --provider wechatpay|alipay --date YYYY-MM-DD [--file F]`: prints what it
/// does as it goes, and exits non-zero when the run failed.
async fn reconcile(config: Config, rest: &[String]) -> Result<()> {
    use std::io::Write;
    let provider = flag(rest, "--provider").context("--provider wechatpay|alipay is required")?;
    let provider = fitorder::reconciliation::provider_from_cli(&provider)
        .with_context(|| format!("unknown provider {provider:?}"))?;
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
        println!(
            "run {}: {} provider rows, {} local rows, {} matched, {} tickets opened{}",
            run.id,
            run.provider_rows,
            run.local_rows,
            run.matched,
            run.tickets_opened,
            run.error.as_ref().map(|e| format!("; error: {e}")).unwrap_or_default()
        );
        if run.status != "SUCCEEDED" {
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
