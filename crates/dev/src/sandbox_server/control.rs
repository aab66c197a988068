//! What tests and the demo steer the sandbox with: [`SandboxProvider`]'s controls and reads.

use super::*;

impl SandboxProvider {
    /// Listens on `addr` (`127.0.0.1:0` for any free port) and serves until the last handle
    /// is dropped.
    pub async fn start(keys: SandboxKeys, addr: &str) -> Result<SandboxProvider> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("sandbox provider cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        let base_url = format!("http://{local}");
        let inner = Arc::new(Inner {
            keys,
            base_url: base_url.clone(),
            state: Mutex::new(State::default()),
            // WeChat Pay gives the receiver 5 seconds to answer a notification.
            http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?,
            wrong_answer_key: AtomicBool::new(false),
            wrong_notification_key: AtomicBool::new(false),
            lose_notifications: AtomicBool::new(false),
            wrong_key: tokio::sync::OnceCell::new(),
            platform_cert: tokio::sync::OnceCell::new(),
            switch_cert: tokio::sync::OnceCell::new(),
        });
        let app = router(inner.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = rx.await;
                })
                .await;
        });
        Ok(SandboxProvider {
            base_url,
            inner,
            _shutdown: Arc::new(Shutdown(Some(tx))),
        })
    }

    /// The WeChat Pay API base fitorder appends `/v3/...` to.
    pub fn wechat_api_base(&self) -> String {
        format!("{}/wechatpay", self.base_url)
    }

    /// The Alipay gateway URL.
    pub fn alipay_gateway(&self) -> String {
        format!("{}/alipay/gateway.do", self.base_url)
    }

    /// Where the Alipay app would submit an `alipay.trade.app.pay` order string (POST).
    pub fn alipay_app_pay_url(&self) -> String {
        format!("{}/alipay/app-pay", self.base_url)
    }

    /// The cashier page of a trade (it exists whether or not the trade does).
    pub fn cashier_url(&self, provider: &str, out_trade_no: &str) -> String {
        let p = provider_name(provider).unwrap_or(WECHAT_PAY);
        cashier_url(&self.inner.base_url, p, out_trade_no)
    }

    pub fn trade(&self, provider: &str, out_trade_no: &str) -> Option<SandboxTrade> {
        let p = provider_name(provider)?;
        self.inner.lock().trades.get(&(p, out_trade_no.to_string())).cloned()
    }

    /// What the cashier's Pay button does: the trade becomes paid and the signed notification
    /// is POSTed to its `notify_url`. Err when the trade cannot be paid (unknown, closed,
    /// past `time_expire`) or the notification was not acknowledged (the trade stays paid;
    /// paying again resends the same notification, as the provider's retries would).
    pub async fn pay(&self, provider: &str, out_trade_no: &str) -> Result<()> {
        let p = provider_name(provider).ok_or_else(|| anyhow!("unknown provider {provider}"))?;
        let sent = pay_trade(&self.inner, p, out_trade_no).await?;
        if sent.acknowledged {
            Ok(())
        } else {
            Err(anyhow!(
                "the notification to {} was not acknowledged: {} {}",
                sent.url,
                sent.status.map(|s| s.to_string()).unwrap_or_else(|| "no answer".into()),
                sent.reply
            ))
        }
    }

    /// Sets a trade's state in the provider's words (`USERPAYING`, `PAYERROR`, `CLOSED`,
    /// `WAIT_BUYER_PAY`, `TRADE_CLOSED`, …). For Alipay the trade then exists at the provider.
    pub fn set_state(&self, provider: &str, out_trade_no: &str, state: &str) {
        let Some(p) = provider_name(provider) else { return };
        let mut s = self.inner.lock();
        if let Some(t) = s.trades.get_mut(&(p, out_trade_no.to_string())) {
            t.state = state.to_string();
            if p == ALIPAY && !t.exists_at_provider {
                t.exists_at_provider = true;
                t.txn_id.get_or_insert_with(alipay_trade_no);
            }
        }
    }

    /// Answers (not notifications) signed with a key fitorder does not know.
    pub fn sign_answers_with_wrong_key(&self, on: bool) {
        self.inner.wrong_answer_key.store(on, Ordering::SeqCst);
    }

    /// Notifications signed with a key fitorder does not know.
    pub fn sign_notifications_with_wrong_key(&self, on: bool) {
        self.inner.wrong_notification_key.store(on, Ordering::SeqCst);
    }

    /// Notifications from now on are lost on the way (recorded as unreachable, never sent):
    /// only queries tell what happened.
    pub fn lose_notifications(&self, on: bool) {
        self.inner.lose_notifications.store(on, Ordering::SeqCst);
    }

    /// Which `Wechatpay-Serial` answers and notifications name from now on.
    pub fn set_wechat_serial_mode(&self, mode: WechatSerialMode) {
        self.inner.lock().serial_mode = mode;
    }

    /// WeChat's switch between platform certificates and the 微信支付公钥, as WeChat Pay runs
    /// it for a merchant: two different keys sign — the 微信支付公钥 (`PUB_KEY_ID_…`) and a
    /// platform certificate of another key ([`SandboxProvider::wechat_switch_cert_serial`]),
    /// which `/v3/certificates` lists. An answer follows the `Wechatpay-Serial` the request
    /// named (either of the two); otherwise answers and notifications alternate between them.
    pub async fn set_wechat_key_switch(&self, on: bool) -> Result<()> {
        if on {
            self.inner.switch_cert().await.map_err(|e| anyhow!(e))?;
        }
        self.inner.lock().key_switch = on;
        Ok(())
    }

    /// The serial of the certificate that signs beside the 微信支付公钥 during a key switch.
    pub async fn wechat_switch_cert_serial(&self) -> Result<String> {
        Ok(self.inner.switch_cert().await.map_err(|e| anyhow!(e))?.1)
    }

    /// Every call is refused with an error answer without a signature, as a provider refuses
    /// requests it cannot authenticate (a wrong merchant key or serial in the configuration):
    /// WeChat Pay `401 SIGN_ERROR` with no `Wechatpay-*` headers, Alipay `<method>_response`
    /// `40002 isv.invalid-signature` with no `sign`.
    pub fn answer_errors_unsigned(&self, on: bool) {
        self.inner.lock().unsigned_errors = on;
    }

    /// The `Wechatpay-Serial` every WeChat Pay API request carried so far (None: none).
    pub fn wechat_request_serials(&self) -> Vec<Option<String>> {
        self.inner.lock().request_serials.clone()
    }

    /// The serial of the sandbox's WeChat Pay platform certificate (40 hex digits, derived from
    /// the platform key, so it stays the same across restarts).
    pub fn wechat_cert_serial(&self) -> String {
        cert_serial(&self.inner.keys.wechat_platform_key)
    }

    /// How the bill service behaves from now on (not made yet, a wrong SHA1, a lapsing URL).
    pub fn set_bill_controls(&self, controls: BillControls) {
        self.inner.lock().bill_controls = controls;
    }

    /// The bill books this trade's payment on the day after it was paid (as a payment at the
    /// stroke of midnight can be): it is missing from that day's bill.
    pub fn book_on_next_day(&self, provider: &str, out_trade_no: &str) {
        let Some(p) = provider_name(provider) else { return };
        self.inner.lock().booked_next_day.insert((p, out_trade_no.to_string()));
    }

    /// From now on `provider`'s bill of `date` is `rows` (packed here, once), whatever trades the
    /// sandbox took that day: a bill of any size for the fetch path without that many trades.
    /// Blocking (a million rows take seconds): call it from `spawn_blocking`.
    pub fn publish_bill(
        &self,
        provider: &str,
        date: chrono::NaiveDate,
        rows: &[crate::providers::bills::BillRow],
    ) -> Result<()> {
        let p = provider_name(provider).ok_or_else(|| anyhow!("unknown provider {provider}"))?;
        let pid = if p == ALIPAY {
            alipay::SELLER_ID
        } else {
            self.inner.keys.mch_id.as_str()
        };
        let published = bills::publish(p, date, rows, pid).map_err(|e| anyhow!("packing the bill: {e}"))?;
        self.inner.lock().published.insert((p, date), published);
        Ok(())
    }

    /// Takes back a bill [`publish_bill`](Self::publish_bill) gave: the day is served as if
    /// nothing had been published.
    pub fn withdraw_bill(&self, provider: &str, date: chrono::NaiveDate) -> Result<()> {
        let p = provider_name(provider).ok_or_else(|| anyhow!("unknown provider {provider}"))?;
        self.inner.lock().published.remove(&(p, date));
        Ok(())
    }

    pub fn bill_controls(&self) -> BillControls {
        self.inner.lock().bill_controls
    }

    pub fn set_refund_flow(&self, flow: RefundFlow) {
        self.inner.lock().refund_flow = flow;
    }

    pub fn set_alipay_refund_flow(&self, flow: AlipayRefundFlow) {
        self.inner.lock().alipay_refund_flow = flow;
    }

    /// The deadline race: the member pays this trade just before fitorder's close arrives, so
    /// the close is refused (WeChat `ORDERPAID`, Alipay `ACQ.TRADE_STATUS_ERROR`). `notify`:
    /// the payment notification is sent too, after the close's answer (otherwise it is lost).
    pub fn pay_during_close(&self, provider: &str, out_trade_no: &str, notify: bool) {
        let Some(p) = provider_name(provider) else { return };
        self.inner
            .lock()
            .pay_on_close
            .insert((p, out_trade_no.to_string()), notify);
    }

    /// Ends a held Alipay refund (`REFUND_SUCCESS` from now on in the refund query) and sends
    /// its notification.
    pub async fn finish_alipay_refund(&self, out_request_no: &str) -> Result<SandboxNotification> {
        alipay::finish_refund(&self.inner, out_request_no)
            .await
            .ok_or_else(|| anyhow!("no held Alipay refund {out_request_no}"))
    }

    /// Ends a held WeChat refund like [`finish_refund`](Self::finish_refund), but the
    /// notification is lost: only the refund query tells.
    pub fn finish_refund_silently(&self, out_refund_no: &str, status: &str) -> Result<()> {
        wechat::settle_refund(&self.inner, out_refund_no, status)
            .map(|_| ())
            .ok_or_else(|| anyhow!("no WeChat refund {out_refund_no}"))
    }

    /// Every API call is answered with this HTTP status (WeChat `SYSTEM_ERROR`; Alipay answers
    /// 200 with code `20000`, as its gateway does), until `None`.
    pub fn fail_with(&self, status: Option<u16>) {
        self.inner.lock().failure = status;
    }

    /// Every API call waits this long before it is answered (client timeouts).
    pub fn set_delay(&self, delay: Duration) {
        self.inner.lock().delay = delay;
    }

    /// Ends a held WeChat refund (`SUCCESS`, `ABNORMAL` or `CLOSED`) and sends its notification.
    pub async fn finish_refund(&self, out_refund_no: &str, status: &str) -> Result<SandboxNotification> {
        wechat::finish_refund(&self.inner, out_refund_no, status)
            .await
            .ok_or_else(|| anyhow!("no WeChat refund {out_refund_no}"))
    }

    pub fn calls(&self) -> Vec<SandboxCall> {
        self.inner.lock().calls.clone()
    }

    pub fn notifications(&self) -> Vec<SandboxNotification> {
        self.inner.lock().notifications.clone()
    }

    /// Waits until `n` notifications were sent (refund notifications go out after the answer).
    pub async fn wait_notifications(&self, n: usize, within: Duration) -> Result<Vec<SandboxNotification>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let sent = self.notifications();
            if sent.len() >= n {
                return Ok(sent);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(anyhow!("{} notification(s) sent, expected {n}", sent.len()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
