//! What every handler shares: the pool and the configuration.

use std::sync::Arc;

use crate::config::Config;
use crate::db::DbPool;
use crate::events::EventHub;
use crate::providers::api::ProviderApi;
use crate::providers::keys::ProviderKeys;

/// Members whose placements one process counts at once (the limiter's memory bound).
const PLACING_KEYS: usize = 100_000;

#[derive(Clone)]
pub struct AppState {
    pub pool: DbPool,
    pub config: Arc<Config>,
    pub keys: Arc<ProviderKeys>,
    /// The configured providers' APIs (one HTTP client for all).
    pub providers: ProviderApi,
    pub events: EventHub,
    /// The database URL, for the few things a pool connection cannot do (COPY, LISTEN).
    pub db_url: Arc<String>,
    /// Connections for raw callback records (asynchronous commit, see `db::evidence_pool`).
    pub evidence: DbPool,
    /// Payment keys this process saw processed lately: which way a notification takes
    /// (`payments::processed_lately`), never whether it is applied.
    pub processed: Arc<crate::providers::seen::Seen>,
    /// Orders placed per member and minute (`FITORDER_PLACE_RATE`).
    pub placing: Arc<crate::ratelimit::RateLimiter>,
    /// Unverified callbacks kept per source address and minute, and in all
    /// (`providers::sampling`).
    pub unverified: Arc<crate::providers::sampling::UnverifiedSampler>,
    /// WeChat's mini-program API, for members signing in (None: not configured).
    pub miniprogram: Option<Arc<crate::miniprogram::MiniProgram>>,
    /// The sign-in mutations' rate limits.
    pub sign_in_limits: Arc<SignInLimits>,
    /// Staff tokens of the OpenID Connect issuer, its keys cached (`None`: not configured).
    pub oidc: Option<Arc<crate::auth::oidc::OidcVerifier>>,
    /// The streaming replica the admin console's lists and statistics read
    /// (`FITORDER_READ_DATABASE_URL`; `None`: every read goes to `pool`). See `graphql::reads`.
    pub replica: Option<Arc<crate::db::replica::Replica>>,
}

/// Sign-ins per client address and per WeChat account, and lookups of untagged (old) refresh
/// tokens per client address (a minute each). Nothing that cannot be a code or a token counts:
/// junk from one address does not use up its neighbours' sign-ins behind the same NAT.
pub struct SignInLimits {
    pub per_address: crate::ratelimit::RateLimiter,
    pub per_openid: crate::ratelimit::RateLimiter,
    pub untagged_per_address: crate::ratelimit::RateLimiter,
}

impl SignInLimits {
    pub fn new(config: &crate::config::SignInConfig) -> SignInLimits {
        let minute = std::time::Duration::from_secs(60);
        SignInLimits {
            per_address: crate::ratelimit::RateLimiter::new(config.rate_per_address, minute, 100_000),
            per_openid: crate::ratelimit::RateLimiter::new(config.rate_per_openid, minute, 100_000),
            untagged_per_address: crate::ratelimit::RateLimiter::new(config.rate_per_address, minute, 100_000),
        }
    }
}

impl AppState {
    /// State without provider keys (their callbacks answer 503) and without live events.
    pub fn new(pool: DbPool, config: Config) -> AppState {
        let url = config.database_url.as_deref().unwrap_or_default().to_string();
        AppState::with_keys(pool, config, ProviderKeys::default(), EventHub::detached(), url)
    }

    pub fn with_keys(pool: DbPool, config: Config, keys: ProviderKeys, events: EventHub, db_url: String) -> AppState {
        // Half as many evidence connections as business ones (at least 4): a provider's
        // redeliveries are answered on them alone, one statement each.
        let evidence_size = (config.db_pool_size / 2).max(4);
        // Behind a transaction pooler (a separate LISTEN URL says so) a session setting would
        // leak to other clients' transactions on the same server connection: evidence then
        // commits synchronously like everything else.
        let evidence = if config.listen_database_url.is_some() {
            crate::db::pool_with(&db_url, evidence_size, config.statement_timeout)
        } else {
            crate::db::evidence_pool(&db_url, evidence_size, config.statement_timeout)
        }
        .expect("a pool is built without connecting");
        let placing = crate::ratelimit::RateLimiter::new(
            config.place_rate_per_minute,
            std::time::Duration::from_secs(60),
            PLACING_KEYS,
        );
        let unverified = crate::providers::sampling::UnverifiedSampler::new(&config);
        let oidc = config.oidc.clone().map(|c| {
            Arc::new(crate::auth::oidc::OidcVerifier::new(c).expect("an HTTP client is built without connecting"))
        });
        let replica = config.read_database_url.as_deref().map(|url| {
            Arc::new(
                crate::db::replica::Replica::new(
                    url,
                    config.db_pool_size,
                    config.statement_timeout,
                    config.read_max_lag,
                )
                .expect("a pool is built without connecting"),
            )
        });
        let config = Arc::new(config);
        let keys = Arc::new(keys);
        events.ended_sessions.set_window(config.sign_in.access_token_ttl);
        let miniprogram = match (&config.sign_in.app_id, &config.sign_in.secret) {
            (Some(app_id), Some(secret)) => Some(Arc::new(crate::miniprogram::MiniProgram::new(
                app_id.clone(),
                crate::config::ExposeSecret::expose_secret(secret).to_string(),
                config.sign_in.api_base.clone(),
                pool.clone(),
            ))),
            _ => None,
        };
        AppState {
            placing: Arc::new(placing),
            unverified: Arc::new(unverified),
            providers: ProviderApi::with_pool(config.clone(), keys.clone(), pool.clone()),
            miniprogram,
            sign_in_limits: Arc::new(SignInLimits::new(&config.sign_in)),
            pool,
            config,
            keys,
            events,
            db_url: Arc::new(db_url),
            evidence,
            processed: Arc::new(crate::providers::seen::Seen::new(crate::providers::seen::KEEP)),
            oidc,
            replica,
        }
    }
}
