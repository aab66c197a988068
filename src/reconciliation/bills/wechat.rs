//! The WeChat Pay trade bill (交易账单).

use std::borrow::Cow;
use std::io::BufRead;

use super::text::{add_cents, amount, cells_for, check_total, clean, deliver, time, Col, Decoder, Header, Lines};
use super::{BillError, BillKind, BillRow, BillSummary};

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
