//! WeChat Pay's keys and certificates: the configuration loaded ([`WechatKeys`],
//! `wechat_keys.rs`), the `/v3/certificates` answer decrypted (AEAD_AES_256_GCM with the APIv3
//! key, `aead.rs`) into platform certificates (`certificates.rs`), the [`Keyring`] chosen by
//! `Wechatpay-Serial` (`keyring.rs`), the platform certificates kept in the database, so every
//! instance verifies with the same set (`storage.rs`), and the in-process [`SharedKeyring`]
//! filled from it (`refresh.rs`). The HTTP call to `GET /v3/certificates` is the caller's: hand
//! its answer body to [`SharedKeyring::refresh_from_answer`]. The dev sandbox's self-signed
//! certificates and its `/v3/certificates` answer are the sandbox's own
//! (`fitorder-dev`, `sandbox_server/platform_certs.rs`).
//!
//! Refresh policy: at least every [`REFRESH_EVERY_SECS`] (WeChat: "间隔应小于12小时"), by the
//! background task, and when a notification or answer names an unknown `Wechatpay-Serial` — in
//! both modes: with a 微信支付公钥 configured, certificates still come during WeChat's switch.
//! The known serials are held in memory; an unknown one costs no database work on the request
//! path: it may start one refresh ([`SharedKeyring::unknown_serial`]), single-flight and at most
//! once per [`UNKNOWN_REFRESH_MIN_INTERVAL_SECS`] per process, run in a task of its own, which
//! the request waits for (bounded) before it looks the serial up again in memory. That refresh
//! fetches the certificates when it wins the claim ([`SharedKeyring::may_force_refresh`]: at most
//! once per [`FORCE_MIN_INTERVAL_SECS`] per process and across instances), else reloads what
//! another instance stored. Unknown serials are counted (`fitorder_wechat_unknown_serials_total`,
//! by outcome), so forged notifications naming made-up serials cost one refresh per interval
//! however many there are.

mod aead;
mod certificates;
mod keyring;
mod refresh;
mod storage;
#[cfg(test)]
mod tests;
mod wechat_keys;

pub use aead::{aead_decrypt, CERTIFICATE_ASSOCIATED_DATA, WECHAT_AEAD_ALGORITHM};
pub use certificates::{decrypt_certificates, PlatformCert};
pub use keyring::{Keyring, VerifyError};
pub use refresh::{
    Refresh, SharedKeyring, FORCE_MIN_INTERVAL_SECS, REFRESH_EVERY_SECS, UNKNOWN_REFRESH_MIN_INTERVAL_SECS,
    UNKNOWN_SERIAL_WAIT,
};
pub use storage::{last_success, load, store, REFRESH_SCOPE};
pub use wechat_keys::WechatKeys;
