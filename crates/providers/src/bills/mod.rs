//! Streaming parsers of the payment providers' daily bills: the WeChat Pay trade bill (交易账单)
//! and the Alipay business detail (支付宝业务明细).
//!
//! `text` is the line and CSV reader both share, `wechat` and `alipay` are the two formats (in
//! every shape the real samples in `tests/provider-samples/` show, each parsed by a test in
//! `samples`), and [`archive`] unpacks what the providers' download URLs deliver (gzip, zip)
//! into the file a run reads. The writers of both formats, for the sandbox, tests and the bench,
//! are the development layer's (`fitorder-dev`, `bill_writers.rs`).
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
//! * **Money** is integer cents, parsed with [`crate::domain::money::parse_yuan`], never through floating point. Empty
//!   amount cells count as zero. Refund amounts are reported positive, whatever sign the provider
//!   uses.
//! * **Line numbers** are 1-based physical lines of the file; errors about the end of the file
//!   (truncation) name the line after the last one.

mod alipay;
pub mod archive;
#[cfg(test)]
mod samples;
#[cfg(test)]
mod tests;
mod text;
mod wechat;
/// The bill writers the tests write with: the development layer's (`fitorder-dev`), compiled
/// here for the tests only.
#[cfg(test)]
#[path = "../../../dev/src/bill_writers.rs"]
mod write;

use std::io::BufRead;

use chrono::NaiveDateTime;

pub use alipay::parse_alipay;
pub use archive::{save_wechat_bill, unpack_alipay_zip, unpack_wechat_gz, ArchiveError, Unpacked};
pub use wechat::parse_wechat;

/// The longest line accepted (1 MiB). Real bill lines are a few hundred bytes.
pub const MAX_LINE_BYTES: usize = 1 << 20;

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
    pub fn new(line: usize, why: impl Into<String>) -> Self {
        BillError { line, why: why.into() }
    }
}

/// Which provider wrote a bill.
pub use crate::domain::Provider;

/// Reads a whole bill, calling `row` for each data row in file order; checks the summary.
///
/// Returns the summary computed from the rows. `row` may return an error (e.g. a database write
/// failing), which is propagated as a [`BillError`] with that row's line. Rows are provisional
/// until this returns `Ok` (see the module documentation).
pub fn parse<R: BufRead>(
    provider: Provider,
    mut input: R,
    mut row: impl FnMut(BillRow) -> Result<(), String>,
) -> Result<BillSummary, BillError> {
    crate::provider::plugin(provider).parse_bill(&mut input, &mut row)
}
