//! The trade bills of what the sandbox took, as both providers deliver them.
//!
//! - WeChat Pay: `GET /v3/bill/tradebill?bill_date=…&bill_type=ALL&tar_type=GZIP` answers (signed)
//!   `hash_type: SHA1`, `hash_value` (of the *unpacked* bill) and a `download_url`; a signed
//!   `GET` of that URL gives the gzip. A day without trades is `400 NO_STATEMENT_EXIST`.
//! - Alipay: `alipay.data.dataservice.bill.downloadurl.query` (`bill_type: trade`) answers a
//!   `bill_download_url`; its zip holds `{pid}_{yyyyMMdd}_业务明细.csv` and
//!   `…_业务明细(汇总).csv`, both GBK, the names GBK without the UTF-8 flag, as Alipay ships
//!   them. A day without trades is `isp.bill_not_exist`.
//!
//! The rows are written by `dev::bill_writers::write_*` in the providers' layouts; the zip
//! container is written here by hand from APPNOTE.TXT (stored entries), not by the zip crate,
//! so names are raw GBK bytes. Controls for tests: [`BillControls`].
//!
//! A bill can also be published whole for a day ([`publish`]): packed once, ahead of time, and
//! served instead of the rows of the trades taken — how the benchmark hands fitorder a bill of a
//! million rows through the fetch path without a million trades in memory.

use std::io::Write;

use chrono::NaiveDate;
use sha1::{Digest, Sha1};

use super::{alnum, State, ALIPAY, WECHAT_PAY};
use crate::bill_writers::{write_alipay_bill, write_wechat_bill};
use crate::providers::bills::{BillKind, BillRow};

/// How the sandbox's bill service misbehaves, for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BillControls {
    /// The bill is not made yet (WeChat `STATEMENT_CREATING`, Alipay `isp.bill_not_exist`).
    pub not_ready: bool,
    /// WeChat: the answer's `hash_value` is not the SHA1 of the bill.
    pub wrong_sha1: bool,
    /// The next download URL handed out has lapsed when it is fetched (once).
    pub lapse_once: bool,
}

/// A download URL's content.
pub(super) struct Download {
    pub provider: &'static str,
    /// Shared with the published bill it came from, if any (a clone is a reference count).
    pub bytes: bytes::Bytes,
    /// Handed out lapsed ([`BillControls::lapse_once`]).
    pub lapsed: bool,
}

/// What a bill request gets.
pub(super) enum Bill {
    NotReady,
    /// No trade that day.
    Nothing,
    /// `(token, SHA1 of the unpacked bill)`.
    Ready(String, String),
}

/// The rows of `provider`'s bill of business day `date` (Asia/Shanghai): payments by when they
/// were paid, refunds by when they were asked for (WeChat books a refund then).
fn rows(s: &State, provider: &'static str, date: NaiveDate) -> Vec<BillRow> {
    let day = |t: chrono::DateTime<chrono::Utc>| t.with_timezone(&chrono_tz::Asia::Shanghai).naive_local();
    let mut trades: Vec<_> = s.trades.values().filter(|t| t.provider == provider).collect();
    trades.sort_by_key(|t| (t.paid_at, t.out_trade_no.clone()));
    let mut out = vec![];
    for t in &trades {
        let (Some(paid), Some(txn)) = (t.paid_at, t.txn_id.as_ref()) else {
            continue;
        };
        let booked = if s.booked_next_day.contains(&(provider, t.out_trade_no.clone())) {
            day(paid).date().succ_opt().unwrap_or(date)
        } else {
            day(paid).date()
        };
        if booked == date {
            out.push(BillRow {
                line: 0,
                kind: BillKind::Payment,
                out_trade_no: t.out_trade_no.clone(),
                provider_txn_id: txn.clone(),
                amount_cents: t.amount_cents,
                refund_no: None,
                provider_refund_id: None,
                trade_time: Some(day(paid)),
            });
        }
        for r in &t.refunds {
            let at = r.success_time.unwrap_or(r.created_at);
            if day(at).date() == date && (provider == WECHAT_PAY || r.status == "REFUND_SUCCESS") {
                out.push(BillRow {
                    line: 0,
                    kind: BillKind::Refund,
                    out_trade_no: t.out_trade_no.clone(),
                    provider_txn_id: txn.clone(),
                    amount_cents: r.amount_cents,
                    refund_no: Some(r.out_refund_no.clone()),
                    provider_refund_id: (provider == WECHAT_PAY).then(|| r.refund_id.clone()),
                    trade_time: Some(day(at)),
                });
            }
        }
    }
    out
}

/// A bill packed ahead of time: the archive as served and the SHA1 of the unpacked bill.
#[derive(Clone)]
pub(super) struct Published {
    pub bytes: bytes::Bytes,
    pub sha1: String,
}

/// Packs `rows` as `provider`'s bill (WeChat: gzip of the CSV; Alipay: the zip of detail and
/// summary). Blocking: a million rows take seconds.
pub(super) fn publish(
    provider: &'static str,
    date: NaiveDate,
    rows: &[BillRow],
    pid: &str,
) -> Result<Published, String> {
    let (bytes, sha1) = pack(provider, date, rows, pid, flate2::Compression::fast())?;
    Ok(Published {
        bytes: bytes.into(),
        sha1,
    })
}

/// Makes `provider`'s bill of `date` and a download token for it.
pub(super) fn prepare(s: &mut State, provider: &'static str, date: NaiveDate, pid: &str) -> Result<Bill, String> {
    if s.bill_controls.not_ready {
        return Ok(Bill::NotReady);
    }
    let (bytes, sha1) = match s.published.get(&(provider, date)) {
        Some(p) => (p.bytes.clone(), p.sha1.clone()),
        None => {
            let rows = rows(s, provider, date);
            if rows.is_empty() {
                return Ok(Bill::Nothing);
            }
            let (bytes, sha1) = pack(provider, date, &rows, pid, flate2::Compression::default())?;
            (bytes::Bytes::from(bytes), sha1)
        }
    };
    let sha1 = if s.bill_controls.wrong_sha1 {
        hex::encode(Sha1::digest(b"not this bill"))
    } else {
        sha1
    };
    let lapsed = std::mem::take(&mut s.bill_controls.lapse_once);
    let token = alnum(24);
    s.downloads.insert(
        token.clone(),
        Download {
            provider,
            bytes,
            lapsed,
        },
    );
    Ok(Bill::Ready(token, sha1))
}

/// The archive of `rows` as `provider` ships it, and the SHA1 of the unpacked bill.
fn pack(
    provider: &'static str,
    date: NaiveDate,
    rows: &[BillRow],
    pid: &str,
    level: flate2::Compression,
) -> Result<(Vec<u8>, String), String> {
    Ok(if provider == ALIPAY {
        let mut detail = vec![];
        write_alipay_bill(&mut detail, rows, true).map_err(|e| e.to_string())?;
        let sha1 = hex::encode(Sha1::digest(&detail));
        let paid: i64 = rows
            .iter()
            .filter(|r| r.kind == BillKind::Payment)
            .map(|r| r.amount_cents)
            .sum();
        let summary = format!(
            "#支付宝业务汇总查询\r\n#账号：[{pid}]\r\n门店编号,门店名称,交易订单总笔数,退款订单总笔数,订单金额（元）\r\n,,{},{},{}.{:02}\r\n#导出时间：[{}]\r\n",
            rows.iter().filter(|r| r.kind == BillKind::Payment).count(),
            rows.iter().filter(|r| r.kind == BillKind::Refund).count(),
            paid / 100,
            paid % 100,
            chrono::Utc::now().with_timezone(&chrono_tz::Asia::Shanghai).format("%Y-%m-%d %H:%M:%S"),
        );
        let stem = format!("{pid}_{}", date.format("%Y%m%d"));
        let zip = stored_zip(&[
            (gbk(&format!("{stem}_业务明细(汇总).csv")), gbk(&summary)),
            (gbk(&format!("{stem}_业务明细.csv")), detail),
        ]);
        (zip, sha1)
    } else {
        let mut bill = vec![];
        write_wechat_bill(&mut bill, rows, true, false).map_err(|e| e.to_string())?;
        let sha1 = hex::encode(Sha1::digest(&bill));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), level);
        gz.write_all(&bill).map_err(|e| e.to_string())?;
        (gz.finish().map_err(|e| e.to_string())?, sha1)
    })
}

/// The bytes behind `token` for `provider`; None when it is unknown or has lapsed.
pub(super) fn take(s: &mut State, provider: &'static str, token: &str) -> Option<bytes::Bytes> {
    let d = s.downloads.get(token)?;
    if d.provider != provider {
        return None;
    }
    if d.lapsed {
        s.downloads.remove(token);
        return None;
    }
    Some(d.bytes.clone())
}

fn gbk(text: &str) -> Vec<u8> {
    encoding_rs::GBK.encode(text).0.into_owned()
}

/// A zip of stored entries (APPNOTE.TXT 4.3: local headers, central directory, end record),
/// the names as given (no UTF-8 flag).
fn stored_zip(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let mut crc = flate2::Crc::new();
        crc.update(data);
        let offset = out.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&20u16.to_le_bytes()); // version needed to extract
            v.extend_from_slice(&0u16.to_le_bytes()); // flags: bit 11 (UTF-8) unset
            v.extend_from_slice(&0u16.to_le_bytes()); // method: stored
            v.extend_from_slice(&0u16.to_le_bytes()); // time
            v.extend_from_slice(&0x5B81u16.to_le_bytes()); // date
            v.extend_from_slice(&crc.sum().to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(data.len() as u32).to_le_bytes());
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra field length
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(name);
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // version made by
        common(&mut central);
        central.extend_from_slice(&[0; 6]); // comment length, disk number, internal attributes
        central.extend_from_slice(&0u32.to_le_bytes()); // external attributes
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name);
    }
    let (cd_offset, cd_len) = (out.len() as u32, central.len() as u32);
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&cd_len.to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}
