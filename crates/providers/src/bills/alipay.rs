//! The Alipay business detail bill (支付宝业务明细).

use std::borrow::Cow;
use std::io::BufRead;

use super::text::{add_cents, amount, cells_for, check_total, clean, deliver, time, Col, Decoder, Header, Lines};
use super::{BillError, BillKind, BillRow, BillSummary};
use crate::domain::money::parse_yuan;

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

/// Reads an Alipay business detail bill (支付宝业务明细), UTF-8 or GBK. See [`super::parse`].
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

/// Reads the rest of a total line after `#交易合计`/`#退款合计` into the count and the 商家实收 amount
/// in cents: `：6笔，商家实收共0.06元，商家优惠共0.00元` and, as the real bill words its refund
/// total, `：4笔，商家实收退款共-0.04元，商家优惠退款共0.00元`. Tolerates a half-width colon and
/// spaces.
fn parse_alipay_total(total: &str) -> Option<(usize, i64)> {
    let rest = total.trim_start_matches(['：', ':', ' ']);
    let (count, rest) = rest.split_once('笔')?;
    let (_, rest) = rest
        .split_once("商家实收共")
        .or_else(|| rest.split_once("商家实收退款共"))?;
    let (received, _) = rest.split_once('元')?;
    Some((count.trim().parse().ok()?, parse_yuan(received)?))
}
