//! The sandbox's memory: the trades, refunds, calls and notifications it has seen, and the
//! notifications it sends (or loses on purpose).

use super::*;

impl Inner {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn record(&self, call: SandboxCall) {
        self.lock().calls.push(call);
    }

    /// The configured failure and delay, applied before a call is looked at.
    pub(super) async fn knobs(&self) -> Option<u16> {
        let (failure, delay) = {
            let s = self.lock();
            (s.failure, s.delay)
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        failure
    }

    pub(super) async fn other_key(&self) -> RsaPrivateKey {
        self.wrong_key
            .get_or_init(|| async {
                tokio::task::spawn_blocking(|| RsaPrivateKey::new(&mut rand_core::OsRng, 2048).expect("RSA key"))
                    .await
                    .expect("key generation")
            })
            .await
            .clone()
    }

    pub(super) async fn answer_key(&self, provider: &str) -> RsaPrivateKey {
        if self.wrong_answer_key.load(Ordering::SeqCst) {
            return self.other_key().await;
        }
        self.own_key(provider)
    }

    pub(super) async fn notification_key(&self, provider: &str) -> RsaPrivateKey {
        if self.wrong_notification_key.load(Ordering::SeqCst) {
            return self.other_key().await;
        }
        self.own_key(provider)
    }

    /// The self-signed platform certificate of the platform key: (serial, PEM).
    pub(super) async fn platform_cert(&self) -> Result<(String, String), String> {
        self.platform_cert
            .get_or_try_init(|| async {
                let key = self.keys.wechat_platform_key.clone();
                tokio::task::spawn_blocking(move || {
                    let serial = cert_serial(&key);
                    platform_certs::self_signed_platform_cert(
                        &key,
                        &serial,
                        "fitorder sandbox WeChat Pay platform",
                        1825,
                    )
                    .map(|pem| (serial, pem))
                    .map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())?
            })
            .await
            .cloned()
    }

    pub(super) fn own_key(&self, provider: &str) -> RsaPrivateKey {
        if provider == ALIPAY {
            self.keys.alipay_key.clone()
        } else {
            self.keys.wechat_platform_key.clone()
        }
    }
}

impl Inner {
    /// Sends a notification and records what became of it; `acknowledged` is the provider's rule
    /// for a success, read from the status and the reply.
    pub(super) async fn deliver(
        &self,
        provider: &str,
        out_trade_no: &str,
        event: &str,
        url: &str,
        request: reqwest::RequestBuilder,
        acknowledged: fn(u16, &str) -> bool,
    ) -> SandboxNotification {
        let sent = match request.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let reply = resp.text().await.unwrap_or_default();
                SandboxNotification {
                    provider: provider.into(),
                    out_trade_no: out_trade_no.into(),
                    event: event.into(),
                    url: url.into(),
                    status: Some(status),
                    acknowledged: acknowledged(status, &reply),
                    reply,
                }
            }
            Err(e) => unreachable_notification(provider, out_trade_no, event, url, &e),
        };
        self.lock().notifications.push(sent.clone());
        sent
    }

    pub(super) fn lost(&self, provider: &str, no: &str, event: &str, url: &str) -> SandboxNotification {
        let n = SandboxNotification {
            provider: provider.into(),
            out_trade_no: no.into(),
            event: event.into(),
            url: url.into(),
            status: None,
            reply: "lost on the way (SandboxProvider::lose_notifications)".into(),
            acknowledged: false,
        };
        self.lock().notifications.push(n.clone());
        n
    }
}

fn unreachable_notification(
    provider: &str,
    no: &str,
    event: &str,
    url: &str,
    e: &reqwest::Error,
) -> SandboxNotification {
    SandboxNotification {
        provider: provider.into(),
        out_trade_no: no.into(),
        event: event.into(),
        url: url.into(),
        status: None,
        reply: e.to_string(),
        acknowledged: false,
    }
}
