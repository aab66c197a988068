//! Writers of both bills in the providers' formats, for the sandbox's bill downloads, tests and
//! the benchmark. Development only: fitorder reads bills (`providers::bills`), never writes
//! them. The bill parsers' own tests compile this file too (`reconciliation/bills/mod.rs`,
//! `#[cfg(test)] mod write`), so it names what it uses by paths both crates have.

use std::io::{self, BufWriter, Write};

use chrono::NaiveDate;
use chrono::{Datelike, NaiveDateTime, Timelike};
use encoding_rs::GBK;

use crate::domain::money::format_yuan;
use fitorder_providers::bills::{BillKind, BillRow};

/// The header of a WeChat trade bill as the provider writes it (27 columns).
pub(super) const WECHAT_HEADER: [&str; 27] = [
    "交易时间",
    "公众账号ID",
    "商户号",
    "特约商户号",
    "设备号",
    "微信订单号",
    "商户订单号",
    "用户标识",
    "交易类型",
    "交易状态",
    "付款银行",
    "货币种类",
    "应结订单金额",
    "代金券金额",
    "微信退款单号",
    "商户退款单号",
    "退款金额",
    "充值券退款金额",
    "退款类型",
    "退款状态",
    "商品名称",
    "商户数据包",
    "手续费",
    "费率",
    "订单金额",
    "申请退款金额",
    "费率备注",
];

/// Writes a WeChat trade bill in the provider's format (backticks, yuan, summary lines).
///
/// Payment rows are written `SUCCESS`, refund rows `REFUND` as WeChat writes them (应结订单金额 and
/// 订单金额 `0.00`, the amount in 退款金额 and 申请退款金额), other rows `REVOKED`. The fee is the
/// usual 0.6 %, negative on refunds, with WeChat's five decimals. Output is buffered internally.
pub fn write_wechat_bill<W: Write>(out: W, rows: &[BillRow], crlf: bool, bom: bool) -> io::Result<()> {
    let mut out = BufWriter::new(out);
    let eol = if crlf { "\r\n" } else { "\n" };
    if bom {
        out.write_all(b"\xEF\xBB\xBF")?;
    }
    write!(out, "{}{eol}", WECHAT_HEADER.join(","))?;

    let (mut settle_total, mut refund_total, mut fee_total) = (0i64, 0i64, 0i64);
    let mut text = String::new();
    for row in rows {
        let is_refund = row.kind == BillKind::Refund;
        let amount = format_yuan(row.amount_cents);
        // Fee in units of 0.00001 yuan (= 0.001 cent): 0.6 % of `cents` is `cents × 6` units.
        let fee = match row.kind {
            BillKind::Payment => row.amount_cents * 6,
            BillKind::Refund => -row.amount_cents * 6,
            BillKind::Other => 0,
        };
        let settle = if is_refund { "0.00".to_owned() } else { amount.clone() };
        if !is_refund {
            settle_total += row.amount_cents;
        }
        fee_total += fee;
        let (refund_id, refund_no, refund_amount, refund_type, refund_state) = if is_refund {
            refund_total += row.amount_cents;
            let id = row.provider_refund_id.as_deref().unwrap_or("");
            (
                id,
                row.refund_no.as_deref().unwrap_or(""),
                amount.as_str(),
                "ORIGINAL",
                "SUCCESS",
            )
        } else {
            ("0", "0", "0.00", "", "")
        };
        let state = match row.kind {
            BillKind::Payment => "SUCCESS",
            BillKind::Refund => "REFUND",
            BillKind::Other => "REVOKED",
        };
        let time = row.trade_time.map(format_time).unwrap_or_default();
        let fee = format_fee(fee);
        let cells: [&str; 27] = [
            &time,
            "wx2421b1c4370ec43b",
            "1900000109",
            "0",
            "",
            &row.provider_txn_id,
            &row.out_trade_no,
            "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o",
            "JSAPI",
            state,
            "OTHERS",
            "CNY",
            &settle,
            "0.00",
            refund_id,
            refund_no,
            refund_amount,
            "0.00",
            refund_type,
            refund_state,
            "Monthly card",
            "",
            &fee,
            "0.60%",
            &settle,
            refund_amount,
            "",
        ];
        text.clear();
        csv_line(&mut text, &cells, "`")?;
        text.push_str(eol);
        out.write_all(text.as_bytes())?;
    }

    write!(
        out,
        "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额{eol}"
    )?;
    let totals = [
        rows.len().to_string(),
        format_yuan(settle_total),
        format_yuan(refund_total),
        "0.00".to_owned(),
        format_fee(fee_total),
        format_yuan(settle_total),
        format_yuan(refund_total),
    ];
    text.clear();
    csv_line(&mut text, &totals.each_ref().map(String::as_str), "`")?;
    text.push_str(eol);
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Formats a WeChat fee given in units of 0.00001 yuan (`60000` → `"0.60000"`).
fn format_fee(units: i64) -> String {
    let sign = if units < 0 { "-" } else { "" };
    let abs = units.unsigned_abs();
    format!("{sign}{}.{:05}", abs / 100_000, abs % 100_000)
}

/// The header of an Alipay business detail bill as the provider writes it (25 columns).
pub(super) const ALIPAY_HEADER: [&str; 25] = [
    "支付宝交易号",
    "商户订单号",
    "业务类型",
    "商品名称",
    "创建时间",
    "完成时间",
    "门店编号",
    "门店名称",
    "操作员",
    "终端号",
    "对方账户",
    "订单金额（元）",
    "商家实收（元）",
    "支付宝红包（元）",
    "集分宝（元）",
    "支付宝优惠（元）",
    "商家优惠（元）",
    "券核销金额（元）",
    "券名称",
    "商家红包消费金额（元）",
    "卡消费金额（元）",
    "退款批次号/请求号",
    "服务费（元）",
    "分润（元）",
    "备注",
];

/// Writes an Alipay bill (comment header, tab-ended identifiers, 交易/退款, `#` summary lines),
/// UTF-8 or GBK (`gbk: true`), with CRLF line ends as Alipay exports it.
///
/// Payment rows are `交易`, refund rows `退款` with negative amounts, other rows `其他` with the
/// amount as is. 商家实收 equals 订单金额 (no discounts). The dates in the comment header come
/// from the earliest trade time. Text GBK cannot represent is an `InvalidData` error.
pub fn write_alipay_bill<W: Write>(out: W, rows: &[BillRow], gbk: bool) -> io::Result<()> {
    let mut out = BufWriter::new(out);
    let day = rows
        .iter()
        .filter_map(|r| r.trade_time)
        .min()
        .map_or(NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default(), |t| t.date());
    let next_day = day.succ_opt().unwrap_or(day);
    let date = |d: NaiveDate| d.format("%Y年%m月%d日").to_string();
    let mut encoder = GbkCells::default();
    let mut line = |text: &str| -> io::Result<()> {
        if gbk {
            // GBK is stateless, so encoding comma-separated pieces equals encoding the line.
            for (i, piece) in text.split(',').enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(encoder.encode(piece)?)?;
            }
        } else {
            out.write_all(text.as_bytes())?;
        }
        out.write_all(b"\r\n")
    };

    line("#支付宝业务明细查询")?;
    line("#账号：[20881234567890120156]")?;
    line(&format!(
        "#起始日期：[{} 00:00:00]   终止日期：[{} 00:00:00]",
        date(day),
        date(next_day)
    ))?;
    line("#-----------------------------------------业务明细列表----------------------------------------")?;
    line(&ALIPAY_HEADER.join(","))?;

    let (mut payments, mut paid, mut refunds, mut refunded) = (0usize, 0i64, 0usize, 0i64);
    let mut text = String::new();
    for row in rows {
        let (business, signed) = match row.kind {
            BillKind::Payment => {
                payments += 1;
                paid += row.amount_cents;
                ("交易", row.amount_cents)
            }
            BillKind::Refund => {
                refunds += 1;
                refunded -= row.amount_cents;
                ("退款", -row.amount_cents)
            }
            BillKind::Other => ("其他", row.amount_cents),
        };
        let amount = format_yuan(signed);
        let time = row.trade_time.map(format_time).unwrap_or_default();
        let refund_no = match (&row.kind, &row.refund_no) {
            (BillKind::Refund, Some(no)) => format!("{no}\t"),
            _ => String::new(),
        };
        let cells: [&str; 25] = [
            &format!("{}\t", row.provider_txn_id),
            &format!("{}\t", row.out_trade_no),
            business,
            "健身月卡",
            &time,
            &time,
            "",
            "",
            "",
            "",
            "138****0000",
            &amount,
            &amount,
            "0.00",
            "0.00",
            "0.00",
            "0.00",
            "0.00",
            "",
            "0.00",
            "0.00",
            &refund_no,
            "0.00",
            "0.00",
            "",
        ];
        text.clear();
        csv_line(&mut text, &cells, "")?;
        line(&text)?;
    }

    line("#-----------------------------------------业务明细列表结束------------------------------------")?;
    line(&format!(
        "#交易合计：{payments}笔，商家实收共{}元，商家优惠共0.00元",
        format_yuan(paid)
    ))?;
    line(&format!(
        "#退款合计：{refunds}笔，商家实收退款共{}元，商家优惠退款共0.00元",
        format_yuan(refunded)
    ))?;
    line(&format!("#导出时间：[{} 09:00:00]", date(next_day)))?;
    out.flush()
}

/// Encodes text to GBK, remembering recent non-ASCII pieces. encoding_rs's default build encodes
/// GB hanzi with a slow table search (fine in release, seconds per 100k rows in a debug build),
/// and bill cells repeat (业务类型, 商品名称), so each distinct piece is encoded once. The memory
/// stays bounded: the cache is dropped when it gets large.
#[derive(Default)]
struct GbkCells {
    cache: std::collections::HashMap<String, Vec<u8>>,
}

impl GbkCells {
    const MAX_CACHED: usize = 256;

    fn encode<'a>(&'a mut self, text: &'a str) -> io::Result<&'a [u8]> {
        if text.is_ascii() {
            return Ok(text.as_bytes());
        }
        if !self.cache.contains_key(text) {
            let (bytes, _, unmappable) = GBK.encode(text);
            if unmappable {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not representable in GBK: {text}"),
                ));
            }
            if self.cache.len() >= Self::MAX_CACHED {
                self.cache.clear();
            }
            self.cache.insert(text.to_owned(), bytes.into_owned());
        }
        Ok(&self.cache[text])
    }
}

/// Appends `cells` to `line` as one CSV line (without its end), each cell led by `prefix` (WeChat's
/// backtick). A cell containing a comma or a quote is quoted. A line break inside a cell cannot
/// be represented in a line-based bill and is an `InvalidInput` error.
fn csv_line(line: &mut String, cells: &[&str], prefix: &str) -> io::Result<()> {
    for (i, cell) in cells.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        let mut quote = false;
        for b in cell.bytes() {
            match b {
                b'\n' | b'\r' => {
                    let why = format!("line break in a bill cell: {cell:?}");
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
                }
                b',' | b'"' => quote = true,
                _ => {}
            }
        }
        if quote {
            line.push('"');
            line.push_str(prefix);
            line.push_str(&cell.replace('"', "\"\""));
            line.push('"');
        } else {
            line.push_str(prefix);
            line.push_str(cell);
        }
    }
    Ok(())
}

/// Formats a timestamp as the bills write it (`TIME_FORMAT`), without interpreting a format
/// string per row.
fn format_time(t: NaiveDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}
