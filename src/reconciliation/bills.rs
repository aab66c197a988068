//! Streaming parsers (and writers, for tests and benchmarks) of the payment providers' daily bills:
//! the WeChat Pay trade bill (交易账单) and the Alipay business detail (支付宝业务明细).
//!
//! # Decisions
//!
//! * **Bounded memory.** A bill can hold a million rows, so it is read line by line from a
//!   [`BufRead`] into one reused buffer and every row is handed to a callback as soon as it is
//!   parsed; nothing is collected. A single line is capped at [`MAX_LINE_BYTES`] so a corrupt file
//!   without newlines cannot grow the buffer without limit.
//! * **Provisional rows.** Rows reach the callback *before* the summary at the end of the file is
//!   checked (that is the price of streaming). A caller must treat them as provisional, e.g. write
//!   them inside a transaction or into a staging table, and only act on them once `parse` returned
//!   `Ok`. Every malformed row, a missing or disagreeing summary and a truncated file are errors,
//!   so a half-read file never looks like a complete one.
//! * **Columns by header name.** Both providers have reordered and added columns over the years,
//!   so cells are looked up through the header, never by position. Extra columns are ignored.
//! * **Cell counts.** A row must have exactly as many cells as the header. Fewer means a needed
//!   column may be missing; more means an unquoted comma inside a cell (e.g. in 商品名称), which
//!   shifts every column after it. Tolerating "extra but empty" trailing cells is not safe either:
//!   with an empty last column (费率备注, 备注) a shifted row looks exactly like that, and in the
//!   Alipay layout the shift moves 订单金额 while leaving the 商家实收 total intact, so the
//!   summary check would not catch it. (A format with a trailing comma on every line has it on
//!   the header too, and the widths still match.)
//! * **Encoding.** Each line is decoded on its own: valid UTF-8 is used as is, anything else is
//!   decoded as GBK (Alipay exports GBK; an Excel re-save can turn either bill into GBK). The
//!   choice is sticky once a line containing non-ASCII text decided it, so a GBK byte sequence
//!   that happens to be valid UTF-8 later in a GBK file is still read as GBK, and an undecodable
//!   line in a UTF-8 file is reported rather than guessed at. A UTF-8 BOM on line 1 is skipped.
//! * **Money** is integer cents, parsed with [`parse_yuan`], never through floating point. Empty
//!   amount cells count as zero. Refund amounts are reported positive, whatever sign the provider
//!   uses.
//! * **Line numbers** are 1-based physical lines of the file; errors about the end of the file
//!   (truncation) name the line after the last one.

use std::borrow::Cow;
use std::io::{self, BufRead, BufWriter, Read, Write};

use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};
use encoding_rs::GBK;

use crate::domain::money::{format_yuan, parse_yuan};

/// The longest line accepted (1 MiB). Real bill lines are a few hundred bytes.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// The timestamp format of both bills.
const TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S";
/// The same with slashes, as a spreadsheet re-save tends to write it. Accepted, never written.
const TIME_FORMAT_SLASHES: &str = "%Y/%m/%d %H:%M:%S";

/// What a bill row records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BillKind {
    /// A payment: WeChat `SUCCESS`, Alipay `交易`.
    Payment,
    /// A refund: WeChat `REFUND`, Alipay `退款`.
    Refund,
    /// Anything else: WeChat `REVOKED`, Alipay business types other than 交易/退款.
    Other,
}

/// One data row of a bill, in the shape reconciliation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BillRow {
    /// 1-based line number in the file.
    pub line: usize,
    pub kind: BillKind,
    /// 商户订单号. For refunds: the order the refund belongs to.
    pub out_trade_no: String,
    /// 微信订单号 / 支付宝交易号.
    pub provider_txn_id: String,
    /// Payment: 应结订单金额 (WeChat) / 订单金额（元） (Alipay); refund: the refunded amount,
    /// positive; other: 应结订单金额 / 订单金额（元） as written.
    pub amount_cents: i64,
    /// 商户退款单号 (WeChat) / 退款批次号/请求号 (Alipay); refund rows only.
    pub refund_no: Option<String>,
    /// 微信退款单号 (WeChat) for refund rows; always `None` for Alipay.
    pub provider_refund_id: Option<String>,
    /// 交易时间 (WeChat) / 完成时间, or 创建时间 when 完成时间 is empty (Alipay).
    pub trade_time: Option<NaiveDateTime>,
}

/// Totals computed from the rows of a bill that passed every check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BillSummary {
    /// Data rows of every kind.
    pub rows: usize,
    pub payments: usize,
    pub refunds: usize,
    /// Sum of `amount_cents` of the payment rows.
    pub payment_cents: i64,
    /// Sum of `amount_cents` of the refund rows (positive).
    pub refund_cents: i64,
}

/// Why a bill was rejected, and where.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {why}")]
pub struct BillError {
    pub line: usize,
    pub why: String,
}

impl BillError {
    fn new(line: usize, why: impl Into<String>) -> Self {
        BillError { line, why: why.into() }
    }
}

/// Which provider wrote a bill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    WechatPay,
    Alipay,
}

/// Reads a whole bill, calling `row` for each data row in file order; checks the summary.
///
/// Returns the summary computed from the rows. `row` may return an error (e.g. a database write
/// failing), which is propagated as a [`BillError`] with that row's line. Rows are provisional
/// until this returns `Ok` (see the module documentation).
pub fn parse<R: BufRead>(
    provider: Provider,
    input: R,
    row: impl FnMut(BillRow) -> Result<(), String>,
) -> Result<BillSummary, BillError> {
    match provider {
        Provider::WechatPay => parse_wechat(input, row),
        Provider::Alipay => parse_alipay(input, row),
    }
}

// ---------------------------------------------------------------------------------------------
// WeChat Pay
// ---------------------------------------------------------------------------------------------

/// The first cell of the summary header line that ends a WeChat trade bill.
const WECHAT_SUMMARY_START: &str = "总交易单数";

/// The WeChat columns reconciliation reads.
struct WechatColumns {
    time: Col,
    txn: Col,
    out_trade_no: Col,
    state: Col,
    settle: Col,
    refund_id: Col,
    refund_no: Col,
    refund_amount: Col,
}

impl WechatColumns {
    fn find(header: &Header) -> Result<Self, BillError> {
        Ok(WechatColumns {
            time: header.col("交易时间")?,
            txn: header.col("微信订单号")?,
            out_trade_no: header.col("商户订单号")?,
            state: header.col("交易状态")?,
            settle: header.col("应结订单金额")?,
            refund_id: header.col("微信退款单号")?,
            refund_no: header.col("商户退款单号")?,
            refund_amount: header.col("退款金额")?,
        })
    }

    /// Parses one data row (already checked to have the header's width). Also returns the row's
    /// 应结订单金额 and 退款金额, which the summary totals are made of whatever the row's kind.
    fn row(&self, cells: &[Cow<'_, str>], line: usize) -> Result<(BillRow, i64, i64), BillError> {
        let get = |col: &Col| clean(&cells[col.idx]);
        // The bill only ever holds these three states; anything else means the file is not what
        // we think it is, and guessing could hide money.
        let kind = match get(&self.state) {
            "SUCCESS" => BillKind::Payment,
            "REFUND" => BillKind::Refund,
            "REVOKED" => BillKind::Other,
            other => return Err(BillError::new(line, format!("交易状态 \"{other}\" is unknown"))),
        };
        let settle = amount(get(&self.settle), self.settle.name, line)?;
        let refunded = amount(get(&self.refund_amount), self.refund_amount.name, line)?;
        let out_trade_no = get(&self.out_trade_no);
        if kind != BillKind::Other && out_trade_no.is_empty() {
            return Err(BillError::new(line, "商户订单号 is empty"));
        }
        // Payment rows carry "0" in the refund id columns.
        let refund_id = |col: &Col| {
            let value = get(col);
            (kind == BillKind::Refund && !value.is_empty() && value != "0").then(|| value.to_owned())
        };
        let row = BillRow {
            line,
            amount_cents: if kind == BillKind::Refund {
                refunded.abs()
            } else {
                settle
            },
            out_trade_no: out_trade_no.to_owned(),
            provider_txn_id: get(&self.txn).to_owned(),
            refund_no: refund_id(&self.refund_no),
            provider_refund_id: refund_id(&self.refund_id),
            trade_time: time(get(&self.time), self.time.name, line)?,
            kind,
        };
        Ok((row, settle, refunded))
    }
}

/// Reads a WeChat Pay trade bill (交易账单). See [`parse`].
///
/// Layout: a header line, data rows whose cells are prefixed with a backtick, a summary header
/// line starting with `总交易单数` and one summary values line. The summary is checked: 总交易单数
/// against the number of rows, 应结订单总金额 against the sum of 应结订单金额 over all rows, and
/// 退款总金额 against the sum of 退款金额. Only blank lines may follow the summary.
pub fn parse_wechat<R: BufRead>(
    input: R,
    mut row: impl FnMut(BillRow) -> Result<(), String>,
) -> Result<BillSummary, BillError> {
    let mut lines = Lines::new(input);
    let mut decoder = Decoder::default();

    let header = loop {
        let Some((n, bytes)) = lines.next_line()? else {
            return Err(BillError::new(lines.eof_line(), "missing header line"));
        };
        let text = decoder.decode(n, bytes)?;
        if !text.trim().is_empty() {
            break Header::parse(&text, n);
        }
    };
    let cols = WechatColumns::find(&header)?;

    let mut summary = BillSummary::default();
    let (mut settle_total, mut refund_total) = (0i64, 0i64);
    let summary_header = loop {
        let Some((n, bytes)) = lines.next_line()? else {
            return Err(BillError::new(lines.eof_line(), "truncated: no summary line"));
        };
        let text = decoder.decode(n, bytes)?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with(WECHAT_SUMMARY_START) {
            break Header::parse(&text, n);
        }
        let cells = cells_for(&text, header.width(), n)?;
        let (bill_row, settle, refunded) = cols.row(&cells, n)?;
        add_cents(&mut settle_total, settle, n)?;
        add_cents(&mut refund_total, refunded, n)?;
        deliver(&mut summary, bill_row, &mut row)?;
    };

    let count_col = summary_header.col(WECHAT_SUMMARY_START)?;
    let settle_col = summary_header.col("应结订单总金额")?;
    let refund_col = summary_header.col("退款总金额")?;
    let (line, count, settle, refund) = loop {
        let Some((n, bytes)) = lines.next_line()? else {
            return Err(BillError::new(
                lines.eof_line(),
                "truncated: the summary line has no values",
            ));
        };
        let text = decoder.decode(n, bytes)?;
        if text.trim().is_empty() {
            continue;
        }
        let cells = cells_for(&text, summary_header.width(), n)?;
        let count = clean(&cells[count_col.idx]);
        let count = count
            .parse::<usize>()
            .map_err(|_| BillError::new(n, format!("{} \"{count}\" is not a number", count_col.name)))?;
        let settle = amount(clean(&cells[settle_col.idx]), settle_col.name, n)?;
        let refund = amount(clean(&cells[refund_col.idx]), refund_col.name, n)?;
        break (n, count, settle, refund);
    };
    if count != summary.rows {
        return Err(BillError::new(
            line,
            format!("the summary says {count} rows, the bill has {}", summary.rows),
        ));
    }
    check_total(line, settle_col.name, settle, settle_total)?;
    check_total(line, refund_col.name, refund, refund_total)?;

    // Anything after the summary (a second bill pasted on, a half-written row) is suspicious.
    while let Some((n, bytes)) = lines.next_line()? {
        if !decoder.decode(n, bytes)?.trim().is_empty() {
            return Err(BillError::new(n, "unexpected content after the summary"));
        }
    }
    Ok(summary)
}

/// The header of a WeChat trade bill as the provider writes it (27 columns).
const WECHAT_HEADER: [&str; 27] = [
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
/// Payment rows are written `SUCCESS`, refund rows `REFUND` (the amount goes to both 应结订单金额
/// and 退款金额, so parsing gives back the refund amount), other rows `REVOKED`. The fee is the
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
        settle_total += row.amount_cents;
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
            &amount,
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
            &amount,
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

// ---------------------------------------------------------------------------------------------
// Alipay
// ---------------------------------------------------------------------------------------------

/// The Alipay columns reconciliation reads.
struct AlipayColumns {
    txn: Col,
    out_trade_no: Col,
    business: Col,
    created: Col,
    finished: Col,
    order_amount: Col,
    received: Col,
    refund_no: Col,
}

impl AlipayColumns {
    fn find(header: &Header) -> Result<Self, BillError> {
        Ok(AlipayColumns {
            txn: header.col("支付宝交易号")?,
            out_trade_no: header.col("商户订单号")?,
            business: header.col("业务类型")?,
            created: header.col("创建时间")?,
            finished: header.col("完成时间")?,
            order_amount: header.col("订单金额（元）")?,
            received: header.col("商家实收（元）")?,
            refund_no: header.col("退款批次号/请求号")?,
        })
    }

    /// Parses one data row (already checked to have the header's width). Also returns the row's
    /// 商家实收（元）, which the `#交易合计`/`#退款合计` lines add up.
    fn row(&self, cells: &[Cow<'_, str>], line: usize) -> Result<(BillRow, i64), BillError> {
        let get = |col: &Col| clean(&cells[col.idx]);
        // Alipay's business detail documents more business types than these two (fees, transfers
        // in some merchant setups); they are reported as `Other` and are not in the two totals.
        let kind = match get(&self.business) {
            "交易" => BillKind::Payment,
            "退款" => BillKind::Refund,
            _ => BillKind::Other,
        };
        let order_amount = amount(get(&self.order_amount), self.order_amount.name, line)?;
        let received = amount(get(&self.received), self.received.name, line)?;
        let out_trade_no = get(&self.out_trade_no);
        if kind != BillKind::Other && out_trade_no.is_empty() {
            return Err(BillError::new(line, "商户订单号 is empty"));
        }
        let finished = get(&self.finished);
        let trade_time = if finished.is_empty() {
            time(get(&self.created), self.created.name, line)?
        } else {
            time(finished, self.finished.name, line)?
        };
        let refund_no = get(&self.refund_no);
        let row = BillRow {
            line,
            amount_cents: if kind == BillKind::Refund {
                order_amount.abs()
            } else {
                order_amount
            },
            out_trade_no: out_trade_no.to_owned(),
            provider_txn_id: get(&self.txn).to_owned(),
            refund_no: (kind == BillKind::Refund && !refund_no.is_empty()).then(|| refund_no.to_owned()),
            provider_refund_id: None,
            trade_time,
            kind,
        };
        Ok((row, received))
    }
}

/// Reads an Alipay business detail bill (支付宝业务明细), UTF-8 or GBK. See [`parse`].
///
/// Layout: `#` comment lines, a header row, data rows (identifier cells end with a tab), then `#`
/// lines including `#交易合计：N笔，商家实收共X元，…` and `#退款合计：…`. The 交易 total line must be
/// present (otherwise the file is truncated); each total line present is checked against the
/// count and the 商家实收 sum of the 交易 (resp. 退款) rows. No data row may follow the `#` lines.
pub fn parse_alipay<R: BufRead>(
    input: R,
    mut row: impl FnMut(BillRow) -> Result<(), String>,
) -> Result<BillSummary, BillError> {
    let mut lines = Lines::new(input);
    let mut decoder = Decoder::default();

    let header = loop {
        let Some((n, bytes)) = lines.next_line()? else {
            return Err(BillError::new(lines.eof_line(), "missing header row"));
        };
        let text = decoder.decode(n, bytes)?;
        let trimmed = text.trim();
        if !trimmed.is_empty() && !trimmed.starts_with('#') {
            break Header::parse(&text, n);
        }
    };
    let cols = AlipayColumns::find(&header)?;

    let mut summary = BillSummary::default();
    let (mut paid_received, mut refund_received) = (0i64, 0i64);
    let (mut in_trailer, mut saw_payment_total, mut saw_refund_total) = (false, false, false);
    while let Some((n, bytes)) = lines.next_line()? {
        let text = decoder.decode(n, bytes)?;
        let trimmed = text.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            in_trailer = true;
            let (label, count, received, seen, total) = if let Some(total) = comment.strip_prefix("交易合计") {
                ("交易", summary.payments, paid_received, &mut saw_payment_total, total)
            } else if let Some(total) = comment.strip_prefix("退款合计") {
                ("退款", summary.refunds, refund_received, &mut saw_refund_total, total)
            } else {
                continue;
            };
            if std::mem::replace(seen, true) {
                return Err(BillError::new(n, format!("a second {label}合计 line")));
            }
            let (said_count, said_received) = parse_alipay_total(total)
                .ok_or_else(|| BillError::new(n, format!("cannot read the {label}合计 line \"{trimmed}\"")))?;
            if said_count != count {
                return Err(BillError::new(
                    n,
                    format!("the summary says {said_count} {label} rows, the bill has {count}"),
                ));
            }
            check_total(n, &format!("{label} 商家实收"), said_received, received)?;
            continue;
        }
        if in_trailer {
            return Err(BillError::new(n, "data row after the # summary lines"));
        }
        let cells = cells_for(&text, header.width(), n)?;
        let (bill_row, received) = cols.row(&cells, n)?;
        match bill_row.kind {
            BillKind::Payment => add_cents(&mut paid_received, received, n)?,
            BillKind::Refund => add_cents(&mut refund_received, received, n)?,
            BillKind::Other => {}
        }
        deliver(&mut summary, bill_row, &mut row)?;
    }
    if !saw_payment_total {
        return Err(BillError::new(
            lines.eof_line(),
            "truncated: no summary line (#交易合计)",
        ));
    }
    Ok(summary)
}

/// Reads the rest of a total line after `#交易合计`/`#退款合计`, e.g. `：3笔，商家实收共300.00元，
/// 商家优惠共0.00元`, into the count and the 商家实收 amount in cents. Tolerates a half-width colon
/// and spaces.
fn parse_alipay_total(total: &str) -> Option<(usize, i64)> {
    let rest = total.trim_start_matches(['：', ':', ' ']);
    let (count, rest) = rest.split_once('笔')?;
    let (_, rest) = rest.split_once("商家实收共")?;
    let (received, _) = rest.split_once('元')?;
    Some((count.trim().parse().ok()?, parse_yuan(received)?))
}

/// The header of an Alipay business detail bill as the provider writes it (25 columns).
const ALIPAY_HEADER: [&str; 25] = [
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
        "#退款合计：{refunds}笔，商家实收共{}元，商家优惠共0.00元",
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

// ---------------------------------------------------------------------------------------------
// Shared machinery
// ---------------------------------------------------------------------------------------------

/// Reads physical lines into one reused buffer, counting them.
struct Lines<R> {
    input: R,
    buf: Vec<u8>,
    line: usize,
}

impl<R: BufRead> Lines<R> {
    fn new(input: R) -> Self {
        Lines {
            input,
            buf: Vec::new(),
            line: 0,
        }
    }

    /// The number of the line after the last one read: where the end of the file is reported.
    fn eof_line(&self) -> usize {
        self.line + 1
    }

    /// The next line with its number, without its LF/CRLF end (and without a BOM on line 1).
    fn next_line(&mut self) -> Result<Option<(usize, &[u8])>, BillError> {
        let number = self.line + 1;
        self.buf.clear();
        let read = (&mut self.input)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| BillError::new(number, format!("cannot read the bill: {e}")))?;
        if read == 0 {
            return Ok(None);
        }
        self.line = number;
        let mut bytes = match self.buf.strip_suffix(b"\n") {
            Some(bytes) => bytes,
            None if self.buf.len() > MAX_LINE_BYTES => {
                return Err(BillError::new(
                    number,
                    format!("line longer than {MAX_LINE_BYTES} bytes"),
                ));
            }
            None => &self.buf[..],
        };
        bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if number == 1 {
            bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        }
        Ok(Some((number, bytes)))
    }
}

/// The text encoding of a bill, decided by the first line with non-ASCII bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    #[default]
    Undecided,
    Utf8,
    Gbk,
}

/// Decodes lines one at a time (see "Encoding" in the module documentation).
#[derive(Debug, Default)]
struct Decoder {
    encoding: Encoding,
}

impl Decoder {
    fn decode<'a>(&mut self, line: usize, bytes: &'a [u8]) -> Result<Cow<'a, str>, BillError> {
        if bytes.is_ascii() {
            // ASCII reads the same in both encodings and decides nothing.
            return Ok(Cow::Borrowed(std::str::from_utf8(bytes).unwrap_or_default()));
        }
        match (self.encoding, std::str::from_utf8(bytes)) {
            (Encoding::Undecided | Encoding::Utf8, Ok(text)) => {
                self.encoding = Encoding::Utf8;
                Ok(Cow::Borrowed(text))
            }
            (Encoding::Utf8, Err(_)) => Err(BillError::new(
                line,
                "not valid UTF-8, although the lines before it were UTF-8",
            )),
            (Encoding::Undecided | Encoding::Gbk, _) => {
                self.encoding = Encoding::Gbk;
                GBK.decode_without_bom_handling_and_without_replacement(bytes)
                    .ok_or_else(|| BillError::new(line, "neither UTF-8 nor GBK text"))
            }
        }
    }
}

/// A column found in a header: its name (for messages) and position.
struct Col {
    name: &'static str,
    idx: usize,
}

/// A header line: the cleaned column names.
struct Header {
    names: Vec<String>,
    line: usize,
}

impl Header {
    /// Splits a header line. Names are trimmed (and a stray backtick dropped); half-width
    /// parentheses are read as the full-width ones Alipay uses, so `订单金额(元)` still matches.
    fn parse(text: &str, line: usize) -> Self {
        let names = split_cells(text)
            .iter()
            .map(|cell| clean(cell).replace('(', "（").replace(')', "）"))
            .collect();
        Header { names, line }
    }

    fn width(&self) -> usize {
        self.names.len()
    }

    /// The column called `name`; its first occurrence if the header repeats it.
    fn col(&self, name: &'static str) -> Result<Col, BillError> {
        match self.names.iter().position(|n| n == name) {
            Some(idx) => Ok(Col { name, idx }),
            None => Err(BillError::new(self.line, format!("missing column {name}"))),
        }
    }
}

/// Splits a line into cells, which must be exactly `width` (see "Cell counts" in the module
/// documentation).
fn cells_for(text: &str, width: usize, line: usize) -> Result<Vec<Cow<'_, str>>, BillError> {
    let cells = split_cells(text);
    let hint = if cells.len() > width {
        " (an unquoted comma in a cell?)"
    } else {
        ""
    };
    if cells.len() != width {
        return Err(BillError::new(
            line,
            format!("the row has {} cells, the header has {width}{hint}", cells.len()),
        ));
    }
    Ok(cells)
}

/// Splits one CSV line into cells on commas. A cell that starts with a double quote (or with a
/// backtick and a double quote, in case WeChat quotes after its prefix) runs to the closing
/// quote, may contain commas, and reads `""` as one quote. Providers do not quote in practice, so
/// this is lenient: text between a closing quote and the next comma is kept, and an unclosed
/// quote runs to the end of the line.
fn split_cells(line: &str) -> Vec<Cow<'_, str>> {
    let mut cells = Vec::new();
    let mut rest = line;
    loop {
        let quoted = rest.strip_prefix('"').or_else(|| rest.strip_prefix("`\""));
        let Some(quoted) = quoted else {
            match rest.split_once(',') {
                Some((cell, after)) => {
                    cells.push(Cow::Borrowed(cell));
                    rest = after;
                    continue;
                }
                None => {
                    cells.push(Cow::Borrowed(rest));
                    return cells;
                }
            }
        };
        let mut value = String::new();
        let mut end = quoted.len();
        let mut chars = quoted.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '"' {
                value.push(c);
            } else if chars.next_if(|&(_, next)| next == '"').is_some() {
                value.push('"');
            } else {
                end = i + 1;
                break;
            }
        }
        let after = &quoted[end..];
        match after.split_once(',') {
            Some((tail, next)) => {
                value.push_str(tail);
                cells.push(Cow::Owned(value));
                rest = next;
            }
            None => {
                value.push_str(after);
                cells.push(Cow::Owned(value));
                return cells;
            }
        }
    }
}

/// A cell's value: surrounding whitespace (including Alipay's trailing tabs) and WeChat's
/// leading backtick removed.
fn clean(cell: &str) -> &str {
    let cell = cell.trim();
    cell.strip_prefix('`').unwrap_or(cell).trim()
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

/// An amount cell in cents; empty counts as zero.
fn amount(value: &str, column: &str, line: usize) -> Result<i64, BillError> {
    if value.is_empty() {
        return Ok(0);
    }
    parse_yuan(value).ok_or_else(|| BillError::new(line, format!("{column} \"{value}\" is not an amount")))
}

/// A timestamp cell; empty is `None`.
fn time(value: &str, column: &str, line: usize) -> Result<Option<NaiveDateTime>, BillError> {
    if value.is_empty() {
        return Ok(None);
    }
    fixed_width_time(value)
        .ok_or(())
        .or_else(|()| NaiveDateTime::parse_from_str(value, TIME_FORMAT))
        .or_else(|_| NaiveDateTime::parse_from_str(value, TIME_FORMAT_SLASHES))
        .map(Some)
        .map_err(|_| BillError::new(line, format!("{column} \"{value}\" is not a time")))
}

/// Reads the usual `YYYY-MM-DD HH:MM:SS` (or `YYYY/MM/DD HH:MM:SS`) by hand: chrono interprets its
/// format string on every call, which made time parsing the costliest step per row in debug
/// builds. Anything else (or an invalid date) is `None` and goes to chrono.
fn fixed_width_time(value: &str) -> Option<NaiveDateTime> {
    let b = value.as_bytes();
    let shape = b.len() == 19 && b[10] == b' ' && b[13] == b':' && b[16] == b':';
    if !shape || !matches!((b[4], b[7]), (b'-', b'-') | (b'/', b'/')) {
        return None;
    }
    let number = |from: usize, to: usize| {
        b[from..to]
            .iter()
            .try_fold(0u32, |n, &d| d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0')))
    };
    let year = i32::try_from(number(0, 4)?).ok()?;
    NaiveDate::from_ymd_opt(year, number(5, 7)?, number(8, 10)?)?.and_hms_opt(
        number(11, 13)?,
        number(14, 16)?,
        number(17, 19)?,
    )
}

/// Adds to a running total, refusing to overflow.
fn add_cents(total: &mut i64, cents: i64, line: usize) -> Result<(), BillError> {
    *total = total
        .checked_add(cents)
        .ok_or_else(|| BillError::new(line, "the amounts overflow"))?;
    Ok(())
}

/// Compares a summary amount with the rows' total.
fn check_total(line: usize, what: &str, said: i64, rows: i64) -> Result<(), BillError> {
    if said == rows {
        return Ok(());
    }
    Err(BillError::new(
        line,
        format!(
            "the summary says {what} {}, the rows add up to {}",
            format_yuan(said),
            format_yuan(rows)
        ),
    ))
}

/// Counts a row into the summary, then hands it to the caller's callback.
fn deliver(
    summary: &mut BillSummary,
    row: BillRow,
    callback: &mut impl FnMut(BillRow) -> Result<(), String>,
) -> Result<(), BillError> {
    let line = row.line;
    summary.rows += 1;
    match row.kind {
        BillKind::Payment => {
            summary.payments += 1;
            add_cents(&mut summary.payment_cents, row.amount_cents, line)?;
        }
        BillKind::Refund => {
            summary.refunds += 1;
            add_cents(&mut summary.refund_cents, row.amount_cents, line)?;
        }
        BillKind::Other => {}
    }
    callback(row).map_err(|why| BillError::new(line, why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, TIME_FORMAT).unwrap()
    }

    fn payment(no: u32, cents: i64, txn: &str) -> BillRow {
        BillRow {
            line: 0,
            kind: BillKind::Payment,
            out_trade_no: format!("FO2026112900000000{no:02}"),
            provider_txn_id: txn.to_owned(),
            amount_cents: cents,
            refund_no: None,
            provider_refund_id: None,
            trade_time: Some(at(&format!("2026-11-29 10:{no:02}:02"))),
        }
    }

    /// Two payments, a refund of the first, a revoked row; `provider_refund_id` only for WeChat.
    fn sample(wechat: bool) -> Vec<BillRow> {
        let refund = BillRow {
            kind: BillKind::Refund,
            amount_cents: 5_000,
            refund_no: Some("RF202611290000000001".to_owned()),
            provider_refund_id: wechat.then(|| "50300001234567890".to_owned()),
            trade_time: Some(at("2026-11-29 18:00:00")),
            ..payment(1, 0, "4200001234000001")
        };
        let other = BillRow {
            kind: BillKind::Other,
            trade_time: None,
            ..payment(3, 1_999, "4200001234000003")
        };
        vec![
            payment(1, 10_000, "4200001234000001"),
            payment(2, 12_345, "4200001234000002"),
            refund,
            other,
        ]
    }

    fn run(provider: Provider, bytes: &[u8]) -> Result<(Vec<BillRow>, BillSummary), BillError> {
        let mut rows = Vec::new();
        let summary = parse(provider, bytes, |row| {
            rows.push(row);
            Ok(())
        })?;
        Ok((rows, summary))
    }

    fn without_lines(rows: &[BillRow]) -> Vec<BillRow> {
        rows.iter().map(|r| BillRow { line: 0, ..r.clone() }).collect()
    }

    fn wechat_text(rows: &[BillRow]) -> String {
        let mut out = Vec::new();
        write_wechat_bill(&mut out, rows, false, false).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// UTF-8 with LF line ends, so tests can edit it as text.
    fn alipay_text(rows: &[BillRow]) -> String {
        let mut out = Vec::new();
        write_alipay_bill(&mut out, rows, false).unwrap();
        String::from_utf8(out).unwrap().replace("\r\n", "\n")
    }

    /// Replaces 1-based line `line` of `text` by `f(old line)`.
    fn edit(text: &str, line: usize, f: impl Fn(&str) -> String) -> String {
        text.lines()
            .enumerate()
            .map(|(i, l)| if i + 1 == line { f(l) } else { l.to_owned() } + "\n")
            .collect()
    }

    /// The first `n` lines of `text`.
    fn first_lines(text: &str, n: usize) -> String {
        text.lines().take(n).map(|l| format!("{l}\n")).collect()
    }

    fn err(line: usize, why: &str) -> BillError {
        BillError::new(line, why)
    }

    const SAMPLE_SUMMARY: BillSummary = BillSummary {
        rows: 4,
        payments: 2,
        refunds: 1,
        payment_cents: 22_345,
        refund_cents: 5_000,
    };

    #[test]
    fn wechat_round_trips_with_and_without_bom_and_crlf() {
        let rows = sample(true);
        for (crlf, bom) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut out = Vec::new();
            write_wechat_bill(&mut out, &rows, crlf, bom).unwrap();
            assert_eq!(out.starts_with(b"\xEF\xBB\xBF"), bom);
            assert_eq!(out.windows(2).any(|w| w == b"\r\n"), crlf);
            let (parsed, summary) = run(Provider::WechatPay, &out).unwrap();
            assert_eq!(without_lines(&parsed), rows, "crlf {crlf}, bom {bom}");
            assert_eq!(parsed.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 3, 4, 5]);
            assert_eq!(summary, SAMPLE_SUMMARY);
        }
    }

    #[test]
    fn wechat_writes_the_provider_format() {
        let text = wechat_text(&sample(true));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], WECHAT_HEADER.join(","));
        assert!(lines[1].starts_with("`2026-11-29 10:01:02,`wx"), "{}", lines[1]);
        assert!(
            lines[1].contains(",`SUCCESS,`OTHERS,`CNY,`100.00,`0.00,`0,`0,`0.00,"),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains(",`0.60000,`0.60%,`100.00,`0.00,`"), "{}", lines[1]);
        assert!(
            lines[3].contains(",`REFUND,`OTHERS,`CNY,`50.00,`0.00,`50300001234567890,`RF202611290000000001,`50.00,")
        );
        assert_eq!(
            lines[5],
            "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额"
        );
        assert_eq!(lines[6], "`4,`293.44,`50.00,`0.00,`1.04070,`293.44,`50.00");
    }

    #[test]
    fn wechat_reads_the_documented_example_with_refund() {
        let header = WECHAT_HEADER.join(",");
        let bill = format!(
            "\u{feff}{header}\r\n\
             `2026-11-29 10:15:02,`wx2421b1c4370ec43b,`1900000109,`0,`,`4200001234000000001,`FO202611290000000001,`oUpF8u,`JSAPI,`SUCCESS,`OTHERS,`CNY,`100.00,`0.00,`0,`0,`0.00,`0.00,`,`,`Monthly card,`,`0.60000,`0.60%,`100.00,`0.00,`\r\n\
             `2026-11-29 11:00:00,`wx2421b1c4370ec43b,`1900000109,`0,`,`4200001234000000002,`FO202611290000000002,`oUpF8u,`JSAPI,`SUCCESS,`OTHERS,`CNY,`100.00,`0.00,`0,`0,`0.00,`0.00,`,`,`Monthly card,`,`0.60000,`0.60%,`100.00,`0.00,`\r\n\
             `2026-11-29 12:00:00,`wx2421b1c4370ec43b,`1900000109,`0,`,`4200001234000000001,`FO202611290000000001,`oUpF8u,`JSAPI,`REFUND,`OTHERS,`CNY,`100.00,`0.00,`50300000001,`RF1,`100.00,`0.00,`ORIGINAL,`SUCCESS,`Monthly card,`,`-0.60000,`0.60%,`100.00,`100.00,`\r\n\
             总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额\r\n\
             `3,`300.00,`100.00,`0.00,`0.60000,`300.00,`100.00\r\n\r\n\r\n"
        );
        let (rows, summary) = run(Provider::WechatPay, bill.as_bytes()).unwrap();
        assert_eq!(
            summary,
            BillSummary {
                rows: 3,
                payments: 2,
                refunds: 1,
                payment_cents: 20_000,
                refund_cents: 10_000
            }
        );
        assert_eq!(rows[0].out_trade_no, "FO202611290000000001");
        assert_eq!(rows[0].provider_txn_id, "4200001234000000001");
        assert_eq!(rows[0].trade_time, Some(at("2026-11-29 10:15:02")));
        assert_eq!(
            (rows[0].refund_no.as_deref(), rows[0].provider_refund_id.as_deref()),
            (None, None)
        );
        assert_eq!(rows[2].kind, BillKind::Refund);
        assert_eq!(rows[2].line, 4);
        assert_eq!(rows[2].amount_cents, 10_000);
        assert_eq!(rows[2].refund_no.as_deref(), Some("RF1"));
        assert_eq!(rows[2].provider_refund_id.as_deref(), Some("50300000001"));
    }

    #[test]
    fn wechat_finds_columns_by_name_in_any_order_with_extra_columns() {
        let text = wechat_text(&sample(true));
        // Reverse the data columns and add one in front and one at the end.
        let shuffled: String = text
            .lines()
            .enumerate()
            .map(|(i, line)| {
                if i >= 5 {
                    return format!("{line}\n");
                }
                let mut cells: Vec<&str> = line.split(',').collect();
                cells.reverse();
                let (first, last) = if i == 0 { ("新列", "另一列") } else { ("`x", "`y") };
                format!("{first},{},{last}\n", cells.join(","))
            })
            .collect();
        let (rows, summary) = run(Provider::WechatPay, shuffled.as_bytes()).unwrap();
        assert_eq!(without_lines(&rows), sample(true));
        assert_eq!(summary, SAMPLE_SUMMARY);
    }

    #[test]
    fn wechat_bad_amount_names_the_line() {
        let text = edit(&wechat_text(&sample(true)), 3, |l| l.replace("`123.45", "`abc"));
        let e = run(Provider::WechatPay, text.as_bytes()).unwrap_err();
        assert_eq!(e, err(3, "应结订单金额 \"abc\" is not an amount"));
        assert_eq!(e.to_string(), "line 3: 应结订单金额 \"abc\" is not an amount");
        let text = edit(&wechat_text(&sample(true)), 2, |l| l.replace("`100.00", "`1.005"));
        assert_eq!(run(Provider::WechatPay, text.as_bytes()).unwrap_err().line, 2);
    }

    #[test]
    fn wechat_missing_summary_is_truncation() {
        let text = wechat_text(&sample(true));
        let e = run(Provider::WechatPay, first_lines(&text, 5).as_bytes()).unwrap_err();
        assert_eq!(e, err(6, "truncated: no summary line"));
        let e = run(Provider::WechatPay, first_lines(&text, 6).as_bytes()).unwrap_err();
        assert_eq!(e, err(7, "truncated: the summary line has no values"));
        // Cut in the middle of a row: the row is short and that is reported first.
        let cut = &text[..text.find("`REFUND").unwrap()];
        assert!(run(Provider::WechatPay, cut.as_bytes())
            .unwrap_err()
            .why
            .contains("cells, the header has 27"));
    }

    #[test]
    fn wechat_summary_mismatch_is_an_error() {
        let text = wechat_text(&sample(true));
        let wrong_count = edit(&text, 7, |l| l.replacen("`4,", "`5,", 1));
        assert_eq!(
            run(Provider::WechatPay, wrong_count.as_bytes()).unwrap_err(),
            err(7, "the summary says 5 rows, the bill has 4")
        );
        let wrong_settle = edit(&text, 7, |l| l.replacen("`293.44", "`293.45", 1));
        assert_eq!(
            run(Provider::WechatPay, wrong_settle.as_bytes()).unwrap_err(),
            err(7, "the summary says 应结订单总金额 293.45, the rows add up to 293.44")
        );
        let wrong_refund = edit(&text, 7, |l| l.replacen("`50.00", "`0.00", 1));
        assert_eq!(
            run(Provider::WechatPay, wrong_refund.as_bytes()).unwrap_err(),
            err(7, "the summary says 退款总金额 0.00, the rows add up to 50.00")
        );
        let dropped_row = text
            .lines()
            .enumerate()
            .filter(|(i, _)| *i != 2)
            .map(|(_, l)| format!("{l}\n"));
        let dropped_row: String = dropped_row.collect();
        assert_eq!(
            run(Provider::WechatPay, dropped_row.as_bytes()).unwrap_err(),
            err(6, "the summary says 4 rows, the bill has 3")
        );
    }

    #[test]
    fn wechat_header_missing_a_needed_column() {
        let text = edit(&wechat_text(&sample(true)), 1, |l| l.replace("商户订单号", "订单号"));
        assert_eq!(
            run(Provider::WechatPay, text.as_bytes()).unwrap_err(),
            err(1, "missing column 商户订单号")
        );
        assert_eq!(
            run(Provider::WechatPay, &b""[..]).unwrap_err(),
            err(1, "missing header line")
        );
    }

    #[test]
    fn wechat_malformed_rows() {
        let text = wechat_text(&sample(true));
        let short = edit(&text, 4, |l| l.rsplitn(3, ',').nth(2).unwrap().to_owned());
        assert_eq!(
            run(Provider::WechatPay, short.as_bytes()).unwrap_err(),
            err(4, "the row has 25 cells, the header has 27")
        );
        let long = edit(&text, 4, |l| l.replace("Monthly card", "Monthly, card"));
        assert_eq!(
            run(Provider::WechatPay, long.as_bytes()).unwrap_err(),
            err(
                4,
                "the row has 28 cells, the header has 27 (an unquoted comma in a cell?)"
            )
        );
        let trailing_comma = edit(&text, 4, |l| format!("{l},"));
        assert_eq!(run(Provider::WechatPay, trailing_comma.as_bytes()).unwrap_err().line, 4);
        // A trailing comma on every line, header included, is just one more (empty) column.
        let all_trailing: String = text
            .lines()
            .enumerate()
            .map(|(i, l)| if i < 5 { format!("{l},\n") } else { format!("{l}\n") })
            .collect();
        assert_eq!(
            without_lines(&run(Provider::WechatPay, all_trailing.as_bytes()).unwrap().0),
            sample(true)
        );
        let no_order = edit(&text, 2, |l| l.replace("`FO202611290000000001", "`"));
        assert_eq!(
            run(Provider::WechatPay, no_order.as_bytes()).unwrap_err(),
            err(2, "商户订单号 is empty")
        );
        let state = edit(&text, 3, |l| l.replace("`SUCCESS", "`NOTPAY"));
        assert_eq!(
            run(Provider::WechatPay, state.as_bytes()).unwrap_err(),
            err(3, "交易状态 \"NOTPAY\" is unknown")
        );
        let time = edit(&text, 3, |l| l.replacen("`2026-11-29 10:02:02", "`yesterday", 1));
        assert_eq!(
            run(Provider::WechatPay, time.as_bytes()).unwrap_err(),
            err(3, "交易时间 \"yesterday\" is not a time")
        );
        let after = format!("{text}\n`2026-11-29 10:01:02,`wx\n");
        assert_eq!(
            run(Provider::WechatPay, after.as_bytes()).unwrap_err(),
            err(9, "unexpected content after the summary")
        );
    }

    #[test]
    fn callback_errors_carry_the_line() {
        let text = wechat_text(&sample(true));
        let mut seen = 0;
        let e = parse_wechat(text.as_bytes(), |row| {
            seen += 1;
            if row.kind == BillKind::Refund {
                Err("database is down".to_owned())
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert_eq!((e, seen), (err(4, "database is down"), 3));
    }

    #[test]
    fn quoted_cells_are_split_and_written_correctly() {
        let cells = split_cells(r#"a,"b,c","d""e",`"f,g",,"unclosed, to the end"#);
        assert_eq!(cells, ["a", "b,c", "d\"e", "f,g", "", "unclosed, to the end"]);
        let mut rows = sample(true);
        rows[0].provider_txn_id = "42,\"00\"".to_owned();
        rows[1].out_trade_no = "FO,2".to_owned();
        let (parsed, _) = run(Provider::WechatPay, wechat_text(&rows).as_bytes()).unwrap();
        assert_eq!(without_lines(&parsed), rows);
        let (parsed, _) = run(Provider::Alipay, alipay_text(&rows[1..2]).as_bytes()).unwrap();
        assert_eq!(parsed[0].out_trade_no, "FO,2");
        rows[0].out_trade_no = "two\nlines".to_owned();
        assert!(write_wechat_bill(Vec::new(), &rows, false, false).is_err());
    }

    #[test]
    fn alipay_round_trips_in_utf8_and_gbk() {
        let rows = sample(false);
        for gbk in [false, true] {
            let mut out = Vec::new();
            write_alipay_bill(&mut out, &rows, gbk).unwrap();
            assert_eq!(std::str::from_utf8(&out).is_err(), gbk, "gbk {gbk}");
            let (parsed, summary) = run(Provider::Alipay, &out).unwrap();
            assert_eq!(without_lines(&parsed), rows, "gbk {gbk}");
            assert_eq!(parsed.iter().map(|r| r.line).collect::<Vec<_>>(), [6, 7, 8, 9]);
            assert_eq!(summary, SAMPLE_SUMMARY);
        }
    }

    #[test]
    fn alipay_writes_the_provider_format() {
        let text = alipay_text(&sample(false));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "#支付宝业务明细查询");
        assert_eq!(
            lines[2],
            "#起始日期：[2026年11月29日 00:00:00]   终止日期：[2026年11月30日 00:00:00]"
        );
        assert_eq!(lines[4], ALIPAY_HEADER.join(","));
        assert!(
            lines[5].starts_with("4200001234000001\t,FO202611290000000001\t,交易,"),
            "{}",
            lines[5]
        );
        assert!(
            lines[7].contains(",-50.00,-50.00,") && lines[7].contains(",RF202611290000000001\t,"),
            "{}",
            lines[7]
        );
        assert_eq!(lines[10], "#交易合计：2笔，商家实收共223.45元，商家优惠共0.00元");
        assert_eq!(lines[11], "#退款合计：1笔，商家实收共-50.00元，商家优惠共0.00元");
    }

    #[test]
    fn alipay_reads_a_handwritten_gbk_bill_with_reordered_columns() {
        // Reordered and extra columns, padded header cells, half-width parentheses, a payment
        // without 完成时间 (falls back to 创建时间), an unknown business type.
        let text = "#支付宝业务明细查询\r\n\
            #账号：[20881234567890120156]\r\n\
            #-----------------------------------------业务明细列表----------------------------------------\r\n\
            备注, 商户订单号 ,支付宝交易号,业务类型,完成时间,创建时间,订单金额(元),商家实收（元）,退款批次号/请求号,额外\r\n\
            ,FO202611290000000001\t,2026112922001400000000000001\t,交易,2026-11-29 10:15:02,2026-11-29 10:15:00,100.00,99.40,,\r\n\
            ,FO202611290000000002\t,2026112922001400000000000002\t,交易,,2026-11-29 11:00:00,200.00,200.00,,x\r\n\
            ,FO202611290000000001\t,2026112922001400000000000001\t,退款,2026-11-29 12:00:00,2026-11-29 12:00:00,-50.00,-50.00,RF1\t,\r\n\
            ,\t,2026112922001400000000000009\t,收费,2026-11-29 13:00:00,2026-11-29 13:00:00,-0.60,-0.60,,\r\n\
            #-----------------------------------------业务明细列表结束------------------------------------\r\n\
            #交易合计：2笔，商家实收共299.40元，商家优惠共0.00元\r\n\
            #退款合计：1笔，商家实收共-50.00元，商家优惠共0.00元\r\n\
            #导出时间：[2026年11月30日 09:00:00]\r\n";
        let (gbk, _, unmappable) = GBK.encode(text);
        assert!(!unmappable);
        let (rows, summary) = run(Provider::Alipay, &gbk).unwrap();
        assert_eq!(
            summary,
            BillSummary {
                rows: 4,
                payments: 2,
                refunds: 1,
                payment_cents: 30_000,
                refund_cents: 5_000
            }
        );
        assert_eq!(rows[0].provider_txn_id, "2026112922001400000000000001");
        assert_eq!(rows[0].out_trade_no, "FO202611290000000001");
        assert_eq!(rows[0].line, 5);
        assert_eq!(rows[0].trade_time, Some(at("2026-11-29 10:15:02")));
        assert_eq!(rows[1].trade_time, Some(at("2026-11-29 11:00:00")));
        assert_eq!(
            (&rows[2].kind, rows[2].amount_cents, rows[2].refund_no.as_deref()),
            (&BillKind::Refund, 5_000, Some("RF1"))
        );
        assert_eq!(rows[2].provider_refund_id, None);
        assert_eq!((&rows[3].kind, rows[3].amount_cents), (&BillKind::Other, -60));
    }

    #[test]
    fn alipay_bad_amount_names_the_line() {
        let text = edit(&alipay_text(&sample(false)), 7, |l| l.replace("123.45", "12x.45"));
        assert_eq!(
            run(Provider::Alipay, text.as_bytes()).unwrap_err(),
            err(7, "订单金额（元） \"12x.45\" is not an amount")
        );
    }

    #[test]
    fn alipay_missing_summary_is_truncation() {
        let text = alipay_text(&sample(false));
        assert_eq!(
            run(Provider::Alipay, first_lines(&text, 9).as_bytes()).unwrap_err(),
            err(10, "truncated: no summary line (#交易合计)")
        );
        assert_eq!(
            run(Provider::Alipay, first_lines(&text, 10).as_bytes()).unwrap_err(),
            err(11, "truncated: no summary line (#交易合计)")
        );
        // The refund total is checked when present but may be absent.
        assert!(run(Provider::Alipay, first_lines(&text, 11).as_bytes()).is_ok());
    }

    #[test]
    fn alipay_summary_mismatch_is_an_error() {
        let text = alipay_text(&sample(false));
        let count = edit(&text, 11, |l| l.replace("2笔", "3笔"));
        assert_eq!(
            run(Provider::Alipay, count.as_bytes()).unwrap_err(),
            err(11, "the summary says 3 交易 rows, the bill has 2")
        );
        let refund = edit(&text, 12, |l| l.replace("-50.00", "-60.00"));
        assert_eq!(
            run(Provider::Alipay, refund.as_bytes()).unwrap_err(),
            err(12, "the summary says 退款 商家实收 -60.00, the rows add up to -50.00")
        );
        let garbled = edit(&text, 11, |_| "#交易合计：两笔".to_owned());
        assert_eq!(run(Provider::Alipay, garbled.as_bytes()).unwrap_err().line, 11);
        let late_row = format!("{text}{}\n", text.lines().nth(5).unwrap());
        assert_eq!(
            run(Provider::Alipay, late_row.as_bytes()).unwrap_err(),
            err(14, "data row after the # summary lines")
        );
    }

    #[test]
    fn alipay_header_problems() {
        let text = alipay_text(&sample(false));
        let no_header: String = text
            .lines()
            .enumerate()
            .filter(|(i, _)| *i != 4)
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        assert_eq!(
            run(Provider::Alipay, no_header.as_bytes()).unwrap_err(),
            err(5, "missing column 支付宝交易号")
        );
        let renamed = edit(&text, 5, |l| l.replace("商家实收（元）", "实收"));
        assert_eq!(
            run(Provider::Alipay, renamed.as_bytes()).unwrap_err(),
            err(5, "missing column 商家实收（元）")
        );
        assert_eq!(
            run(Provider::Alipay, first_lines(&text, 4).as_bytes()).unwrap_err(),
            err(5, "missing header row")
        );
        let no_order = edit(&text, 6, |l| l.replace("FO202611290000000001\t", "\t"));
        assert_eq!(
            run(Provider::Alipay, no_order.as_bytes()).unwrap_err(),
            err(6, "商户订单号 is empty")
        );
    }

    #[test]
    fn encoding_is_decided_once() {
        // A GBK line after UTF-8 text is a broken file, not a guess.
        let mut bytes = alipay_text(&sample(false)).into_bytes();
        let (gbk, _, _) = GBK.encode("#导出时间：[2026年11月30日 09:00:00]\n");
        bytes.extend_from_slice(&gbk);
        assert_eq!(
            run(Provider::Alipay, &bytes).unwrap_err(),
            err(14, "not valid UTF-8, although the lines before it were UTF-8")
        );
        // Bytes that are neither.
        assert_eq!(
            run(Provider::Alipay, &b"#\xff\xff\n"[..]).unwrap_err(),
            err(1, "neither UTF-8 nor GBK text")
        );
    }

    #[test]
    fn times_are_read_in_both_spellings() {
        for spelling in ["2026-11-29 08:05:09", "2026/11/29 08:05:09", "2026/11/29 8:05:09"] {
            assert_eq!(
                time(spelling, "t", 1),
                Ok(Some(at("2026-11-29 08:05:09"))),
                "{spelling}"
            );
        }
        assert_eq!(time("", "t", 1), Ok(None));
        for bad in [
            "2026-13-29 08:05:09",
            "2026-11-29 24:00:00",
            "2026-11-29T08:05:09",
            "20x6-11-29 08:05:09",
        ] {
            assert_eq!(
                time(bad, "t", 7),
                Err(err(7, &format!("t \"{bad}\" is not a time"))),
                "{bad}"
            );
        }
    }

    #[test]
    fn overlong_lines_are_refused() {
        let mut bytes = vec![b'#'; MAX_LINE_BYTES + 10];
        bytes.push(b'\n');
        assert_eq!(
            run(Provider::Alipay, &bytes).unwrap_err(),
            err(1, format!("line longer than {MAX_LINE_BYTES} bytes").as_str())
        );
    }

    /// Generates `n` rows (every tenth a refund) straight to a temp file, then parses it back with
    /// a counting callback: nothing but the current line is ever held in memory.
    fn stream_large_bill(provider: Provider, n: usize) {
        let rows = (0..n).map(|i| {
            let mut row = payment((i % 60) as u32, 100 + i as i64, &format!("42000012340{i:08}"));
            row.out_trade_no = format!("FO2026112900{i:08}");
            if i % 10 == 9 {
                row.kind = BillKind::Refund;
                row.refund_no = Some(format!("RF{i}"));
            }
            row
        });
        let rows: Vec<BillRow> = rows.collect();
        let path = std::env::temp_dir().join(format!("fitorder-bills-{}-{provider:?}.csv", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        match provider {
            Provider::WechatPay => write_wechat_bill(file, &rows, true, true).unwrap(),
            Provider::Alipay => write_alipay_bill(file, &rows, true).unwrap(),
        }
        drop(rows);
        let (mut count, mut refunds) = (0usize, 0usize);
        let reader = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
        let result = parse(provider, reader, |row| {
            count += 1;
            refunds += usize::from(row.kind == BillKind::Refund);
            Ok(())
        });
        std::fs::remove_file(&path).unwrap();
        let summary = result.unwrap();
        assert_eq!((count, refunds), (n, n / 10));
        assert_eq!(
            (summary.rows, summary.payments, summary.refunds),
            (n, n - n / 10, n / 10)
        );
    }

    #[test]
    fn large_wechat_bill_streams() {
        stream_large_bill(Provider::WechatPay, 200_000);
    }

    #[test]
    fn large_alipay_gbk_bill_streams() {
        stream_large_bill(Provider::Alipay, 200_000);
    }
}
