//! Where alerts go: WeCom (企业微信) group robots, DingTalk (钉钉) robots, Feishu (飞书) bots and
//! a generic JSON webhook in the shape Alertmanager sends to its webhook receivers. Each robot
//! answers HTTP 200 with an error code in the body when it refuses a message (a wrong signature,
//! a rate limit): only code 0 is a delivery. The channels are configured in
//! [`crate::config::alert_channels`].

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

pub use crate::config::alert_channels::{parse_list, Channel, ChannelKind};

/// What is said, whatever the channel.
#[derive(Debug, Clone)]
pub struct Message {
    pub alert_id: i64,
    pub cause: String,
    pub title: String,
    pub lines: Vec<String>,
    pub order_no: Option<String>,
    pub trace_id: String,
    pub ops_url: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl Message {
    pub fn heading(&self) -> String {
        format!("【fitorder 告警】{}", self.title)
    }

    /// Plain text, for Feishu and the generic webhook.
    pub fn text(&self) -> String {
        let mut s = self.heading();
        for l in &self.lines {
            s.push('\n');
            s.push_str(l);
        }
        s.push_str(&format!(
            "\n追踪号(trace id):{}\n运维页面:{}",
            self.trace_id, self.ops_url
        ));
        s
    }

    /// Markdown as WeCom and DingTalk render it (both accept this subset).
    pub fn markdown(&self, limit_bytes: usize) -> String {
        let mut s = format!("### {}\n", self.heading());
        for l in &self.lines {
            let line = format!("> {}\n", l);
            if s.len() + line.len() + 200 > limit_bytes {
                s.push_str("> …\n");
                break;
            }
            s.push_str(&line);
        }
        s.push_str(&format!(
            "> 追踪号(trace id):`{}`\n\n[打开运维页面]({})",
            self.trace_id, self.ops_url
        ));
        s
    }
}

type HmacSha256 = Hmac<Sha256>;

/// DingTalk's 加签: HMAC-SHA256 keyed with the secret over `timestamp + "\n" + secret`
/// (timestamp in milliseconds), base64; sent URL-encoded as the `sign` query parameter.
pub fn dingtalk_sign(secret: &str, timestamp_ms: i64) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(format!("{timestamp_ms}\n{secret}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// Feishu's 签名校验: `timestamp + "\n" + secret` (timestamp in seconds) is the HMAC-SHA256
/// *key* over an empty message, base64; sent in the body with the timestamp.
pub fn feishu_sign(secret: &str, timestamp_s: i64) -> String {
    let mac = HmacSha256::new_from_slice(format!("{timestamp_s}\n{secret}").as_bytes()).expect("any key length");
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The request for one channel: URL and JSON body.
pub fn request(channel: &Channel, m: &Message, now: chrono::DateTime<chrono::Utc>) -> (String, Value) {
    match channel.kind {
        // WeCom's markdown content is limited to 4096 bytes.
        ChannelKind::WeCom => (
            channel.url.clone(),
            json!({"msgtype": "markdown", "markdown": {"content": m.markdown(4096)}}),
        ),
        ChannelKind::DingTalk => {
            let url = match &channel.secret {
                Some(secret) => {
                    let ts = now.timestamp_millis();
                    let sign: String = form_urlencoded::byte_serialize(dingtalk_sign(secret, ts).as_bytes()).collect();
                    let sep = if channel.url.contains('?') { '&' } else { '?' };
                    format!("{}{sep}timestamp={ts}&sign={sign}", channel.url)
                }
                None => channel.url.clone(),
            };
            (
                url,
                json!({"msgtype": "markdown", "markdown": {"title": m.heading(), "text": m.markdown(20_000)}}),
            )
        }
        ChannelKind::Feishu => {
            let mut paragraphs: Vec<Value> = m.lines.iter().map(|l| json!([{"tag": "text", "text": l}])).collect();
            paragraphs.push(json!([{"tag": "text", "text": format!("追踪号(trace id):{}", m.trace_id)}]));
            paragraphs.push(json!([{"tag": "a", "text": "打开运维页面", "href": m.ops_url}]));
            let mut body = json!({
                "msg_type": "post",
                "content": {"post": {"zh_cn": {"title": m.heading(), "content": paragraphs}}},
            });
            if let Some(secret) = &channel.secret {
                let ts = now.timestamp();
                body["timestamp"] = json!(ts.to_string());
                body["sign"] = json!(feishu_sign(secret, ts));
            }
            (channel.url.clone(), body)
        }
        // The payload Alertmanager posts to a webhook receiver (version 4), so that anything
        // that takes Alertmanager's webhooks takes fitorder's.
        ChannelKind::Webhook => (
            channel.url.clone(),
            json!({
                "version": "4",
                "groupKey": format!("fitorder:{}", m.alert_id),
                "status": "firing",
                "receiver": "fitorder",
                "groupLabels": {"alertname": m.cause},
                "commonLabels": {"alertname": m.cause, "service": "fitorder"},
                "commonAnnotations": {"summary": m.heading()},
                "externalURL": m.ops_url,
                "alerts": [{
                    "status": "firing",
                    "labels": {"alertname": m.cause, "service": "fitorder", "severity": "critical",
                               "trace_id": m.trace_id, "order_no": m.order_no.clone().unwrap_or_default()},
                    "annotations": {"summary": m.heading(), "description": m.text()},
                    "startsAt": m.created_at.to_rfc3339(),
                    "endsAt": "0001-01-01T00:00:00Z",
                    "generatorURL": m.ops_url,
                    "fingerprint": format!("{:016x}", m.alert_id),
                }],
            }),
        ),
    }
}

/// Whether a robot's answer is a delivery: HTTP 2xx and, for the robots, code 0 in the body
/// (WeCom and DingTalk `errcode`, Feishu `code`, or `StatusCode` in its older answers).
pub fn check_answer(kind: ChannelKind, status: u16, body: &str) -> Result<(), String> {
    let snippet: String = body.chars().take(200).collect();
    if !(200..300).contains(&status) {
        return Err(format!("HTTP {status}: {snippet}"));
    }
    if kind == ChannelKind::Webhook {
        return Ok(());
    }
    let v: Value = serde_json::from_str(body).map_err(|_| format!("HTTP {status} but not JSON: {snippet}"))?;
    let (code, msg) = match kind {
        ChannelKind::WeCom | ChannelKind::DingTalk => (v["errcode"].as_i64(), v["errmsg"].as_str()),
        // A generic webhook returned above.
        ChannelKind::Feishu | ChannelKind::Webhook => (
            v["code"].as_i64().or_else(|| v["StatusCode"].as_i64()),
            v["msg"].as_str().or_else(|| v["StatusMessage"].as_str()),
        ),
    };
    match code {
        Some(0) => Ok(()),
        Some(c) => Err(format!("{} refused: code {c} {}", kind.as_str(), msg.unwrap_or(""))),
        None => Err(format!("{} answered without a code: {snippet}", kind.as_str())),
    }
}

/// Sends one message; `Err` says what went wrong (never the URL: it holds the token).
pub async fn send(http: &reqwest::Client, channel: &Channel, m: &Message) -> Result<(), String> {
    let (url, body) = request(channel, m, chrono::Utc::now());
    let resp = http
        .post(&url)
        .header("X-Trace-Id", &m.trace_id)
        .json(&body)
        .send()
        .await
        .map_err(|e| {
            let kind = if e.is_timeout() {
                "timed out"
            } else if e.is_connect() {
                "could not connect"
            } else {
                "request failed"
            };
            format!("{}: {kind}: {}", channel.kind.as_str(), e.without_url())
        })?;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    check_answer(channel.kind, status, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vector published with a DingTalk client (the `dingding` crate's test): timestamp
    /// 1700000000000, secret "secret".
    #[test]
    fn dingtalk_signature_matches_a_published_vector() {
        let sign = dingtalk_sign("secret", 1_700_000_000_000);
        let encoded: String = form_urlencoded::byte_serialize(sign.as_bytes()).collect();
        assert_eq!(encoded, "OuzzJR5%2BxZ4%2FEYwqtNt6sMYZQMTa%2FHEGvc9miJe7XzY%3D");
    }

    #[test]
    fn robots_answering_200_with_an_error_code_are_failures() {
        assert!(check_answer(ChannelKind::WeCom, 200, r#"{"errcode":0,"errmsg":"ok"}"#).is_ok());
        assert!(check_answer(
            ChannelKind::WeCom,
            200,
            r#"{"errcode":45009,"errmsg":"api freq out of limit"}"#
        )
        .unwrap_err()
        .contains("45009"));
        assert!(check_answer(
            ChannelKind::DingTalk,
            200,
            r#"{"errcode":310000,"errmsg":"sign not match"}"#
        )
        .is_err());
        assert!(check_answer(ChannelKind::Feishu, 200, r#"{"code":0,"msg":"success","data":{}}"#).is_ok());
        assert!(check_answer(
            ChannelKind::Feishu,
            200,
            r#"{"StatusCode":0,"StatusMessage":"success"}"#
        )
        .is_ok());
        assert!(check_answer(ChannelKind::Feishu, 200, r#"{"code":19021,"msg":"sign match fail"}"#).is_err());
        assert!(check_answer(ChannelKind::Feishu, 200, "<html>").is_err());
        assert!(check_answer(ChannelKind::Webhook, 204, "").is_ok());
        assert!(check_answer(ChannelKind::Webhook, 500, "oops").is_err());
    }
}
