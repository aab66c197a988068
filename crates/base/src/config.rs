//! The settings, each defined once: its variable, its flag, its default and what it means are
//! the attributes of its field below (clap's derive). `fitorder --help`, the parsing, the
//! defaults of the tests and `docs/configuration.md`'s table all come from them
//! ([`reference`]; a test fails when the table differs). A setting is added here and nowhere
//! else; a secret is a [`SecretString`] (or a [`SecretUrl`]) and never shown by `Debug`.
//!
//! Every variable has a default that works on a developer's machine; production sets the
//! secrets. A variable that is set but blank counts as unset.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

pub mod alert_channels;
pub mod oidc;
pub mod reference;
mod secrets;
mod trusted_documents;

pub use secrets::{check_jwt_secret, redact_url, SecretUrl, MIN_JWT_SECRET_BYTES, MIN_JWT_SECRET_DISTINCT};
pub use trusted_documents::{TrustedDocuments, TrustedDocumentsFor};
// Every crate reads a secret through these (`secret.expose_secret()`).
pub use secrecy::{ExposeSecret, SecretString};

/// fitorder's configuration. Fields with `#[arg]` are settings; the few without are worked
/// out from them at start ([`Config::resolve`]).
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// PostgreSQL to use. Unset: a private cluster under `./.fitorder/pg`, made with the local
    /// `initdb` (development mode).
    #[arg(id = "database-url", long = "database-url", env = "DATABASE_URL", value_name = "URL", hide_env_values = true, value_parser = secret_url)]
    pub database_url: Option<SecretUrl>,
    /// Listen address.
    #[arg(
        id = "addr",
        long = "addr",
        env = "FITORDER_ADDR",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:8080"
    )]
    pub addr: String,
    /// HS256 secret of staff and member tokens. Unset: in development mode a random one, kept
    /// in `./.fitorder/jwt-secret` and printed with dev tokens; elsewhere the start is refused.
    #[arg(id = "jwt-secret", long = "jwt-secret", env = "FITORDER_JWT_SECRET", value_name = "SECRET", hide_env_values = true,
        default_value = "", hide_default_value = true, value_parser = secret)]
    pub jwt_secret: SecretString,
    /// Expiry of an online order (humantime: `2s`, `15m`).
    #[arg(id = "order-timeout", long = "order-timeout", env = "FITORDER_ORDER_TIMEOUT", value_name = "DURATION", default_value = "15m",
        value_parser = duration)]
    pub order_timeout: Duration,
    /// Expiry of an OFFLINE order a member placed (staff's have none).
    #[arg(id = "offline-order-timeout", long = "offline-order-timeout", env = "FITORDER_OFFLINE_ORDER_TIMEOUT", value_name = "DURATION",
        default_value = "24h", value_parser = duration)]
    pub offline_order_timeout: Duration,
    /// Period of the fallback expiry scan (and of the scheduler's other ticks).
    #[arg(id = "scan-interval", long = "scan-interval", env = "FITORDER_SCAN_INTERVAL", value_name = "DURATION", default_value = "60s",
        value_parser = duration)]
    pub scan_interval: Duration,
    /// First compensation retry delay (doubling).
    #[arg(id = "retry-base", long = "retry-base", env = "FITORDER_RETRY_BASE", value_name = "DURATION", default_value = "30s",
        value_parser = duration)]
    pub retry_base: Duration,
    /// Attempts of an outbox effect before it is DEAD (at least 1).
    #[arg(
        id = "max-attempts",
        long = "max-attempts",
        env = "FITORDER_MAX_ATTEMPTS",
        value_name = "N",
        default_value = "5"
    )]
    pub max_attempts: i32,
    /// Longest wait for one downstream call (door access, AI devices).
    #[arg(id = "downstream-timeout", long = "downstream-timeout", env = "FITORDER_DOWNSTREAM_TIMEOUT", value_name = "DURATION",
        default_value = "3s", value_parser = duration)]
    pub downstream_timeout: Duration,
    /// Outbox workers per `serve`/`worker` process (1–64).
    #[arg(
        id = "outbox-workers",
        long = "outbox-workers",
        env = "FITORDER_OUTBOX_WORKERS",
        value_name = "N",
        default_value = "2"
    )]
    pub outbox_workers: usize,
    /// Due events each outbox worker claims and delivers at once (1–1000); 2 × 64 was the fastest
    /// in the bench's B6 on 2 cores.
    #[arg(
        id = "outbox-batch",
        long = "outbox-batch",
        env = "FITORDER_OUTBOX_BATCH",
        value_name = "N",
        default_value = "64"
    )]
    pub outbox_batch: i64,
    /// The door-access endpoint. Unset: a simulator.
    #[arg(id = "door-access-url", long = "door-access-url", env = "FITORDER_DOOR_ACCESS_URL", value_name = "URL", hide_env_values = true, value_parser = secret_url)]
    pub door_access_url: Option<SecretUrl>,
    /// The AI-device endpoint. Unset: a simulator.
    #[arg(id = "ai-access-url", long = "ai-access-url", env = "FITORDER_AI_ACCESS_URL", value_name = "URL", hide_env_values = true, value_parser = secret_url)]
    pub ai_access_url: Option<SecretUrl>,
    /// Where bills are read (`wechatpay-YYYY-MM-DD.csv`, `alipay-YYYY-MM-DD.csv`); a bill not
    /// there is fetched from the provider (WeChat `GET /v3/bill/tradebill`, gzip checked against
    /// its signed SHA1; Alipay `alipay.data.dataservice.bill.downloadurl.query`, the zip's
    /// `…_业务明细.csv`) and kept there under the same name.
    #[arg(
        id = "statement-dir",
        long = "statement-dir",
        env = "FITORDER_STATEMENT_DIR",
        value_name = "PATH",
        default_value = "./statements"
    )]
    pub statement_dir: PathBuf,
    /// The business day's time zone (reconciliation, the ledger, deadlines), IANA.
    #[arg(id = "timezone", long = "timezone", env = "FITORDER_TIMEZONE", value_name = "ZONE", default_value = "Asia/Shanghai",
        value_parser = timezone)]
    pub timezone: chrono_tz::Tz,
    /// Local time (in `FITORDER_TIMEZONE`) of the daily reconciliation run.
    #[arg(id = "reconcile-at", long = "reconcile-at", env = "FITORDER_RECONCILE_AT", value_name = "HH:MM", default_value = "10:30",
        value_parser = clock_time)]
    pub reconcile_at: chrono::NaiveTime,
    /// The base URL the providers reach this service at (their `notify_url`), and of the
    /// ops-page link in alerts. Unset: `http://` and `FITORDER_ADDR`. Outside development mode
    /// it must be `https://` (or a loopback address), else the start is refused naming it.
    #[arg(
        id = "public-url",
        long = "public-url",
        env = "FITORDER_PUBLIC_URL",
        value_name = "URL",
        default_value = "",
        hide_default_value = true
    )]
    pub public_url: String,
    /// Development mode only: where the provider sandbox listens.
    #[arg(
        id = "sandbox-addr",
        long = "sandbox-addr",
        env = "FITORDER_SANDBOX_ADDR",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:8081"
    )]
    pub sandbox_addr: String,
    #[command(flatten)]
    pub wechatpay: WechatPayConfig,
    #[command(flatten)]
    pub alipay: AlipayConfig,
    /// GraphQL: queries costlier than this are refused before they run (depth is limited to 12).
    #[arg(
        id = "max-complexity",
        long = "max-complexity",
        env = "FITORDER_MAX_COMPLEXITY",
        value_name = "N",
        default_value = "20000"
    )]
    pub max_complexity: usize,
    /// GraphQL depth limit (not a setting).
    #[arg(skip = 12usize)]
    pub max_depth: usize,
    /// Largest request body accepted on any route (413 above).
    #[arg(
        id = "max-body-bytes",
        long = "max-body-bytes",
        env = "FITORDER_MAX_BODY_BYTES",
        value_name = "BYTES",
        default_value = "1048576"
    )]
    pub max_body_bytes: usize,
    /// Database connections per process (a checkout waits at most 5 s); callback evidence has
    /// half as many again (at least 4) of its own.
    #[arg(
        id = "db-pool-size",
        long = "db-pool-size",
        env = "FITORDER_DB_POOL_SIZE",
        value_name = "N",
        default_value = "16"
    )]
    pub db_pool_size: usize,
    /// Longest a single SQL statement may run.
    #[arg(id = "statement-timeout", long = "statement-timeout", env = "FITORDER_STATEMENT_TIMEOUT", value_name = "DURATION",
        default_value = "60s", value_parser = duration)]
    pub statement_timeout: Duration,
    /// A direct PostgreSQL connection for LISTEN and migrations when `DATABASE_URL` goes through
    /// PgBouncer in transaction pooling. Unset: `DATABASE_URL`.
    #[arg(id = "listen-database-url", long = "listen-database-url", env = "FITORDER_LISTEN_DATABASE_URL", value_name = "URL",
        hide_env_values = true, value_parser = secret_url)]
    pub listen_database_url: Option<SecretUrl>,
    /// A streaming replica for the admin console's reads (lists, statistics); a member's own
    /// order and anything after a write read the primary. Unset: every read goes to the primary.
    #[arg(id = "read-database-url", long = "read-database-url", env = "FITORDER_READ_DATABASE_URL", value_name = "URL",
        hide_env_values = true, value_parser = secret_url)]
    pub read_database_url: Option<SecretUrl>,
    /// A replica further behind than this (or whose WAL receiver is not running) is not read:
    /// the primary is, counted in `fitorder_read_replica_fallback_total{reason="lag"}`.
    #[arg(id = "read-max-lag", long = "read-max-lag", env = "FITORDER_READ_MAX_LAG", value_name = "DURATION", default_value = "5s",
        value_parser = duration)]
    pub read_max_lag: Duration,
    /// Alert channels, comma-separated: `[wecom:|dingtalk:|feishu:|webhook:]URL[#SECRET]`, e.g.
    /// `https://oapi.dingtalk.com/robot/send?access_token=T#SECxxx` (the kind follows from the
    /// host when there is no prefix; `#SECRET` is DingTalk's 加签 or Feishu's 签名校验 secret).
    /// Unset: alerts are only logged.
    #[arg(id = "alert-webhooks", long = "alert-webhooks", env = "FITORDER_ALERT_WEBHOOKS", value_name = "CHANNELS", hide_env_values = true,
        default_value = "", hide_default_value = true, value_parser = alert_channels::parse_list)]
    pub alert_channels: ::std::vec::Vec<alert_channels::Channel>,
    /// First retry delay of an alert delivery (doubling, ±20 %).
    #[arg(id = "alert-retry-base", long = "alert-retry-base", env = "FITORDER_ALERT_RETRY_BASE", value_name = "DURATION",
        default_value = "5s", value_parser = duration)]
    pub alert_retry_base: Duration,
    /// Attempts of one alert delivery before it is DEAD.
    #[arg(
        id = "alert-max-attempts",
        long = "alert-max-attempts",
        env = "FITORDER_ALERT_MAX_ATTEMPTS",
        value_name = "N",
        default_value = "8"
    )]
    pub alert_max_attempts: i32,
    /// Requests per minute to one alert channel, cluster-wide (the robots allow about 20).
    #[arg(
        id = "alert-rate",
        long = "alert-rate",
        env = "FITORDER_ALERT_RATE",
        value_name = "N",
        default_value = "20"
    )]
    pub alert_rate_per_minute: i64,
    /// `fitorder worker` and `fitorder serve` serve `/metrics`, `/healthz` and `/readyz` here (a
    /// listener of its own, no token). Unset: no such listener.
    #[arg(
        id = "metrics-addr",
        long = "metrics-addr",
        env = "FITORDER_METRICS_ADDR",
        value_name = "HOST:PORT"
    )]
    pub metrics_addr: Option<String>,
    /// Outside development mode, `/metrics` on the API port answers only
    /// `Authorization: Bearer <this>`. Unset: 404 there (use `FITORDER_METRICS_ADDR`).
    #[arg(id = "metrics-token", long = "metrics-token", env = "FITORDER_METRICS_TOKEN", value_name = "TOKEN", hide_env_values = true,
        value_parser = secret)]
    pub metrics_token: Option<SecretString>,
    /// Log lines: `json` (one object per line: `time`, `level`, `target`, `message`, `fields`,
    /// `span`, `trace_id`; no colours) or `text`. Unset: `json` when standard output is not a
    /// terminal, else `text`.
    #[arg(
        id = "log-format",
        long = "log-format",
        env = "FITORDER_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum
    )]
    pub log_format: Option<crate::logging::LogFormat>,
    /// Longest GraphQL document (query text).
    #[arg(
        id = "max-document-bytes",
        long = "max-document-bytes",
        env = "FITORDER_MAX_DOCUMENT_BYTES",
        value_name = "BYTES",
        default_value = "65536"
    )]
    pub max_document_bytes: usize,
    #[command(flatten)]
    pub max_document_tokens: crate::bounds::TokenBudget,
    /// Deepest nesting of `{`, `[` and `(` in a GraphQL document, before it is parsed (1–128).
    #[arg(id = "max-document-nesting", long = "max-document-nesting", env = "FITORDER_MAX_DOCUMENT_NESTING", value_name = "N",
        default_value_t = crate::bounds::DEFAULT_NESTING)]
    pub max_document_nesting: usize,
    /// GraphQL fields + fragment spreads + inline fragments, every fragment expanded.
    #[arg(
        id = "max-selections",
        long = "max-selections",
        env = "FITORDER_MAX_SELECTIONS",
        value_name = "N",
        default_value = "3000"
    )]
    pub max_selections: u64,
    /// GraphQL fragment spreads, every fragment expanded (and 200 fragment definitions).
    #[arg(
        id = "max-fragment-spreads",
        long = "max-fragment-spreads",
        env = "FITORDER_MAX_FRAGMENT_SPREADS",
        value_name = "N",
        default_value = "500"
    )]
    pub max_fragment_spreads: u64,
    /// A WebSocket without `connection_init` by then is closed (4408).
    #[arg(id = "ws-init-timeout", long = "ws-init-timeout", env = "FITORDER_WS_INIT_TIMEOUT", value_name = "DURATION", default_value = "10s",
        value_parser = duration)]
    pub ws_init_timeout: Duration,
    /// Running operations per WebSocket; one more is answered with an `error`.
    #[arg(
        id = "ws-max-subscriptions",
        long = "ws-max-subscriptions",
        env = "FITORDER_WS_MAX_SUBSCRIPTIONS",
        value_name = "N",
        default_value = "100"
    )]
    pub ws_max_subscriptions: usize,
    /// Wait for a request's headers, and longest idle keep-alive.
    #[arg(id = "http-header-timeout", long = "http-header-timeout", env = "FITORDER_HTTP_HEADER_TIMEOUT", value_name = "DURATION",
        default_value = "10s", value_parser = duration)]
    pub http_header_timeout: Duration,
    /// The whole request body must arrive within this (total, not idle: 408 and the connection
    /// closed).
    #[arg(id = "http-body-timeout", long = "http-body-timeout", env = "FITORDER_HTTP_BODY_TIMEOUT", value_name = "DURATION",
        default_value = "30s", value_parser = duration)]
    pub http_body_timeout: Duration,
    /// Body kept of a callback whose signature does not verify.
    #[arg(
        id = "unverified-callback-bytes",
        long = "unverified-callback-bytes",
        env = "FITORDER_UNVERIFIED_CALLBACK_BYTES",
        value_name = "BYTES",
        default_value = "4096"
    )]
    pub unverified_callback_bytes: usize,
    /// `1`: answer introspection without a token outside development mode.
    #[arg(id = "public-introspection", long = "public-introspection", env = "FITORDER_PUBLIC_INTROSPECTION", value_name = "1",
        default_value = "", hide_default_value = true, value_parser = one_is_yes, action = clap::ArgAction::Set)]
    pub public_introspection: bool,
    /// Open HTTP connections per listener; one more is answered 503 and closed.
    #[arg(id = "max-connections", long = "max-connections", env = "FITORDER_MAX_CONNECTIONS", value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Open HTTP connections from one peer address (the TCP peer; a load balancer of
    /// `FITORDER_TRUSTED_PROXIES` has no such cap).
    #[arg(id = "max-connections-per-addr", long = "max-connections-per-addr", env = "FITORDER_MAX_CONNECTIONS_PER_ADDR", value_name = "N",
        default_value_t = DEFAULT_MAX_CONNECTIONS_PER_ADDR)]
    pub max_connections_per_addr: usize,
    /// Running WebSocket operations of one token over all its connections; one more gets an
    /// `error`.
    #[arg(
        id = "max-subscriptions-per-token",
        long = "max-subscriptions-per-token",
        env = "FITORDER_MAX_SUBSCRIPTIONS_PER_TOKEN",
        value_name = "N",
        default_value = "200"
    )]
    pub max_subscriptions_per_token: usize,
    /// `WAIT_PAY` orders one member may hold at once, whoever places them (`TOO_MANY_OPEN_ORDERS`).
    #[arg(
        id = "max-open-orders",
        long = "max-open-orders",
        env = "FITORDER_MAX_OPEN_ORDERS",
        value_name = "N",
        default_value = "5"
    )]
    pub max_open_orders: i64,
    /// Orders one member may place per minute, per process (`RATE_LIMITED`).
    #[arg(
        id = "place-rate",
        long = "place-rate",
        env = "FITORDER_PLACE_RATE",
        value_name = "N",
        default_value = "20"
    )]
    pub place_rate_per_minute: u32,
    /// Unverified callbacks kept whole per source address and minute; beyond, one in 100.
    #[arg(
        id = "unverified-callbacks-per-minute",
        long = "unverified-callbacks-per-minute",
        env = "FITORDER_UNVERIFIED_CALLBACKS_PER_MINUTE",
        value_name = "N",
        default_value = "20"
    )]
    pub unverified_callbacks_per_minute: u32,
    /// Unverified callbacks kept per minute and process in all.
    #[arg(
        id = "unverified-callbacks-total-per-minute",
        long = "unverified-callbacks-total-per-minute",
        env = "FITORDER_UNVERIFIED_CALLBACKS_TOTAL_PER_MINUTE",
        value_name = "N",
        default_value = "600"
    )]
    pub unverified_callbacks_per_minute_total: u32,
    /// Connecting to a provider API.
    #[arg(id = "provider-connect-timeout", long = "provider-connect-timeout", env = "FITORDER_PROVIDER_CONNECT_TIMEOUT", value_name = "DURATION",
        default_value = "3s", value_parser = duration)]
    pub provider_connect_timeout: Duration,
    /// A whole provider call, the answer included (the Alipay SDK's read timeout). Bill
    /// downloads have 10 minutes.
    #[arg(id = "provider-timeout", long = "provider-timeout", env = "FITORDER_PROVIDER_TIMEOUT", value_name = "DURATION",
        default_value = "15s", value_parser = duration)]
    pub provider_timeout: Duration,
    /// Load balancers (IPs or CIDRs, comma-separated) whose `X-Forwarded-For` is believed: the
    /// client address is the right-most entry that is not one of them; `WECHAT_H5` takes the
    /// payer's address only from one of them. Unset: none.
    #[arg(id = "trusted-proxies", long = "trusted-proxies", env = "FITORDER_TRUSTED_PROXIES", value_name = "CIDRS", default_value = "",
        hide_default_value = true, value_parser = parse_trusted_proxies)]
    pub trusted_proxies: ::std::vec::Vec<ipnet::IpNet>,
    #[command(flatten)]
    pub sign_in: SignInConfig,
    #[command(flatten)]
    pub oidc_settings: oidc::OidcSettings,
    /// Staff tokens from an OpenID Connect issuer: worked out from `oidc_settings`.
    #[arg(skip)]
    pub oidc: Option<oidc::OidcConfig>,
    /// Path of a trusted documents manifest (a JSON object from SHA-256 to document, as GraphQL
    /// Code Generator's client preset and Relay write it), read and checked at start (a
    /// document that does not parse stops the start). Unset: none.
    #[arg(id = "trusted-documents", long = "trusted-documents", env = "FITORDER_TRUSTED_DOCUMENTS", value_name = "PATH",
        value_parser = TrustedDocuments::load)]
    pub trusted_documents: Option<Arc<TrustedDocuments>>,
    /// Whom the trusted documents manifest binds: `member` (member tokens, and callers without a
    /// token) or `all` (every caller).
    #[arg(
        id = "trusted-documents-for",
        long = "trusted-documents-for",
        env = "FITORDER_TRUSTED_DOCUMENTS_FOR",
        value_name = "WHOM",
        value_enum,
        default_value = "member"
    )]
    pub trusted_documents_for: TrustedDocumentsFor,
    /// The `cargo run` development mode: private cluster, demo data, the provider sandbox
    /// (`--dev` of `serve` and `worker`; not a setting).
    #[arg(skip)]
    pub dev_mode: bool,
    /// True when `jwt_secret` was made up at start (development mode): tokens are printed then.
    #[arg(skip)]
    pub jwt_secret_generated: bool,
}

/// Beyond the per-address limit, one unverified callback in this many is kept as a sample.
pub const UNVERIFIED_SAMPLE_EVERY: u64 = 100;

pub const WECHAT_API_BASE: &str = "https://api.weixin.qq.com";
pub const WECHATPAY_API_BASE: &str = "https://api.mch.weixin.qq.com";
pub const ALIPAY_API_BASE: &str = "https://openapi.alipay.com/gateway.do";

/// `FITORDER_MAX_CONNECTIONS` and `FITORDER_MAX_CONNECTIONS_PER_ADDR` when unset.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDR: usize = 256;

/// Members signing in from the WeChat mini program (`signInWithWechat`, `refreshSession`,
/// `signOut`), and their sessions.
#[derive(Clone, Debug, clap::Args)]
pub struct SignInConfig {
    /// The member mini program's appid, set together with `WECHAT_MINIPROGRAM_SECRET`: members
    /// sign in with `signInWithWechat`. Unset: no sign-in (development mode: the sandbox's).
    #[arg(
        id = "wechat-miniprogram-app-id",
        long = "wechat-miniprogram-app-id",
        env = "WECHAT_MINIPROGRAM_APP_ID",
        value_name = "APPID"
    )]
    pub app_id: Option<String>,
    /// The mini program's AppSecret, set together with `WECHAT_MINIPROGRAM_APP_ID`.
    #[arg(id = "wechat-miniprogram-secret", long = "wechat-miniprogram-secret", env = "WECHAT_MINIPROGRAM_SECRET", value_name = "SECRET",
        hide_env_values = true, value_parser = secret)]
    pub secret: Option<SecretString>,
    /// WeChat's mini-program API (`/sns/jscode2session`, `/cgi-bin/stable_token`,
    /// `/wxa/business/getuserphonenumber`).
    #[arg(id = "wechat-api-base", long = "wechat-api-base", env = "WECHAT_API_BASE", value_name = "URL", default_value = WECHAT_API_BASE)]
    pub api_base: String,
    /// A member session's access token (a JWT with `sid`); at least 1m.
    #[arg(id = "access-token-ttl", long = "access-token-ttl", env = "FITORDER_ACCESS_TOKEN_TTL", value_name = "DURATION",
        default_value = "2h", value_parser = duration)]
    pub access_token_ttl: Duration,
    /// A member session's refresh token (one use; each refresh starts a new period); longer
    /// than the access token's.
    #[arg(id = "refresh-token-ttl", long = "refresh-token-ttl", env = "FITORDER_REFRESH_TOKEN_TTL", value_name = "DURATION",
        default_value = "30d", value_parser = duration)]
    pub refresh_token_ttl: Duration,
    /// Sign-in mutations per minute per client address (an IPv6 one by its /64); over it:
    /// `BAD_USER_INPUT`, reason `RATE_LIMITED`, `extensions.retryAfter` and `Retry-After`.
    #[arg(
        id = "signin-rate",
        long = "signin-rate",
        env = "FITORDER_SIGNIN_RATE",
        value_name = "N",
        default_value = "30"
    )]
    pub rate_per_address: u32,
    /// Sign-ins per minute per WeChat account.
    #[arg(
        id = "signin-rate-per-openid",
        long = "signin-rate-per-openid",
        env = "FITORDER_SIGNIN_RATE_PER_OPENID",
        value_name = "N",
        default_value = "10"
    )]
    pub rate_per_openid: u32,
}

/// WeChat Pay, configured whole or not at all (the start names what is missing).
#[derive(Clone, Debug, clap::Args)]
pub struct WechatPayConfig {
    /// WeChat Pay merchant id.
    #[arg(
        id = "wechatpay-mch-id",
        long = "wechatpay-mch-id",
        env = "WECHATPAY_MCH_ID",
        value_name = "MCHID"
    )]
    pub mch_id: Option<String>,
    /// The appid JSAPI, Native and H5 trades are made under (the mini program or official
    /// account).
    #[arg(
        id = "wechatpay-app-id",
        long = "wechatpay-app-id",
        env = "WECHATPAY_APP_ID",
        value_name = "APPID"
    )]
    pub app_id: Option<String>,
    /// The mobile app's appid, for `WECHAT_APP` trades. Unset: `WECHATPAY_APP_ID`.
    #[arg(
        id = "wechatpay-mobile-app-id",
        long = "wechatpay-mobile-app-id",
        env = "WECHATPAY_MOBILE_APP_ID",
        value_name = "APPID"
    )]
    pub mobile_app_id: Option<String>,
    /// The 32-byte APIv3 key (as text).
    #[arg(id = "wechatpay-apiv3-key", long = "wechatpay-apiv3-key", env = "WECHATPAY_APIV3_KEY", value_name = "KEY", hide_env_values = true,
        value_parser = secret)]
    pub apiv3_key: Option<SecretString>,
    /// Path of the merchant API private key (PEM): signs every API call and the client pay
    /// parameters.
    #[arg(
        id = "wechatpay-mch-private-key",
        long = "wechatpay-mch-private-key",
        env = "WECHATPAY_MCH_PRIVATE_KEY",
        value_name = "PATH"
    )]
    pub merchant_private_key: Option<PathBuf>,
    /// The serial of the merchant API certificate.
    #[arg(
        id = "wechatpay-mch-serial",
        long = "wechatpay-mch-serial",
        env = "WECHATPAY_MCH_SERIAL",
        value_name = "SERIAL"
    )]
    pub merchant_serial: Option<String>,
    /// Path of the 微信支付公钥 (PEM), with `WECHATPAY_PUBLIC_KEY_ID`. Unset: platform
    /// certificates are downloaded (`/v3/certificates`).
    #[arg(
        id = "wechatpay-platform-public-key",
        long = "wechatpay-platform-public-key",
        env = "WECHATPAY_PLATFORM_PUBLIC_KEY",
        value_name = "PATH"
    )]
    pub platform_public_key: Option<PathBuf>,
    /// The `PUB_KEY_ID_…` that `Wechatpay-Serial` names for that key.
    #[arg(
        id = "wechatpay-public-key-id",
        long = "wechatpay-public-key-id",
        env = "WECHATPAY_PUBLIC_KEY_ID",
        value_name = "ID"
    )]
    pub public_key_id: Option<String>,
    /// The WeChat Pay API.
    #[arg(id = "wechatpay-api-base", long = "wechatpay-api-base", env = "WECHATPAY_API_BASE", value_name = "URL",
        default_value = WECHATPAY_API_BASE)]
    pub api_base: String,
}

/// Alipay, configured whole or not at all (the start names what is missing).
#[derive(Clone, Debug, clap::Args)]
pub struct AlipayConfig {
    /// Alipay app id.
    #[arg(
        id = "alipay-app-id",
        long = "alipay-app-id",
        env = "ALIPAY_APP_ID",
        value_name = "APPID"
    )]
    pub app_id: Option<String>,
    /// Path of the app private key (PEM): signs every gateway request and order string.
    #[arg(
        id = "alipay-app-private-key",
        long = "alipay-app-private-key",
        env = "ALIPAY_APP_PRIVATE_KEY",
        value_name = "PATH"
    )]
    pub app_private_key: Option<PathBuf>,
    /// Path of the Alipay public key (PEM or bare base64): public-key mode.
    #[arg(
        id = "alipay-public-key",
        long = "alipay-public-key",
        env = "ALIPAY_PUBLIC_KEY",
        value_name = "PATH"
    )]
    pub public_key: Option<PathBuf>,
    /// Certificate mode: path of the app certificate.
    #[arg(
        id = "alipay-app-cert",
        long = "alipay-app-cert",
        env = "ALIPAY_APP_CERT",
        value_name = "PATH"
    )]
    pub app_cert: Option<PathBuf>,
    /// Certificate mode: path of the Alipay public-key certificate.
    #[arg(
        id = "alipay-public-cert",
        long = "alipay-public-cert",
        env = "ALIPAY_PUBLIC_CERT",
        value_name = "PATH"
    )]
    pub public_cert: Option<PathBuf>,
    /// Certificate mode: path of the Alipay root certificate.
    #[arg(
        id = "alipay-root-cert",
        long = "alipay-root-cert",
        env = "ALIPAY_ROOT_CERT",
        value_name = "PATH"
    )]
    pub root_cert: Option<PathBuf>,
    /// The Alipay gateway.
    #[arg(id = "alipay-api-base", long = "alipay-api-base", env = "ALIPAY_API_BASE", value_name = "URL", default_value = ALIPAY_API_BASE)]
    pub api_base: String,
    /// Our Alipay seller id (`2088…`): a notification naming another `seller_id` is refused.
    /// Unset: the seller is not checked (the app id still is).
    #[arg(
        id = "alipay-seller-id",
        long = "alipay-seller-id",
        env = "ALIPAY_SELLER_ID",
        value_name = "ID"
    )]
    pub seller_id: Option<String>,
}

/// The settings' parser: [`Config`] under a command of its own, for [`Config::from_env`] and
/// the tests (the binary's commands flatten [`Config`] into theirs).
#[derive(clap::Parser, Debug)]
#[command(name = "fitorder", about = None, long_about = None)]
struct Settings {
    #[command(flatten)]
    config: Config,
}

impl Config {
    /// The settings from the environment, worked out ([`Config::resolve`]).
    pub fn from_env() -> Result<Config> {
        let cmd = reference::reading_env(<Settings as clap::CommandFactory>::command());
        Config::from_command(cmd, ["fitorder"])?.resolve()
    }

    /// Parses `args` with `cmd` (a command holding [`Config`]'s arguments); a refusal names the
    /// variable.
    fn from_command<I: IntoIterator<Item = &'static str>>(cmd: clap::Command, args: I) -> Result<Config> {
        let matches = cmd.try_get_matches_from(args).map_err(reference::explain)?;
        <Config as clap::FromArgMatches>::from_arg_matches(&matches).map_err(reference::explain)
    }

    /// What the parsed settings imply: the secret made up in development, the public URL from
    /// the address, the claims of an OIDC issuer, the bounds on counts; settings that contradict
    /// each other stop the start, naming them.
    pub fn resolve(mut self) -> Result<Config> {
        if self.jwt_secret.expose_secret().is_empty() {
            self.jwt_secret = secrets::dev_secret().into();
            self.jwt_secret_generated = true;
        }
        if self.public_url.trim().is_empty() {
            self.public_url = format!("http://{}", self.addr);
        }
        self.public_url = self.public_url.trim().trim_end_matches('/').to_string();
        anyhow::ensure!(self.max_attempts >= 1, "FITORDER_MAX_ATTEMPTS must be at least 1");
        self.outbox_workers = self.outbox_workers.clamp(1, 64);
        self.outbox_batch = self.outbox_batch.clamp(1, 1000);
        self.alert_max_attempts = self.alert_max_attempts.max(1);
        self.alert_rate_per_minute = self.alert_rate_per_minute.max(1);
        self.max_document_nesting = self.max_document_nesting.clamp(1, 128);
        self.max_connections = self.max_connections.max(1);
        self.max_connections_per_addr = self.max_connections_per_addr.max(1);
        self.max_subscriptions_per_token = self.max_subscriptions_per_token.max(1);
        self.max_open_orders = self.max_open_orders.max(1);
        self.place_rate_per_minute = self.place_rate_per_minute.max(1);
        self.sign_in = self.sign_in.resolve()?;
        self.oidc = oidc::OidcConfig::from_settings(&self.oidc_settings)?;
        Ok(self)
    }

    /// A configuration for tests: the settings' defaults with no variable read, and what tests
    /// need instead (a fixed secret, port 0, no caps on one member's orders).
    pub fn for_tests(database_url: String) -> Config {
        let mut c = Config::defaults();
        c.database_url = Some(SecretUrl::from(database_url));
        c.addr = "127.0.0.1:0".into();
        c.public_url = "http://127.0.0.1:0".into();
        c.sandbox_addr = "127.0.0.1:0".into();
        c.jwt_secret = "test-secret-not-for-production-0123456789".into();
        c.db_pool_size = 8;
        // Tests place hundreds of orders for one member: the tests of these limits set them.
        c.max_open_orders = 100_000;
        c.place_rate_per_minute = 100_000;
        c.resolve().expect("the test configuration is whole")
    }

    /// Every setting at its default, no variable read, nothing worked out yet.
    fn defaults() -> Config {
        let cmd = reference::ignoring_env(<Settings as clap::CommandFactory>::command());
        Config::from_command(cmd, ["fitorder"]).expect("the defaults parse")
    }

    /// Where the ops page is, for links in alerts.
    pub fn ops_url(&self) -> String {
        format!("{}/ops", self.public_url.trim_end_matches('/'))
    }

    /// The database URL as text (`None`: the private cluster).
    pub fn database_url(&self) -> Option<&str> {
        self.database_url.as_deref()
    }

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

    /// Development mode: keeps the made-up secret in `./.fitorder/jwt-secret`.
    pub fn keep_dev_secret(&self) {
        if self.jwt_secret_generated {
            secrets::keep_dev_secret(self.jwt_secret.expose_secret());
        }
    }
}

impl SignInConfig {
    fn resolve(self) -> Result<SignInConfig> {
        anyhow::ensure!(
            self.app_id.is_some() == self.secret.is_some(),
            "WECHAT_MINIPROGRAM_APP_ID and WECHAT_MINIPROGRAM_SECRET are set together or not at all (missing: {})",
            if self.app_id.is_none() {
                "WECHAT_MINIPROGRAM_APP_ID"
            } else {
                "WECHAT_MINIPROGRAM_SECRET"
            }
        );
        anyhow::ensure!(
            self.access_token_ttl >= Duration::from_secs(60) && self.refresh_token_ttl > self.access_token_ttl,
            "FITORDER_ACCESS_TOKEN_TTL must be at least 1m and FITORDER_REFRESH_TOKEN_TTL longer than it"
        );
        Ok(SignInConfig {
            rate_per_address: self.rate_per_address.max(1),
            rate_per_openid: self.rate_per_openid.max(1),
            ..self
        })
    }
}

impl Default for SignInConfig {
    /// The settings' defaults: no mini program.
    fn default() -> Self {
        Config::defaults().sign_in
    }
}

impl Default for WechatPayConfig {
    /// The settings' defaults: not configured.
    fn default() -> Self {
        Config::defaults().wechatpay
    }
}

impl Default for AlipayConfig {
    /// The settings' defaults: not configured.
    fn default() -> Self {
        Config::defaults().alipay
    }
}

// The settings' value parsers: each error says what the value should look like (clap adds the
// flag, [`reference::explain`] the variable).

fn duration(raw: &str) -> Result<Duration, String> {
    humantime::parse_duration(raw.trim()).map_err(|_| format!("{raw:?} is not a duration like 15m or 2s"))
}

fn secret(raw: &str) -> Result<SecretString, String> {
    Ok(raw.trim().to_string().into())
}

fn secret_url(raw: &str) -> Result<SecretUrl, String> {
    Ok(SecretUrl::from(raw.trim().to_string()))
}

fn timezone(raw: &str) -> Result<chrono_tz::Tz, String> {
    raw.trim()
        .parse::<chrono_tz::Tz>()
        .map_err(|_| format!("{raw:?} is not an IANA time zone"))
}

fn clock_time(raw: &str) -> Result<chrono::NaiveTime, String> {
    chrono::NaiveTime::parse_from_str(raw.trim(), "%H:%M").map_err(|_| format!("{raw:?} is not a time like 10:30"))
}

fn one_is_yes(raw: &str) -> Result<bool, String> {
    Ok(raw.trim() == "1")
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
        c.metrics_token = Some("METRICStokenVALUE".into());
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
            "METRICStokenVALUE",
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
}

#[cfg(test)]
mod parsing_tests {
    use super::*;

    fn parse(vars: &[(&'static str, &'static str)]) -> Result<Config> {
        // Each variable's value as its default: what clap would read from the environment.
        let cmd = <Settings as clap::CommandFactory>::command().mut_args(|a| {
            let env = a.get_env().and_then(|e| e.to_str()).map(str::to_string);
            match env.and_then(|e| vars.iter().find(|(k, _)| *k == e)) {
                Some((_, v)) => a.default_value(*v),
                None => a,
            }
        });
        let cmd = reference::ignoring_env(cmd);
        // The refusal names the variable although none was read: the names are on the flags.
        Config::from_command(cmd, ["fitorder"])?.resolve()
    }

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
    fn a_bad_value_is_refused_naming_its_variable() {
        for (name, bad) in [
            ("FITORDER_ORDER_TIMEOUT", "15 parsecs"),
            ("FITORDER_MAX_OPEN_ORDERS", "five"),
            ("FITORDER_TIMEZONE", "Mars/Olympus"),
            ("FITORDER_RECONCILE_AT", "half past ten"),
            ("FITORDER_TRUSTED_PROXIES", "lb.internal"),
            ("FITORDER_TRUSTED_DOCUMENTS_FOR", "nobody"),
            ("FITORDER_LOG_FORMAT", "xml"),
        ] {
            let e = format!("{:#}", parse(&[(name, bad)]).unwrap_err());
            assert!(e.contains(name), "{name}: {e}");
        }
        let e = format!("{:#}", parse(&[("FITORDER_MAX_ATTEMPTS", "0")]).unwrap_err());
        assert!(e.contains("FITORDER_MAX_ATTEMPTS"), "{e}");
        let e = format!("{:#}", parse(&[("WECHAT_MINIPROGRAM_APP_ID", "wx1")]).unwrap_err());
        assert!(e.contains("WECHAT_MINIPROGRAM_SECRET"), "{e}");
    }

    #[test]
    fn values_are_read_and_bounded_as_documented() {
        let c = parse(&[
            ("FITORDER_ORDER_TIMEOUT", "2m"),
            ("FITORDER_OUTBOX_WORKERS", "500"),
            ("FITORDER_ADDR", "0.0.0.0:9000"),
            ("FITORDER_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.7"),
            ("FITORDER_PUBLIC_INTROSPECTION", "1"),
            ("FITORDER_TRUSTED_DOCUMENTS_FOR", "all"),
            ("FITORDER_OIDC_ISSUER", "https://id.example.com"),
            ("FITORDER_OIDC_AUDIENCE", "fitorder"),
        ])
        .unwrap();
        assert_eq!(c.order_timeout, Duration::from_secs(120));
        assert_eq!(c.outbox_workers, 64);
        assert_eq!(c.public_url, "http://0.0.0.0:9000");
        assert_eq!(c.trusted_proxies.len(), 2);
        assert!(c.public_introspection);
        assert_eq!(c.trusted_documents_for, TrustedDocumentsFor::All);
        assert_eq!(c.oidc.as_ref().map(|o| o.role_claim.as_str()), Some("role"));
        let c = parse(&[]).unwrap();
        assert_eq!(c.provider_connect_timeout, Duration::from_secs(3));
        assert_eq!(c.provider_timeout, Duration::from_secs(15));
        assert_eq!(c.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(c.max_connections_per_addr, DEFAULT_MAX_CONNECTIONS_PER_ADDR);
        assert_eq!(c.max_document_tokens, crate::bounds::TokenBudget::DEFAULT);
        assert!(c.jwt_secret_generated && c.alert_channels.is_empty() && c.oidc.is_none());
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
}
