//! Where alerts go, as configured: `FITORDER_ALERT_WEBHOOKS` lists channels, separated by
//! commas or white space: `[wecom:|dingtalk:|feishu:|webhook:]URL[#SECRET]`. Without a prefix
//! the kind follows from the host (`qyapi.weixin.qq.com`, `oapi.dingtalk.com`,
//! `open.feishu.cn`/`open.larksuite.com`; anything else is a generic webhook). `#SECRET` is the
//! signing secret of DingTalk's 加签 setting or of Feishu's 签名校验 setting (the fragment of a
//! URL is never sent anywhere). Sending is [`crate::alerts::channels`]'.

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    WeCom,
    DingTalk,
    Feishu,
    Webhook,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::WeCom => "wecom",
            ChannelKind::DingTalk => "dingtalk",
            ChannelKind::Feishu => "feishu",
            ChannelKind::Webhook => "webhook",
        }
    }
}

/// One configured channel. Its `id` (kind and a hash of the URL) is what the database stores:
/// the URL carries the robot's access token and never leaves the configuration.
#[derive(Clone, PartialEq, Eq)]
pub struct Channel {
    pub kind: ChannelKind,
    pub url: String,
    pub secret: Option<String>,
    pub id: String,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL (its token) nor the secret.
        f.debug_struct("Channel")
            .field("id", &self.id)
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

impl Channel {
    pub fn parse(entry: &str) -> Result<Channel, String> {
        let entry = entry.trim();
        let (explicit, rest) = match entry.split_once(':') {
            Some((p @ ("wecom" | "dingtalk" | "feishu" | "webhook"), rest)) => (Some(p), rest),
            _ => (None, entry),
        };
        let (url, secret) = match rest.split_once('#') {
            Some((u, s)) if !s.is_empty() => (u.to_string(), Some(s.to_string())),
            Some((u, _)) => (u.to_string(), None),
            None => (rest.to_string(), None),
        };
        let Some(after_scheme) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
            return Err(format!("an entry is not an http(s) URL (entry {})", redacted(entry)));
        };
        let host = after_scheme
            .split(['/', '?'])
            .next()
            .unwrap_or_default()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let kind = match explicit {
            Some("wecom") => ChannelKind::WeCom,
            Some("dingtalk") => ChannelKind::DingTalk,
            Some("feishu") => ChannelKind::Feishu,
            Some(_) => ChannelKind::Webhook,
            None => match host.as_str() {
                "qyapi.weixin.qq.com" => ChannelKind::WeCom,
                "oapi.dingtalk.com" => ChannelKind::DingTalk,
                "open.feishu.cn" | "open.larksuite.com" => ChannelKind::Feishu,
                _ => ChannelKind::Webhook,
            },
        };
        let digest = hex::encode(Sha256::digest(url.as_bytes()));
        Ok(Channel {
            id: format!("{}-{}", kind.as_str(), &digest[..10]),
            kind,
            url,
            secret,
        })
    }
}

/// A configuration entry shown in an error: scheme and host only.
fn redacted(entry: &str) -> String {
    entry.chars().take(12).collect::<String>() + "…"
}

pub fn parse_list(raw: &str) -> Result<Vec<Channel>, String> {
    let mut out: Vec<Channel> = vec![];
    for entry in raw.split([',', ' ', '\n', '\t']).filter(|e| !e.trim().is_empty()) {
        let c = Channel::parse(entry)?;
        if !out.iter().any(|o| o.id == c.id) {
            out.push(c);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_host_or_the_prefix_and_secrets_stay_out_of_ids_and_debug() {
        let list = parse_list(
            "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=K1, \
             https://oapi.dingtalk.com/robot/send?access_token=T#SECabc\n\
             feishu:http://127.0.0.1:9/hook/x#s3 https://alerts.example/hook dingtalk:http://127.0.0.1:9/d",
        )
        .unwrap();
        let kinds: Vec<_> = list.iter().map(|c| c.kind).collect();
        assert_eq!(
            kinds,
            [
                ChannelKind::WeCom,
                ChannelKind::DingTalk,
                ChannelKind::Feishu,
                ChannelKind::Webhook,
                ChannelKind::DingTalk
            ]
        );
        assert_eq!(list[1].secret.as_deref(), Some("SECabc"));
        assert_eq!(list[1].url, "https://oapi.dingtalk.com/robot/send?access_token=T");
        assert_eq!(list[2].url, "http://127.0.0.1:9/hook/x");
        let shown = format!("{list:?}");
        assert!(!shown.contains("SECabc") && !shown.contains("access_token") && !shown.contains("K1"));
        assert!(parse_list("ftp://x").is_err());
    }
}
