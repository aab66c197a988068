//! Parser tests on bills written by [`super::write`].

use chrono::NaiveDateTime;
use encoding_rs::GBK;

use super::text::{split_cells, time, TIME_FORMAT};
use super::write::{write_alipay_bill, write_wechat_bill, ALIPAY_HEADER, WECHAT_HEADER};
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
    assert!(lines[3].contains(",`REFUND,`OTHERS,`CNY,`0.00,`0.00,`50300001234567890,`RF202611290000000001,`50.00,"));
    assert_eq!(
        lines[5],
        "总交易单数,应结订单总金额,退款总金额,充值券退款总金额,手续费总金额,订单总金额,申请退款总金额"
    );
    assert_eq!(lines[6], "`4,`243.44,`50.00,`0.00,`1.04070,`243.44,`50.00");
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
    let wrong_settle = edit(&text, 7, |l| l.replacen("`243.44", "`243.45", 1));
    assert_eq!(
        run(Provider::WechatPay, wrong_settle.as_bytes()).unwrap_err(),
        err(7, "the summary says 应结订单总金额 243.45, the rows add up to 243.44")
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
    assert_eq!(
        lines[11],
        "#退款合计：1笔，商家实收退款共-50.00元，商家优惠退款共0.00元"
    );
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
