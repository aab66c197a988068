//! Configuration from the environment, as the contract's table lists it. Every variable has
//! a default that works on a developer's machine; production sets the secrets.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

pub mod alert_channels;
pub mod oidc;

/// `Debug` is written out below: it never shows a secret (the JWT secret, the APIv3 key, a
/// database password, an alert channel's URL or signing secret).
#[derive(Clone)]
pub struct Config {
    /// `None`: a private PostgreSQL cluster under `./.fitorder/pg`.
    pub database_url: Option<String>,
    pub addr: String,
    /// The base URL providers reach this service at (their `notify_url`), without a trailing `/`.
    pub public_url: String,
    /// Local time (in `timezone`) of the daily reconciliation run.
    pub reconcile_at: chrono::NaiveTime,
    /// The `cargo run` development mode: private cluster, demo data, the provider sandbox.
    pub dev_mode: bool,
    /// Development mode: where the provider sandbox listens.
    pub sandbox_addr: String,
    pub jwt_secret: String,
    /// True when the secret was made up at start (dev mode): tokens are printed then.
    pub jwt_secret_generated: bool,
    pub order_timeout: Duration,
    pub scan_interval: Duration,
    pub retry_base: Duration,
    pub max_attempts: i32,
    pub downstream_timeout: Duration,
    /// Outbox workers per process, and how many due events each claims (and delivers
    /// concurrently) at a time.
    pub outbox_workers: usize,
    pub outbox_batch: i64,
    pub door_access_url: Option<String>,
    pub ai_access_url: Option<String>,
    pub statement_dir: PathBuf,
    pub timezone: chrono_tz::Tz,
    pub wechatpay: WechatPayConfig,
    pub alipay: AlipayConfig,
    /// GraphQL: queries costlier than this are refused before they run.
    pub max_complexity: usize,
    pub max_depth: usize,
    /// Largest request body accepted on any route.
    pub max_body_bytes: usize,
    pub db_pool_size: usize,
    /// Longest a single SQL statement may run.
    pub statement_timeout: Duration,
    /// A direct (session) connection for LISTEN when `database_url` goes through PgBouncer in
    /// transaction pooling; `None`: `database_url`.
    pub listen_database_url: Option<String>,
    /// A streaming replica for the admin console's lists and statistics
    /// (`FITORDER_READ_DATABASE_URL`); `None`: every read goes to `database_url`.
    pub read_database_url: Option<String>,
    /// A replica further behind than this is not read (`FITORDER_READ_MAX_LAG`): the primary is.
    pub read_max_lag: Duration,
    /// Chat groups and webhooks that alerts are sent to (`FITORDER_ALERT_WEBHOOKS`).
    pub alert_channels: Vec<alert_channels::Channel>,
    /// First retry delay of an alert delivery (doubling, ±20 %).
    pub alert_retry_base: Duration,
    /// Attempts of one alert delivery before it is DEAD.
    pub alert_max_attempts: i32,
    /// Requests per minute to one channel (the robots allow about 20).
    pub alert_rate_per_minute: i64,
    /// `fitorder worker` serves `/metrics`, `/healthz` and `/readyz` here when set.
    pub metrics_addr: Option<String>,
    /// GraphQL document bounds (before parsing ends): text size, selections and fragment spreads
    /// with fragments expanded.
    pub max_document_bytes: usize,
    pub max_selections: u64,
    pub max_fragment_spreads: u64,
    /// Lexical tokens a document may have, by who sends it, and how deep its brackets may
    /// nest: measured before it is parsed (`bounds`).
    pub max_document_tokens: crate::bounds::TokenBudget,
    pub max_document_nesting: usize,
    /// WebSocket: how long a connection may wait before `connection_init`, and how many
    /// subscriptions one connection may hold.
    pub ws_init_timeout: Duration,
    pub ws_max_subscriptions: usize,
    /// HTTP: longest wait for a request's headers (also an idle keep-alive connection's
    /// limit) and for its body.
    pub http_header_timeout: Duration,
    pub http_body_timeout: Duration,
    /// How much of an unverified callback's body is kept as evidence.
    pub unverified_callback_bytes: usize,
    /// `FITORDER_PUBLIC_INTROSPECTION=1`: introspection without a token outside development mode.
    pub public_introspection: bool,
    /// `FITORDER_METRICS_TOKEN`: outside development mode, `/metrics` on the API port answers
    /// only `Authorization: Bearer <this>` (unset: not served there; see `metrics_addr`).
    pub metrics_token: Option<String>,
    /// Open HTTP connections of this process, in all and from one peer address.
    pub max_connections: usize,
    pub max_connections_per_addr: usize,
    /// Running GraphQL operations of one token over all its WebSockets.
    pub max_subscriptions_per_token: usize,
    /// Business limits (README "Security", limits of the business): the expiry of an OFFLINE
    /// order a member placed, the WAIT_PAY orders one member may hold, placements per member
    /// and minute.
    pub offline_order_timeout: Duration,
    pub max_open_orders: i64,
    pub place_rate_per_minute: u32,
    /// Unverified callbacks kept in full per source address and minute; beyond that one in
    /// [`UNVERIFIED_SAMPLE_EVERY`] is kept, and at most `unverified_callbacks_per_minute_total`
    /// rows a minute in all.
    pub unverified_callbacks_per_minute: u32,
    pub unverified_callbacks_per_minute_total: u32,
    /// Provider API calls: connecting (`FITORDER_PROVIDER_CONNECT_TIMEOUT`), and the whole
    /// call, answer included (`FITORDER_PROVIDER_TIMEOUT`, the Alipay SDK's read timeout).
    pub provider_connect_timeout: Duration,
    pub provider_timeout: Duration,
    /// The load balancers whose `X-Forwarded-For` is believed (`FITORDER_TRUSTED_PROXIES`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Members signing in from the WeChat mini program, and their sessions.
    pub sign_in: SignInConfig,
    /// Staff tokens from an OpenID Connect issuer (`FITORDER_OIDC_*`); `None`: only HS256.
    pub oidc: Option<oidc::OidcConfig>,
    /// The trusted documents manifest (`FITORDER_TRUSTED_DOCUMENTS`), read and checked at start,
    /// and whom it binds (`FITORDER_TRUSTED_DOCUMENTS_FOR`).
    pub trusted_documents: Option<std::sync::Arc<TrustedDocuments>>,
    pub trusted_documents_for: TrustedDocumentsFor,
}

/// Whom the trusted documents manifest binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrustedDocumentsFor {
    /// Member tokens (and anonymous callers, the member app before sign-in); staff run anything.
    Member,
    /// Every caller.
    All,
}

/// A persisted-documents manifest as GraphQL Code Generator's client preset and Relay write it:
/// a JSON object from a document's id (its SHA-256, hex) to the document's text.
#[derive(Clone, Debug)]
pub struct TrustedDocuments {
    /// (id as written, lower-case, without a `sha256:` prefix; document text)
    pub entries: Vec<(String, String)>,
}

impl TrustedDocuments {
    /// The bounds a manifest's document is held to before it is parsed: a staff document's.
    pub const BOUND: crate::bounds::Shape = crate::bounds::Shape {
        tokens: crate::bounds::TokenBudget::DEFAULT.staff,
        nesting: crate::bounds::DEFAULT_NESTING,
    };

    pub fn from_json(text: &str) -> Result<TrustedDocuments> {
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_str(text).context("not a JSON object from document hash to document text")?;
        let mut entries = Vec::with_capacity(map.len());
        for (id, doc) in map {
            let id = id.trim().to_ascii_lowercase();
            let id = id.strip_prefix("sha256:").unwrap_or(&id).to_string();
            anyhow::ensure!(!id.is_empty(), "a document without a hash");
            if let Some(why) = crate::bounds::graphql_refusal(&doc, Self::BOUND) {
                anyhow::bail!("the document {id}: {why}");
            }
            if let Err(e) = async_graphql::parser::parse_query(&doc) {
                let at = e
                    .positions()
                    .next()
                    .map(|p| format!(" at {}:{}", p.line, p.column))
                    .unwrap_or_default();
                anyhow::bail!("the document {id} does not parse{at}");
            }
            entries.push((id, doc));
        }
        Ok(TrustedDocuments { entries })
    }

    fn load(path: &str) -> Result<TrustedDocuments> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("FITORDER_TRUSTED_DOCUMENTS={path:?} cannot be read"))?;
        TrustedDocuments::from_json(&text).with_context(|| format!("FITORDER_TRUSTED_DOCUMENTS={path:?}"))
    }
}

fn trusted_documents_for(raw: Option<String>) -> Result<TrustedDocumentsFor> {
    match raw.as_deref().map(str::trim) {
        None | Some("member") => Ok(TrustedDocumentsFor::Member),
        Some("all") => Ok(TrustedDocumentsFor::All),
        Some(other) => anyhow::bail!("FITORDER_TRUSTED_DOCUMENTS_FOR={other:?} is neither member nor all"),
    }
}

/// Members' sign-in (`signInWithWechat`, `refreshSession`, `signOut`).
#[derive(Clone)]
pub struct SignInConfig {
    /// The mini program's appid and AppSecret (`WECHAT_MINIPROGRAM_APP_ID`, `…_SECRET`).
    pub app_id: Option<String>,
    pub secret: Option<String>,
    /// WeChat's mini-program API (`WECHAT_API_BASE`).
    pub api_base: String,
    pub access_token_ttl: Duration,
    pub refresh_token_ttl: Duration,
    /// Sign-in mutations per client address, and sign-ins per openid, per minute.
    pub rate_per_address: u32,
    pub rate_per_openid: u32,
}

pub const WECHAT_API_BASE: &str = "https://api.weixin.qq.com";

impl Default for SignInConfig {
    fn default() -> Self {
        SignInConfig {
            app_id: None,
            secret: None,
            api_base: WECHAT_API_BASE.into(),
            access_token_ttl: Duration::from_secs(2 * 3600),
            refresh_token_ttl: Duration::from_secs(30 * 24 * 3600),
            rate_per_address: 30,
            rate_per_openid: 10,
        }
    }
}

impl std::fmt::Debug for SignInConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let SignInConfig {
            app_id,
            secret,
            api_base,
            access_token_ttl,
            refresh_token_ttl,
            rate_per_address,
            rate_per_openid,
        } = self;
        f.debug_struct("SignInConfig")
            .field("app_id", app_id)
            .field("secret", &secret.as_ref().map(|_| REDACTED))
            .field("api_base", api_base)
            .field("access_token_ttl", access_token_ttl)
            .field("refresh_token_ttl", refresh_token_ttl)
            .field("rate_per_address", rate_per_address)
            .field("rate_per_openid", rate_per_openid)
            .finish()
    }
}

/// Beyond the per-address limit, one unverified callback in this many is kept as a sample.
pub const UNVERIFIED_SAMPLE_EVERY: u64 = 100;

#[derive(Clone)]
pub struct WechatPayConfig {
    pub mch_id: Option<String>,
    /// The appid JSAPI, Native and H5 trades are made under (mini program or official account).
    pub app_id: Option<String>,
    /// The mobile app's appid, for `WECHAT_APP` trades (`WECHATPAY_MOBILE_APP_ID`); None: `app_id`.
    pub mobile_app_id: Option<String>,
    pub apiv3_key: Option<String>,
    /// The merchant's API private key (PEM) and its certificate serial: sign every call.
    pub merchant_private_key: Option<PathBuf>,
    pub merchant_serial: Option<String>,
    /// The 微信支付公钥 (PEM) and its `PUB_KEY_ID_…`; unset: platform certificates are downloaded.
    pub platform_public_key: Option<PathBuf>,
    pub public_key_id: Option<String>,
    pub api_base: String,
}

pub const WECHATPAY_API_BASE: &str = "https://api.mch.weixin.qq.com";
pub const ALIPAY_API_BASE: &str = "https://openapi.alipay.com/gateway.do";

impl Default for WechatPayConfig {
    fn default() -> Self {
        WechatPayConfig {
            mch_id: None,
            app_id: None,
            mobile_app_id: None,
            apiv3_key: None,
            merchant_private_key: None,
            merchant_serial: None,
            platform_public_key: None,
            public_key_id: None,
            api_base: WECHATPAY_API_BASE.into(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct AlipayConfig {
    pub app_id: Option<String>,
    /// The app's private key (PEM): signs every gateway request and order string.
    pub app_private_key: Option<PathBuf>,
    /// Public-key mode: the Alipay public key (PEM or bare base64).
    pub public_key: Option<PathBuf>,
    /// Certificate mode: the app certificate, the Alipay public-key certificate, the root certificate.
    pub app_cert: Option<PathBuf>,
    pub public_cert: Option<PathBuf>,
    pub root_cert: Option<PathBuf>,
    pub api_base: String,
    /// The merchant's own seller id (`2088…`, `ALIPAY_SELLER_ID`): a notification naming
    /// another seller is refused. Unset: the seller is not checked (the app id still is).
    pub seller_id: Option<String>,
}

impl Default for AlipayConfig {
    fn default() -> Self {
        AlipayConfig {
            app_id: None,
            app_private_key: None,
            public_key: None,
            app_cert: None,
            public_cert: None,
            root_cert: None,
            api_base: ALIPAY_API_BASE.into(),
            seller_id: None,
        }
    }
}

/// Lines printed by `fitorder --help`: every variable, its default and meaning.
pub const ENV_HELP: &str = "\
Environment:
  DATABASE_URL                   PostgreSQL to use (default: private cluster under ./.fitorder/pg)
  FITORDER_ADDR                  listen address (default 127.0.0.1:8080)
  FITORDER_JWT_SECRET            HS256 secret (default: random, printed with dev tokens)
  FITORDER_ORDER_TIMEOUT         online order expiry, humantime (default 15m)
  FITORDER_SCAN_INTERVAL         fallback expiry scan period (default 60s)
  FITORDER_RETRY_BASE            first compensation retry delay (default 30s)
  FITORDER_MAX_ATTEMPTS          attempts before DEAD (default 5)
  FITORDER_DOWNSTREAM_TIMEOUT    per downstream call (default 3s)
  FITORDER_DOOR_ACCESS_URL       door access endpoint (unset: simulator)
  FITORDER_AI_ACCESS_URL         AI device endpoint (unset: simulator)
  FITORDER_STATEMENT_DIR         where bills are read (default ./statements)
  FITORDER_TIMEZONE              business day timezone (default Asia/Shanghai)
  FITORDER_MAX_COMPLEXITY        GraphQL complexity limit (default 20000)
  FITORDER_MAX_BODY_BYTES        request body limit (default 1048576)
  FITORDER_DB_POOL_SIZE          connections per process (default 16)
  FITORDER_STATEMENT_TIMEOUT     longest SQL statement (default 60s)
  FITORDER_LISTEN_DATABASE_URL   direct PostgreSQL for LISTEN behind PgBouncer (default DATABASE_URL)
  FITORDER_READ_DATABASE_URL     a streaming replica for the admin console's lists and statistics (default: none)
  FITORDER_READ_MAX_LAG          a replica further behind is not read, the primary is (default 5s)
  FITORDER_ALERT_WEBHOOKS        alert channels: [wecom:|dingtalk:|feishu:|webhook:]URL[#SECRET], comma-separated
  FITORDER_ALERT_RETRY_BASE      first alert retry delay (default 5s)
  FITORDER_ALERT_MAX_ATTEMPTS    alert attempts before DEAD (default 8)
  FITORDER_ALERT_RATE            requests per minute to one channel (default 20)
  FITORDER_METRICS_ADDR          `fitorder worker`: serve /metrics, /healthz, /readyz here (default: none)
  FITORDER_LOG_FORMAT            json or text (default: json when standard output is not a terminal)
  FITORDER_PUBLIC_URL            base URL providers reach us at, and alerts link to (default http://$FITORDER_ADDR)
  FITORDER_RECONCILE_AT          local time of the daily reconciliation (default 10:30)
  FITORDER_SANDBOX_ADDR          development mode: the provider sandbox's address (default 127.0.0.1:8081)
  WeChat Pay, configured whole or not at all:
    WECHATPAY_MCH_ID, WECHATPAY_APP_ID, WECHATPAY_APIV3_KEY,
    WECHATPAY_MCH_PRIVATE_KEY (path), WECHATPAY_MCH_SERIAL,
    WECHATPAY_PLATFORM_PUBLIC_KEY (path) + WECHATPAY_PUBLIC_KEY_ID, or neither (certificates downloaded),
    WECHATPAY_API_BASE (default https://api.mch.weixin.qq.com)
  Alipay, configured whole or not at all:
    ALIPAY_APP_ID, ALIPAY_APP_PRIVATE_KEY (path),
    ALIPAY_PUBLIC_KEY (path) or ALIPAY_APP_CERT + ALIPAY_PUBLIC_CERT + ALIPAY_ROOT_CERT (paths),
    ALIPAY_API_BASE (default https://openapi.alipay.com/gateway.do)
  FITORDER_MAX_DOCUMENT_BYTES    longest GraphQL document (default 65536)
  FITORDER_MAX_SELECTIONS        GraphQL selections, fragments expanded (default 3000)
  FITORDER_MAX_FRAGMENT_SPREADS  GraphQL fragment spreads, expanded (default 500)
  FITORDER_WS_INIT_TIMEOUT       WebSocket wait for connection_init (default 10s)
  FITORDER_WS_MAX_SUBSCRIPTIONS  subscriptions per WebSocket (default 100)
  FITORDER_HTTP_HEADER_TIMEOUT   wait for request headers / idle keep-alive (default 10s)
  FITORDER_HTTP_BODY_TIMEOUT     wait for a request body (default 30s)
  FITORDER_UNVERIFIED_CALLBACK_BYTES  body kept of an unverified callback (default 4096)
  FITORDER_PUBLIC_INTROSPECTION  1: introspection without a token outside development mode (default unset)
  FITORDER_METRICS_TOKEN         bearer token for /metrics on the API port outside development mode (default: not served there)
  FITORDER_MAX_CONNECTIONS       open HTTP connections per process (default 4096)
  FITORDER_MAX_CONNECTIONS_PER_ADDR  open HTTP connections from one peer address (default 256)
  FITORDER_MAX_SUBSCRIPTIONS_PER_TOKEN  running WebSocket operations of one token, all connections (default 200)
  FITORDER_OFFLINE_ORDER_TIMEOUT expiry of an OFFLINE order a member placed (default 24h)
  FITORDER_MAX_OPEN_ORDERS       WAIT_PAY orders one member may hold at once (default 5)
  FITORDER_PLACE_RATE            orders one member may place per minute (default 20)
  FITORDER_UNVERIFIED_CALLBACKS_PER_MINUTE  unverified callbacks kept whole per address and minute (default 20)
  FITORDER_UNVERIFIED_CALLBACKS_TOTAL_PER_MINUTE  unverified callbacks kept per minute in all (default 600)
  ALIPAY_SELLER_ID               Alipay: our seller id (2088…); notifications naming another are refused
  FITORDER_PROVIDER_CONNECT_TIMEOUT  connecting to a provider API (default 3s)
  FITORDER_PROVIDER_TIMEOUT      a whole provider call (default 15s)
  FITORDER_TRUSTED_PROXIES       load balancers (IPs or CIDRs, comma-separated) whose X-Forwarded-For is believed
  WECHATPAY_MOBILE_APP_ID        the mobile app's appid for WECHAT_APP (default WECHATPAY_APP_ID)
  Member sign-in from the WeChat mini program:
    WECHAT_MINIPROGRAM_APP_ID, WECHAT_MINIPROGRAM_SECRET (both or neither),
    WECHAT_API_BASE (default https://api.weixin.qq.com),
    FITORDER_ACCESS_TOKEN_TTL (default 2h), FITORDER_REFRESH_TOKEN_TTL (default 30d),
    FITORDER_SIGNIN_RATE (sign-in calls per minute per client address, default 30),
    FITORDER_SIGNIN_RATE_PER_OPENID (sign-ins per minute per WeChat account, default 10)
  FITORDER_OIDC_ISSUER, FITORDER_OIDC_AUDIENCE  staff tokens (RS256/ES256) from this OpenID Connect issuer, for this audience
  FITORDER_OIDC_ROLE_CLAIM, FITORDER_OIDC_STORES_CLAIM  their claims naming role and stores (default role, stores)
  FITORDER_TRUSTED_DOCUMENTS     persisted-documents manifest: JSON object from SHA-256 to document (default: none)
  FITORDER_TRUSTED_DOCUMENTS_FOR whom the manifest binds: member or all (default member)
";

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn duration(name: &str, default: &str) -> Result<Duration> {
    let raw = var(name).unwrap_or_else(|| default.to_string());
    humantime::parse_duration(&raw).with_context(|| format!("{name}={raw:?} is not a duration like 15m or 2s"))
}

fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match var(name) {
        None => Ok(default),
        Some(raw) => raw
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={raw:?} is not a number")),
    }
}

impl Config {
    pub fn from_env() -> Result<Config> {
        let (jwt_secret, jwt_secret_generated) = match var("FITORDER_JWT_SECRET") {
            Some(s) => (s, false),
            None => (dev_secret(), true),
        };
        let tz_name = var("FITORDER_TIMEZONE").unwrap_or_else(|| "Asia/Shanghai".into());
        let timezone = tz_name
            .parse::<chrono_tz::Tz>()
            .map_err(|_| anyhow::anyhow!("FITORDER_TIMEZONE={tz_name:?} is not an IANA time zone"))?;
        let max_attempts: i32 = number("FITORDER_MAX_ATTEMPTS", 5)?;
        let addr = var("FITORDER_ADDR").unwrap_or_else(|| "127.0.0.1:8080".into());
        let reconcile_raw = var("FITORDER_RECONCILE_AT").unwrap_or_else(|| "10:30".into());
        let reconcile_at = chrono::NaiveTime::parse_from_str(&reconcile_raw, "%H:%M")
            .map_err(|_| anyhow::anyhow!("FITORDER_RECONCILE_AT={reconcile_raw:?} is not a time like 10:30"))?;
        anyhow::ensure!(max_attempts >= 1, "FITORDER_MAX_ATTEMPTS must be at least 1");
        Ok(Config {
            database_url: var("DATABASE_URL"),
            jwt_secret,
            jwt_secret_generated,
            order_timeout: duration("FITORDER_ORDER_TIMEOUT", "15m")?,
            scan_interval: duration("FITORDER_SCAN_INTERVAL", "60s")?,
            retry_base: duration("FITORDER_RETRY_BASE", "30s")?,
            max_attempts,
            downstream_timeout: duration("FITORDER_DOWNSTREAM_TIMEOUT", "3s")?,
            outbox_workers: number::<usize>("FITORDER_OUTBOX_WORKERS", 2)?.clamp(1, 64),
            outbox_batch: number::<i64>("FITORDER_OUTBOX_BATCH", 64)?.clamp(1, 1000),
            door_access_url: var("FITORDER_DOOR_ACCESS_URL"),
            ai_access_url: var("FITORDER_AI_ACCESS_URL"),
            statement_dir: var("FITORDER_STATEMENT_DIR")
                .unwrap_or_else(|| "./statements".into())
                .into(),
            timezone,
            public_url: var("FITORDER_PUBLIC_URL")
                .unwrap_or_else(|| format!("http://{addr}"))
                .trim_end_matches('/')
                .to_string(),
            addr,
            reconcile_at,
            dev_mode: false,
            sandbox_addr: var("FITORDER_SANDBOX_ADDR").unwrap_or_else(|| "127.0.0.1:8081".into()),
            wechatpay: WechatPayConfig {
                mch_id: var("WECHATPAY_MCH_ID"),
                app_id: var("WECHATPAY_APP_ID"),
                mobile_app_id: var("WECHATPAY_MOBILE_APP_ID"),
                apiv3_key: var("WECHATPAY_APIV3_KEY"),
                merchant_private_key: var("WECHATPAY_MCH_PRIVATE_KEY").map(PathBuf::from),
                merchant_serial: var("WECHATPAY_MCH_SERIAL"),
                platform_public_key: var("WECHATPAY_PLATFORM_PUBLIC_KEY").map(PathBuf::from),
                public_key_id: var("WECHATPAY_PUBLIC_KEY_ID"),
                api_base: var("WECHATPAY_API_BASE").unwrap_or_else(|| WECHATPAY_API_BASE.into()),
            },
            alipay: AlipayConfig {
                app_id: var("ALIPAY_APP_ID"),
                app_private_key: var("ALIPAY_APP_PRIVATE_KEY").map(PathBuf::from),
                public_key: var("ALIPAY_PUBLIC_KEY").map(PathBuf::from),
                app_cert: var("ALIPAY_APP_CERT").map(PathBuf::from),
                public_cert: var("ALIPAY_PUBLIC_CERT").map(PathBuf::from),
                root_cert: var("ALIPAY_ROOT_CERT").map(PathBuf::from),
                api_base: var("ALIPAY_API_BASE").unwrap_or_else(|| ALIPAY_API_BASE.into()),
                seller_id: var("ALIPAY_SELLER_ID"),
            },
            max_complexity: number("FITORDER_MAX_COMPLEXITY", 20_000)?,
            max_depth: 12,
            max_body_bytes: number("FITORDER_MAX_BODY_BYTES", 1 << 20)?,
            db_pool_size: number("FITORDER_DB_POOL_SIZE", 16)?,
            statement_timeout: duration("FITORDER_STATEMENT_TIMEOUT", "60s")?,
            listen_database_url: var("FITORDER_LISTEN_DATABASE_URL"),
            read_database_url: var("FITORDER_READ_DATABASE_URL"),
            read_max_lag: duration("FITORDER_READ_MAX_LAG", "5s")?,
            alert_channels: alert_channels::parse_list(&var("FITORDER_ALERT_WEBHOOKS").unwrap_or_default())
                .map_err(|e| anyhow::anyhow!("FITORDER_ALERT_WEBHOOKS: {e}"))?,
            alert_retry_base: duration("FITORDER_ALERT_RETRY_BASE", "5s")?,
            alert_max_attempts: number("FITORDER_ALERT_MAX_ATTEMPTS", 8)?.max(1),
            alert_rate_per_minute: number("FITORDER_ALERT_RATE", 20)?.max(1),
            metrics_addr: var("FITORDER_METRICS_ADDR"),
            max_document_bytes: number("FITORDER_MAX_DOCUMENT_BYTES", 65_536)?,
            max_selections: number("FITORDER_MAX_SELECTIONS", 3_000)?,
            max_fragment_spreads: number("FITORDER_MAX_FRAGMENT_SPREADS", 500)?,
            max_document_tokens: crate::bounds::TokenBudget {
                anonymous: number(
                    "FITORDER_MAX_DOCUMENT_TOKENS_ANONYMOUS",
                    crate::bounds::TokenBudget::DEFAULT.anonymous,
                )?,
                member: number(
                    "FITORDER_MAX_DOCUMENT_TOKENS_MEMBER",
                    crate::bounds::TokenBudget::DEFAULT.member,
                )?,
                staff: number(
                    "FITORDER_MAX_DOCUMENT_TOKENS",
                    crate::bounds::TokenBudget::DEFAULT.staff,
                )?,
            },
            max_document_nesting: number("FITORDER_MAX_DOCUMENT_NESTING", crate::bounds::DEFAULT_NESTING)?
                .clamp(1, 128),
            ws_init_timeout: duration("FITORDER_WS_INIT_TIMEOUT", "10s")?,
            ws_max_subscriptions: number("FITORDER_WS_MAX_SUBSCRIPTIONS", 100)?,
            http_header_timeout: duration("FITORDER_HTTP_HEADER_TIMEOUT", "10s")?,
            http_body_timeout: duration("FITORDER_HTTP_BODY_TIMEOUT", "30s")?,
            unverified_callback_bytes: number("FITORDER_UNVERIFIED_CALLBACK_BYTES", 4_096)?,
            public_introspection: var("FITORDER_PUBLIC_INTROSPECTION").is_some_and(|v| v.trim() == "1"),
            metrics_token: var("FITORDER_METRICS_TOKEN"),
            max_connections: number::<usize>("FITORDER_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS)?.max(1),
            max_connections_per_addr: number::<usize>(
                "FITORDER_MAX_CONNECTIONS_PER_ADDR",
                DEFAULT_MAX_CONNECTIONS_PER_ADDR,
            )?
            .max(1),
            max_subscriptions_per_token: number::<usize>("FITORDER_MAX_SUBSCRIPTIONS_PER_TOKEN", 200)?.max(1),
            offline_order_timeout: duration("FITORDER_OFFLINE_ORDER_TIMEOUT", "24h")?,
            max_open_orders: number::<i64>("FITORDER_MAX_OPEN_ORDERS", 5)?.max(1),
            place_rate_per_minute: number::<u32>("FITORDER_PLACE_RATE", 20)?.max(1),
            unverified_callbacks_per_minute: number::<u32>("FITORDER_UNVERIFIED_CALLBACKS_PER_MINUTE", 20)?,
            unverified_callbacks_per_minute_total: number::<u32>(
                "FITORDER_UNVERIFIED_CALLBACKS_TOTAL_PER_MINUTE",
                600,
            )?,
            provider_connect_timeout: duration("FITORDER_PROVIDER_CONNECT_TIMEOUT", "3s")?,
            provider_timeout: duration("FITORDER_PROVIDER_TIMEOUT", "15s")?,
            trusted_proxies: parse_trusted_proxies(&var("FITORDER_TRUSTED_PROXIES").unwrap_or_default())
                .map_err(|e| anyhow::anyhow!("FITORDER_TRUSTED_PROXIES: {e}"))?,
            sign_in: sign_in_from_env()?,
            oidc: oidc::OidcConfig::from_env(var)?,
            trusted_documents: var("FITORDER_TRUSTED_DOCUMENTS")
                .map(|p| TrustedDocuments::load(&p).map(std::sync::Arc::new))
                .transpose()?,
            trusted_documents_for: trusted_documents_for(var("FITORDER_TRUSTED_DOCUMENTS_FOR"))?,
        })
    }

    /// A configuration for tests: short, deterministic, no providers.
    pub fn for_tests(database_url: String) -> Config {
        Config {
            database_url: Some(database_url),
            addr: "127.0.0.1:0".into(),
            public_url: "http://127.0.0.1:0".into(),
            reconcile_at: chrono::NaiveTime::from_hms_opt(10, 30, 0).expect("a valid time"),
            dev_mode: false,
            sandbox_addr: "127.0.0.1:0".into(),
            jwt_secret: "test-secret-not-for-production-0123456789".into(),
            jwt_secret_generated: false,
            order_timeout: Duration::from_secs(15 * 60),
            scan_interval: Duration::from_secs(60),
            retry_base: Duration::from_secs(30),
            max_attempts: 5,
            downstream_timeout: Duration::from_secs(3),
            outbox_workers: 2,
            outbox_batch: 64,
            door_access_url: None,
            ai_access_url: None,
            statement_dir: "./statements".into(),
            timezone: chrono_tz::Asia::Shanghai,
            wechatpay: WechatPayConfig::default(),
            alipay: AlipayConfig::default(),
            max_complexity: 20_000,
            max_depth: 12,
            max_body_bytes: 1 << 20,
            db_pool_size: 8,
            statement_timeout: Duration::from_secs(60),
            listen_database_url: None,
            read_database_url: None,
            read_max_lag: Duration::from_secs(5),
            alert_channels: vec![],
            alert_retry_base: Duration::from_secs(5),
            alert_max_attempts: 8,
            alert_rate_per_minute: 20,
            metrics_addr: None,
            max_document_bytes: 65_536,
            max_selections: 3_000,
            max_fragment_spreads: 500,
            max_document_tokens: crate::bounds::TokenBudget::DEFAULT,
            max_document_nesting: crate::bounds::DEFAULT_NESTING,
            ws_init_timeout: Duration::from_secs(10),
            ws_max_subscriptions: 100,
            http_header_timeout: Duration::from_secs(10),
            http_body_timeout: Duration::from_secs(30),
            unverified_callback_bytes: 4_096,
            public_introspection: false,
            metrics_token: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_addr: DEFAULT_MAX_CONNECTIONS_PER_ADDR,
            max_subscriptions_per_token: 200,
            // Tests place hundreds of orders for one member: the tests of these limits set them.
            offline_order_timeout: Duration::from_secs(24 * 3600),
            max_open_orders: 100_000,
            place_rate_per_minute: 100_000,
            unverified_callbacks_per_minute: 20,
            unverified_callbacks_per_minute_total: 600,
            provider_connect_timeout: Duration::from_secs(3),
            provider_timeout: Duration::from_secs(15),
            trusted_proxies: vec![],
            sign_in: SignInConfig::default(),
            oidc: None,
            trusted_documents: None,
            trusted_documents_for: TrustedDocumentsFor::Member,
        }
    }

    /// Where the ops page is, for links in alerts.
    pub fn ops_url(&self) -> String {
        format!("{}/ops", self.public_url.trim_end_matches('/'))
    }
}

fn sign_in_from_env() -> Result<SignInConfig> {
    let app_id = var("WECHAT_MINIPROGRAM_APP_ID");
    let secret = var("WECHAT_MINIPROGRAM_SECRET");
    anyhow::ensure!(
        app_id.is_some() == secret.is_some(),
        "WECHAT_MINIPROGRAM_APP_ID and WECHAT_MINIPROGRAM_SECRET are set together or not at all (missing: {})",
        if app_id.is_none() {
            "WECHAT_MINIPROGRAM_APP_ID"
        } else {
            "WECHAT_MINIPROGRAM_SECRET"
        }
    );
    let access_token_ttl = duration("FITORDER_ACCESS_TOKEN_TTL", "2h")?;
    let refresh_token_ttl = duration("FITORDER_REFRESH_TOKEN_TTL", "30d")?;
    anyhow::ensure!(
        access_token_ttl >= Duration::from_secs(60) && refresh_token_ttl > access_token_ttl,
        "FITORDER_ACCESS_TOKEN_TTL must be at least 1m and FITORDER_REFRESH_TOKEN_TTL longer than it"
    );
    Ok(SignInConfig {
        app_id,
        secret,
        api_base: var("WECHAT_API_BASE").unwrap_or_else(|| WECHAT_API_BASE.into()),
        access_token_ttl,
        refresh_token_ttl,
        rate_per_address: number::<u32>("FITORDER_SIGNIN_RATE", 30)?.max(1),
        rate_per_openid: number::<u32>("FITORDER_SIGNIN_RATE_PER_OPENID", 10)?.max(1),
    })
}

/// Without FITORDER_JWT_SECRET a random secret is made once and kept in
/// `./.fitorder/jwt-secret`, so that `fitorder token` in another terminal signs tokens the
/// running dev server accepts, and tokens survive a restart. Reading the configuration only
/// reads the file: it is written by [`Config::keep_dev_secret`] once the start is known to be
/// development mode (a production start without a secret stops and leaves nothing behind).
fn dev_secret() -> String {
    let path = std::path::Path::new(DEV_SECRET_PATH);
    if let Ok(s) = std::fs::read_to_string(path) {
        if s.trim().len() >= 32 {
            return s.trim().to_string();
        }
    }
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

const DEV_SECRET_PATH: &str = ".fitorder/jwt-secret";

impl Config {
    /// Development mode: keeps the made-up secret in `./.fitorder/jwt-secret` (see `dev_secret`).
    pub fn keep_dev_secret(&self) {
        if !self.jwt_secret_generated {
            return;
        }
        let path = std::path::Path::new(DEV_SECRET_PATH);
        if std::fs::read_to_string(path).is_ok_and(|s| s.trim() == self.jwt_secret) {
            return;
        }
        if std::fs::create_dir_all(".fitorder").is_ok() {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
            {
                let _ = f.write_all(self.jwt_secret.as_bytes());
            }
        }
    }
}

/// `FITORDER_MAX_CONNECTIONS` and `FITORDER_MAX_CONNECTIONS_PER_ADDR` when unset.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDR: usize = 256;

/// The shortest `FITORDER_JWT_SECRET` accepted outside development mode, in bytes.
pub const MIN_JWT_SECRET_BYTES: usize = 32;
/// The fewest different bytes it must contain (`aaaa…` or `0101…` is no secret).
pub const MIN_JWT_SECRET_DISTINCT: usize = 8;

/// Outside development mode a token signed with a guessable secret is as good as any: a secret
/// shorter than [`MIN_JWT_SECRET_BYTES`] or with fewer than [`MIN_JWT_SECRET_DISTINCT`]
/// different bytes stops the start, naming the setting (never showing the secret).
pub fn check_jwt_secret(secret: &str) -> Result<()> {
    let bytes = secret.as_bytes();
    anyhow::ensure!(
        bytes.len() >= MIN_JWT_SECRET_BYTES,
        "FITORDER_JWT_SECRET is too short: {} bytes, at least {MIN_JWT_SECRET_BYTES} are needed outside \
         development mode (e.g. `openssl rand -hex 32`)",
        bytes.len()
    );
    anyhow::ensure!(
        !secret.trim().to_ascii_lowercase().starts_with("change-me"),
        "FITORDER_JWT_SECRET is still the example's placeholder: set a random one (e.g. `openssl rand -hex 32`)"
    );
    let distinct = bytes.iter().collect::<std::collections::HashSet<_>>().len();
    anyhow::ensure!(
        distinct >= MIN_JWT_SECRET_DISTINCT,
        "FITORDER_JWT_SECRET is too simple: {distinct} different characters, at least \
         {MIN_JWT_SECRET_DISTINCT} are needed outside development mode (e.g. `openssl rand -hex 32`)"
    );
    Ok(())
}

/// Reads `FITORDER_TRUSTED_PROXIES`: comma-separated IPs or CIDRs (`10.0.0.0/8, 192.168.1.7`).
pub fn parse_trusted_proxies(text: &str) -> Result<Vec<ipnet::IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<ipnet::IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| format!("{s:?} is neither an IP address nor a CIDR"))
        })
        .collect()
}

impl Config {
    /// Outside development mode the providers must reach `FITORDER_PUBLIC_URL` over `https://`
    /// (their `notify_url`); a loopback address is let through, for tests on one machine.
    pub fn check_public_url(&self) -> Result<()> {
        if self.dev_mode {
            return Ok(());
        }
        let url = self.public_url.to_ascii_lowercase();
        if url.starts_with("https://") {
            return Ok(());
        }
        let host = url
            .strip_prefix("http://")
            .map(|rest| {
                let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
                let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
                if let Some(v6) = authority.strip_prefix('[') {
                    v6.split(']').next().unwrap_or_default().to_string()
                } else {
                    authority.split(':').next().unwrap_or_default().to_string()
                }
            })
            .unwrap_or_default();
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        anyhow::ensure!(
            loopback,
            "FITORDER_PUBLIC_URL={:?} is not https://: the payment providers send notifications to it (their \
             notify_url) and refuse or expose plain HTTP; set FITORDER_PUBLIC_URL to this service's https:// \
             address (plain http:// is allowed only for a loopback address, or in development mode)",
            self.public_url
        );
        Ok(())
    }
}

/// Shown instead of a secret in `Debug`.
const REDACTED: &str = "<redacted>";

/// A URL with its password (`scheme://user:PASSWORD@host…`) replaced, and a libpq key/value
/// string's `password=…` too; anything else as it is.
pub fn redact_url(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        if let Some((userinfo, host)) = authority.rsplit_once('@') {
            if let Some((user, _password)) = userinfo.split_once(':') {
                return format!("{scheme}://{user}:{REDACTED}@{host}{}", redact_query_password(tail));
            }
        }
        return format!("{scheme}://{authority}{}", redact_query_password(tail));
    }
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `?password=…` (PostgreSQL URLs take it as a parameter too).
fn redact_query_password(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let query = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={REDACTED}"),
            _ => kv.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    format!("{path}?{query}")
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured whole: a field added to `Config` does not compile until it is listed here
        // (and someone decided whether it is a secret).
        let Config {
            database_url,
            addr,
            public_url,
            reconcile_at,
            dev_mode,
            sandbox_addr,
            jwt_secret: _,
            jwt_secret_generated,
            order_timeout,
            scan_interval,
            retry_base,
            max_attempts,
            downstream_timeout,
            outbox_workers,
            outbox_batch,
            door_access_url,
            ai_access_url,
            statement_dir,
            timezone,
            wechatpay,
            alipay,
            max_complexity,
            max_depth,
            max_body_bytes,
            db_pool_size,
            statement_timeout,
            listen_database_url,
            read_database_url,
            read_max_lag,
            alert_channels,
            alert_retry_base,
            alert_max_attempts,
            alert_rate_per_minute,
            metrics_addr,
            max_document_bytes,
            max_selections,
            max_fragment_spreads,
            max_document_tokens,
            max_document_nesting,
            ws_init_timeout,
            ws_max_subscriptions,
            http_header_timeout,
            http_body_timeout,
            unverified_callback_bytes,
            public_introspection,
            metrics_token,
            max_connections,
            max_connections_per_addr,
            max_subscriptions_per_token,
            offline_order_timeout,
            max_open_orders,
            place_rate_per_minute,
            unverified_callbacks_per_minute,
            unverified_callbacks_per_minute_total,
            provider_connect_timeout,
            provider_timeout,
            trusted_proxies,
            sign_in,
            oidc,
            trusted_documents,
            trusted_documents_for,
        } = self;
        let url = |u: &Option<String>| u.as_deref().map(redact_url);
        f.debug_struct("Config")
            .field("database_url", &url(database_url))
            .field("addr", addr)
            .field("public_url", &redact_url(public_url))
            .field("reconcile_at", reconcile_at)
            .field("dev_mode", dev_mode)
            .field("sandbox_addr", sandbox_addr)
            .field("jwt_secret", &REDACTED)
            .field("jwt_secret_generated", jwt_secret_generated)
            .field("order_timeout", order_timeout)
            .field("scan_interval", scan_interval)
            .field("retry_base", retry_base)
            .field("max_attempts", max_attempts)
            .field("downstream_timeout", downstream_timeout)
            .field("outbox_workers", outbox_workers)
            .field("outbox_batch", outbox_batch)
            .field("door_access_url", &url(door_access_url))
            .field("ai_access_url", &url(ai_access_url))
            .field("statement_dir", statement_dir)
            .field("timezone", timezone)
            .field("wechatpay", wechatpay)
            .field("alipay", alipay)
            .field("max_complexity", max_complexity)
            .field("max_depth", max_depth)
            .field("max_body_bytes", max_body_bytes)
            .field("db_pool_size", db_pool_size)
            .field("statement_timeout", statement_timeout)
            .field("listen_database_url", &url(listen_database_url))
            .field("read_database_url", &url(read_database_url))
            .field("read_max_lag", read_max_lag)
            .field("alert_channels", alert_channels)
            .field("alert_retry_base", alert_retry_base)
            .field("alert_max_attempts", alert_max_attempts)
            .field("alert_rate_per_minute", alert_rate_per_minute)
            .field("metrics_addr", metrics_addr)
            .field("max_document_bytes", max_document_bytes)
            .field("max_selections", max_selections)
            .field("max_document_tokens", max_document_tokens)
            .field("max_document_nesting", max_document_nesting)
            .field("max_fragment_spreads", max_fragment_spreads)
            .field("ws_init_timeout", ws_init_timeout)
            .field("ws_max_subscriptions", ws_max_subscriptions)
            .field("http_header_timeout", http_header_timeout)
            .field("http_body_timeout", http_body_timeout)
            .field("unverified_callback_bytes", unverified_callback_bytes)
            .field("public_introspection", public_introspection)
            .field("metrics_token", &metrics_token.as_ref().map(|_| REDACTED))
            .field("max_connections", max_connections)
            .field("max_connections_per_addr", max_connections_per_addr)
            .field("max_subscriptions_per_token", max_subscriptions_per_token)
            .field("offline_order_timeout", offline_order_timeout)
            .field("max_open_orders", max_open_orders)
            .field("place_rate_per_minute", place_rate_per_minute)
            .field("unverified_callbacks_per_minute", unverified_callbacks_per_minute)
            .field(
                "unverified_callbacks_per_minute_total",
                unverified_callbacks_per_minute_total,
            )
            .field("provider_connect_timeout", provider_connect_timeout)
            .field("provider_timeout", provider_timeout)
            .field("trusted_proxies", trusted_proxies)
            .field("sign_in", sign_in)
            .field("oidc", oidc)
            .field(
                "trusted_documents",
                &trusted_documents.as_ref().map(|t| t.entries.len()),
            )
            .field("trusted_documents_for", trusted_documents_for)
            .finish()
    }
}

impl std::fmt::Debug for WechatPayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let WechatPayConfig {
            mch_id,
            app_id,
            mobile_app_id,
            apiv3_key,
            merchant_private_key,
            merchant_serial,
            platform_public_key,
            public_key_id,
            api_base,
        } = self;
        f.debug_struct("WechatPayConfig")
            .field("mch_id", mch_id)
            .field("app_id", app_id)
            .field("mobile_app_id", mobile_app_id)
            .field("apiv3_key", &apiv3_key.as_ref().map(|_| REDACTED))
            // A path to the key, never its text.
            .field("merchant_private_key", merchant_private_key)
            .field("merchant_serial", merchant_serial)
            .field("platform_public_key", platform_public_key)
            .field("public_key_id", public_key_id)
            .field("api_base", api_base)
            .finish()
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let mut c = Config::for_tests("postgres://app:pgPASSWORD1@db.internal:5432/fitorder".into());
        c.jwt_secret = "jwtSECRETvalue".into();
        c.listen_database_url = Some("postgresql://app:pgPASSWORD2@db.internal/fitorder?sslmode=require".into());
        c.read_database_url = Some("postgresql://app:pgPASSWORD3@replica.internal/fitorder".into());
        c.door_access_url = Some("https://svc:doorPASSWORD@door.internal/grant".into());
        c.wechatpay.apiv3_key = Some("APIV3keyVALUE0123456789abcdefghij".into());
        c.sign_in.secret = Some("MINIPROGRAMsecretVALUE".into());
        c.alert_channels = alert_channels::parse_list(
            "dingtalk:https://oapi.dingtalk.com/robot/send?access_token=ROBOTtoken#SECsigning",
        )
        .unwrap();
        let shown = format!("{c:?} {c:#?}");
        for secret in [
            "jwtSECRETvalue",
            "pgPASSWORD1",
            "pgPASSWORD2",
            "pgPASSWORD3",
            "doorPASSWORD",
            "APIV3keyVALUE",
            "MINIPROGRAMsecretVALUE",
            "ROBOTtoken",
            "SECsigning",
        ] {
            assert!(!shown.contains(secret), "{secret} shown: {shown}");
        }
        // What is not secret is still there to read.
        assert!(shown.contains("db.internal:5432/fitorder"), "{shown}");
        assert!(shown.contains("sslmode=require"), "{shown}");
        assert!(shown.contains("app:<redacted>@"), "{shown}");
    }

    #[test]
    fn key_value_connection_strings_lose_their_password() {
        assert_eq!(
            redact_url("host=db user=app password=hunter2 dbname=x"),
            "host=db user=app password=<redacted> dbname=x"
        );
        assert_eq!(
            redact_url("postgres://app@db/x?password=hunter2&sslmode=require"),
            "postgres://app@db/x?password=<redacted>&sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
    }
}

#[cfg(test)]
mod jwt_secret_tests {
    use super::*;

    #[test]
    fn weak_secrets_are_refused_by_name() {
        for (weak, why) in [
            ("a", "too short"),
            ("change-me", "too short"),
            (&"x".repeat(64) as &str, "too simple"),
            ("0101010101010101010101010101010101", "too simple"),
        ] {
            let e = check_jwt_secret(weak).unwrap_err().to_string();
            assert!(e.contains("FITORDER_JWT_SECRET") && e.contains(why), "{weak}: {e}");
            assert!(!e.contains(weak) || weak.len() == 1, "the secret is not shown: {e}");
        }
        assert!(check_jwt_secret("change-me-to-64-random-hex-characters")
            .unwrap_err()
            .to_string()
            .contains("placeholder"));
        check_jwt_secret("3f9a1c7e5b2d4f6a8c0e1b3d5f7a9c2e").unwrap();
    }
}

#[cfg(test)]
mod provider_edge_tests {
    use super::*;

    #[test]
    fn trusted_proxies_parse_as_ips_or_cidrs_and_junk_is_named() {
        assert!(parse_trusted_proxies("").unwrap().is_empty());
        let nets = parse_trusted_proxies(" 10.0.0.0/8 ,192.168.1.7,::1, fd00::/8").unwrap();
        assert_eq!(nets.len(), 4);
        assert!(nets[1].contains(&"192.168.1.7".parse::<std::net::IpAddr>().unwrap()));
        assert!(!nets[1].contains(&"192.168.1.8".parse::<std::net::IpAddr>().unwrap()));
        let e = parse_trusted_proxies("10.0.0.0/8, lb.internal").unwrap_err();
        assert!(e.contains("lb.internal"), "{e}");
        assert!(parse_trusted_proxies("10.0.0.0/33").is_err());
    }

    #[test]
    fn outside_development_mode_the_public_url_must_be_https_or_loopback() {
        let mut c = Config::for_tests("postgres://x".into());
        for ok in [
            "https://pay.studio.example",
            "HTTPS://pay.studio.example:8443/base",
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            c.public_url = ok.into();
            assert!(c.check_public_url().is_ok(), "{ok}");
        }
        for bad in [
            "http://pay.studio.example",
            "http://10.0.0.5:8080",
            "http://127.0.0.1.evil.example",
            "http://localhost@evil.example",
            "ftp://x",
        ] {
            c.public_url = bad.into();
            let e = format!("{:#}", c.check_public_url().unwrap_err());
            assert!(e.contains("FITORDER_PUBLIC_URL"), "{bad}: {e}");
        }
        c.dev_mode = true;
        c.public_url = "http://192.168.1.20:8080".into();
        assert!(c.check_public_url().is_ok());
    }

    #[test]
    fn provider_timeouts_default_to_3s_to_connect_and_15s_a_call() {
        let c = Config::for_tests("postgres://x".into());
        assert_eq!(c.provider_connect_timeout, Duration::from_secs(3));
        assert_eq!(c.provider_timeout, Duration::from_secs(15));
    }
}
