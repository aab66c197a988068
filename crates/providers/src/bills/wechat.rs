//! The WeChat Pay trade bill (交易账单), in every shape the samples show: the v3 ALL (27 columns),
//! SUCCESS (20) and REFUND (29) bills with their 7-field summary, and the older v2 bills (24/26
//! columns: 总金额 and 企业红包 instead of 应结订单金额 and 充值券) with a 5-field summary.

use std::borrow::Cow;
use std::io::BufRead;

use super::text::{add_cents, amount, cells_for, check_total, clean, deliver, time, Col, Decoder, Header, Lines};
use super::{BillError, BillKind, BillRow, BillSummary};

/// The first cell of the summary header line that ends a WeChat trade bill.
const WECHAT_SUMMARY_START: &str = "总交易单数";

/// A summary total and the row column it adds up, each under its v3 name and then its v2 name.
struct Total {
    summary: &'static [&'static str],
    column: &'static [&'static str],
    /// 手续费 has five decimals; everything else is yuan with two.
    fee: bool,
    /// A summary without this total is not a trade bill's summary.
    required: bool,
}

/// Every total of both summaries. A total whose row column the bill lacks (the SUCCESS bill has
/// no refund columns) adds up to zero.
const TOTALS: [Total; 6] = [
    Total {
        summary: &["应结订单总金额", "总交易额"],
        column: &["应结订单金额", "总金额"],
        fee: false,
        required: true,
    },
    Total {
        summary: &["退款总金额", "总退款金额"],
        column: &["退款金额"],
        fee: false,
        required: true,
    },
    Total {
        summary: &["充值券退款总金额", "总企业红包退款金额"],
        column: &["充值券退款金额", "企业红包退款金额"],
        fee: false,
        required: false,
    },
    Total {
        summary: &["手续费总金额"],
        column: &["手续费"],
        fee: true,
        required: false,
    },
    Total {
        summary: &["订单总金额"],
        column: &["订单金额"],
        fee: false,
        required: false,
    },
    Total {
        summary: &["申请退款总金额"],
        column: &["申请退款金额"],
        fee: false,
        required: false,
    },
];

/// The WeChat columns reconciliation reads. The refund columns are optional: the SUCCESS bill has
/// none, and a REFUND row in a bill without them is an error naming the column.
struct WechatColumns {
    time: Col,
    txn: Col,
    out_trade_no: Col,
    state: Col,
    refund_id: Option<Col>,
    refund_no: Option<Col>,
    refund_amount: Option<Col>,
    /// 退款成功时间: only in the REFUND bill, whose 交易时间 is the payment's time.
    refund_time: Option<Col>,
    /// The row column of each of [`TOTALS`], when the bill has it.
    totals: Vec<Option<Col>>,
}

impl WechatColumns {
    fn find(header: &Header) -> Result<Self, BillError> {
        let cols = WechatColumns {
            time: header.col("交易时间")?,
            txn: header.col("微信订单号")?,
            out_trade_no: header.col("商户订单号")?,
            state: header.col("交易状态")?,
            refund_id: header.find("微信退款单号"),
            refund_no: header.find("商户退款单号"),
            refund_amount: header.find("退款金额"),
            refund_time: header.find("退款成功时间"),
            totals: TOTALS.iter().map(|t| header.find_of(t.column)).collect(),
        };
        // 应结订单金额 (v3) or 总金额 (v2) is needed; it is read as the first of TOTALS.
        header.col_of(TOTALS[0].column)?;
        Ok(cols)
    }

    /// Parses one data row (already checked to have the header's width). Also returns, for each
    /// of [`TOTALS`], the row's value (0 where the bill lacks the column): the summary adds
    /// them up over every row, whatever its kind.
    fn row(&self, cells: &[Cow<'_, str>], line: usize) -> Result<(BillRow, [i64; TOTALS.len()]), BillError> {
        let get = |col: &Col| clean(&cells[col.idx]);
        // The bill only ever holds these three states; anything else means the file is not what
        // we think it is, and guessing could hide money.
        let kind = match get(&self.state) {
            "SUCCESS" => BillKind::Payment,
            "REFUND" => BillKind::Refund,
            "REVOKED" => BillKind::Other,
            other => return Err(BillError::new(line, format!("交易状态 \"{other}\" is unknown"))),
        };
        let mut values = [0i64; TOTALS.len()];
        for ((total, col), value) in TOTALS.iter().zip(&self.totals).zip(&mut values) {
            *value = match col {
                None => 0,
                Some(col) if total.fee => fee(get(col), col.name, line)?,
                Some(col) => amount(get(col), col.name, line)?,
            };
        }
        // TOTALS[0] is 应结订单金额/总金额, the `settle` column; TOTALS[1] is 退款金额.
        let (settle, refunded) = (values[0], values[1]);
        let out_trade_no = get(&self.out_trade_no);
        if kind != BillKind::Other && out_trade_no.is_empty() {
            return Err(BillError::new(line, "商户订单号 is empty"));
        }
        let needed = |col: &Option<Col>, name: &str| {
            col.as_ref()
                .map(&get)
                .ok_or_else(|| BillError::new(line, format!("a REFUND row, but the bill has no column {name}")))
        };
        // Payment rows carry "0" in the refund id columns.
        let refund_id = |value: &str| (!value.is_empty() && value != "0").then(|| value.to_owned());
        let mut row = BillRow {
            line,
            amount_cents: settle,
            out_trade_no: out_trade_no.to_owned(),
            provider_txn_id: get(&self.txn).to_owned(),
            refund_no: None,
            provider_refund_id: None,
            trade_time: time(get(&self.time), self.time.name, line)?,
            kind,
        };
        if row.kind == BillKind::Refund {
            // A refund row's money is in 退款金额; its 应结订单金额 is 0.00.
            needed(&self.refund_amount, "退款金额")?;
            row.amount_cents = refunded.abs();
            row.refund_no = refund_id(needed(&self.refund_no, "商户退款单号")?);
            row.provider_refund_id = self.refund_id.as_ref().and_then(|c| refund_id(get(c)));
            if let Some(col) = &self.refund_time {
                if let Some(at) = time(get(col), col.name, line)? {
                    row.trade_time = Some(at);
                }
            }
        }
        Ok((row, values))
    }
}

/// Reads a WeChat Pay trade bill (交易账单). See [`super::parse`].
///
/// Layout: a header line, data rows whose cells are prefixed with a backtick, a summary header
/// line starting with `总交易单数` and one summary values line. The summary is checked: 总交易单数
/// against the number of rows, and each total it has (应结订单总金额/总交易额, 退款总金额/总退款金额,
/// 充值券退款总金额/总企业红包退款金额, 手续费总金额, 订单总金额, 申请退款总金额) against the sum of its
/// column over all rows. Only blank lines may follow the summary.
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
    let mut sums = [0i64; TOTALS.len()];
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
        let (bill_row, values) = cols.row(&cells, n)?;
        for (sum, value) in sums.iter_mut().zip(values) {
            add_cents(sum, value, n)?;
        }
        deliver(&mut summary, bill_row, &mut row)?;
    };

    let count_col = summary_header.col(WECHAT_SUMMARY_START)?;
    let mut total_cols = Vec::with_capacity(TOTALS.len());
    for total in &TOTALS {
        total_cols.push(if total.required {
            Some(summary_header.col_of(total.summary)?)
        } else {
            summary_header.find_of(total.summary)
        });
    }
    let (line, cells) = loop {
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
        let cells: Vec<String> = cells_for(&text, summary_header.width(), n)?
            .iter()
            .map(|c| clean(c).to_owned())
            .collect();
        break (n, cells);
    };
    let count = &cells[count_col.idx];
    let count = count
        .parse::<usize>()
        .map_err(|_| BillError::new(line, format!("{} \"{count}\" is not a number", count_col.name)))?;
    // Read every total before comparing, so a malformed one is reported as such.
    let mut said = Vec::with_capacity(TOTALS.len());
    for (total, col) in TOTALS.iter().zip(&total_cols) {
        said.push(match col {
            None => None,
            Some(col) if total.fee => Some((col, fee(&cells[col.idx], col.name, line)?)),
            Some(col) => Some((col, amount(&cells[col.idx], col.name, line)?)),
        });
    }
    if count != summary.rows {
        return Err(BillError::new(
            line,
            format!("the summary says {count} rows, the bill has {}", summary.rows),
        ));
    }
    for ((total, said), rows) in TOTALS.iter().zip(said).zip(sums) {
        match said {
            None => {}
            Some((col, said)) if total.fee => check_fee(line, col.name, said, rows)?,
            Some((col, said)) => check_total(line, col.name, said, rows)?,
        }
    }

    // Anything after the summary (a second bill pasted on, a half-written row) is suspicious.
    while let Some((n, bytes)) = lines.next_line()? {
        if !decoder.decode(n, bytes)?.trim().is_empty() {
            return Err(BillError::new(n, "unexpected content after the summary"));
        }
    }
    Ok(summary)
}

/// A 手续费 cell in units of 0.00001 yuan (`0.01000` → 1000); empty counts as zero.
pub(super) fn fee(value: &str, column: &str, line: usize) -> Result<i64, BillError> {
    fee_units(value).ok_or_else(|| BillError::new(line, format!("{column} \"{value}\" is not an amount")))
}

fn fee_units(value: &str) -> Option<i64> {
    if value.is_empty() {
        return Some(0);
    }
    let (neg, digits) = match value.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || whole.len() > 12 || frac.len() > 5 || !all_digits(whole) || !all_digits(frac) {
        return None;
    }
    // Digits only (checked above), so this is the fraction scaled to five places.
    let frac = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(5)
        .fold(0i64, |n, d| n * 10 + i64::from(d - b'0'));
    let units = whole.parse::<i64>().ok()? * 100_000 + frac;
    Some(if neg { -units } else { units })
}

/// Formats units of 0.00001 yuan as WeChat writes fees (`1000` → `"0.01000"`).
fn format_fee_units(units: i64) -> String {
    let sign = if units < 0 { "-" } else { "" };
    let abs = units.unsigned_abs();
    format!("{sign}{}.{:05}", abs / 100_000, abs % 100_000)
}

fn check_fee(line: usize, what: &str, said: i64, rows: i64) -> Result<(), BillError> {
    if said == rows {
        return Ok(());
    }
    Err(BillError::new(
        line,
        format!(
            "the summary says {what} {}, the rows add up to {}",
            format_fee_units(said),
            format_fee_units(rows)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fees_have_five_decimals() {
        for (text, units) in [
            ("0.00000", 0),
            ("0.01000", 1000),
            ("-0.6", -60000),
            ("12", 1_200_000),
            ("", 0),
        ] {
            assert_eq!(fee_units(text), Some(units), "{text}");
        }
        for bad in ["0.000001", "x", "1.2.3", "-", ".5", "0.0000a"] {
            assert_eq!(fee_units(bad), None, "{bad}");
        }
        assert_eq!(format_fee_units(-60000), "-0.60000");
        assert_eq!(format_fee_units(1000), "0.01000");
    }
}
