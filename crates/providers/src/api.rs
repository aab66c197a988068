//! The providers fitorder calls, in one place: one [`Gateway`] per configured provider of the
//! registry ([`super::provider::PLUGINS`]), one
//! HTTP client (HTTPS with rustls; `http://` for a local sandbox or proxy) shared by all.
//! A provider that is not configured is not called and nothing is simulated: its calls fail.

use std::sync::Arc;

use super::keys::ProviderKeys;
pub use super::provider::{
    Closed, Gateway, Instruction, ProviderError, RefundRequest, RefundState, TradeRequest, TradeState,
};
use super::provider::{GatewayParts, PLUGINS};
use crate::config::Config;
use crate::domain::payment::Provider;

#[derive(Clone)]
pub struct ProviderApi {
    http: reqwest::Client,
    config: Arc<Config>,
    gateways: Arc<Vec<Arc<dyn Gateway>>>,
}

impl ProviderApi {
    /// `pool`: where WeChat Pay platform certificates are kept and refreshed. There is one in
    /// `AppState` (`providers`), which every caller uses: a client without the pool could not
    /// load or refresh platform keys.
    pub fn with_pool(config: Arc<Config>, keys: Arc<ProviderKeys>, pool: crate::db::DbPool) -> ProviderApi {
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .https_only(false)
            // Connecting has its own, short limit. The whole call's: a provider call sets
            // FITORDER_PROVIDER_TIMEOUT on each request (the Alipay SDK's read timeout); the
            // downstream calls sharing this client keep FITORDER_DOWNSTREAM_TIMEOUT.
            .connect_timeout(config.provider_connect_timeout)
            .timeout(config.downstream_timeout)
            .pool_max_idle_per_host(64)
            .build()
            .expect("the HTTP client builds with its default TLS roots");
        // Each provider of the registry whose keys are configured.
        let parts = GatewayParts {
            http: http.clone(),
            public_url: config.public_url.clone(),
            timeout: config.provider_timeout,
            pool,
        };
        let gateways: Vec<Arc<dyn Gateway>> = PLUGINS.iter().filter_map(|p| p.gateway(&keys, &parts)).collect();
        ProviderApi {
            http,
            config,
            gateways: Arc::new(gateways),
        }
    }

    /// Every configured provider's gateway.
    pub fn gateways(&self) -> impl Iterator<Item = &dyn Gateway> {
        self.gateways.iter().map(|g| g.as_ref())
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The gateway of `provider`, when it is configured.
    pub fn gateway(&self, provider: Provider) -> Option<&dyn Gateway> {
        self.gateways
            .iter()
            .find(|g| g.provider() == provider)
            .map(|g| g.as_ref())
    }

    fn configured_gateway(&self, provider: Provider) -> Result<&dyn Gateway, ProviderError> {
        self.gateway(provider)
            .ok_or_else(|| ProviderError::Unsupported(format!("{provider} is not configured")))
    }

    /// Whether `provider` can be called.
    pub fn configured(&self, provider: Provider) -> bool {
        self.gateway(provider).is_some()
    }

    pub async fn refund(&self, provider: Provider, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
        self.configured_gateway(provider)?.refund(r).await
    }

    pub async fn refund_status(&self, provider: Provider, r: &RefundRequest<'_>) -> Result<RefundState, ProviderError> {
        self.configured_gateway(provider)?.refund_status(r).await
    }

    pub async fn query(
        &self,
        provider: Provider,
        out_trade_no: &str,
        trace: &str,
    ) -> Result<TradeState, ProviderError> {
        self.configured_gateway(provider)?.query(out_trade_no, trace).await
    }

    pub async fn close(&self, provider: Provider, out_trade_no: &str, trace: &str) -> Result<Closed, ProviderError> {
        self.configured_gateway(provider)?.close(out_trade_no, trace).await
    }
}

/// Describes a transport failure for an attempt log (downstream calls share it).
pub fn describe(err: &reqwest::Error, timeout: std::time::Duration) -> String {
    super::provider::unreachable(err, timeout).to_string()
}

/// Any 2xx is success; the body (JSON when there is one) is returned to the caller.
pub async fn check(resp: reqwest::Response) -> Result<serde_json::Value, String> {
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    } else {
        let snippet: String = text.chars().take(200).collect();
        Err(format!("HTTP {}: {snippet}", status.as_u16()))
    }
}
