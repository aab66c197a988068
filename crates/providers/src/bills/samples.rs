//! Every real bill in `tests/provider-samples/` (provenance in its SOURCES.md), parsed. The
//! expected totals were counted and added up by hand from each file, as each test's comment says;
//! nothing here was produced by the parser first.

use std::path::{Path, PathBuf};

use chrono::NaiveDateTime;
use encoding_rs::GBK;

use super::{parse, BillError, BillKind, BillRow, BillSummary, Provider};

fn sample(path: &str) -> Vec<u8> {
    let dir: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/provider-samples");
    std::fs::read(dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn at(s: &str) -> Option<NaiveDateTime> {
    Some(NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap())
}

fn run(provider: Provider, bytes: &[u8]) -> Result<(Vec<BillRow>, BillSummary), BillError> {
    let mut rows = Vec::new();
    let summary = parse(provider, bytes, |row| {
        rows.push(row);
        Ok(())
    })?;
    Ok((rows, summary))
}

/// The same bill with `\r\n` line ends (the samples have `\n`; real v2 responses came with
/// `\r\n`), and with a UTF-8 BOM added or removed: all read the same.
fn variants(bytes: &[u8]) -> Vec<Vec<u8>> {
    let text = std::str::from_utf8(bytes).unwrap();
    let bare = text.strip_prefix('\u{feff}').unwrap_or(text);
    let crlf = bare.replace('\n', "\r\n");
    vec![
        bytes.to_vec(),
        bare.as_bytes().to_vec(),
        format!("\u{feff}{bare}").into_bytes(),
        crlf.clone().into_bytes(),
        format!("\u{feff}{crlf}").into_bytes(),
    ]
}

/// Parses every variant; they must agree, rows and line numbers included.
fn wechat(path: &str) -> (Vec<BillRow>, BillSummary) {
    let bytes = sample(path);
    let first = run(Provider::WechatPay, &bytes).unwrap_or_else(|e| panic!("{path}: {e}"));
    for v in variants(&bytes) {
        assert_eq!(run(Provider::WechatPay, &v).unwrap(), first, "{path}");
    }
    first
}

fn summary(rows: usize, payments: usize, refunds: usize, payment_cents: i64, refund_cents: i64) -> BillSummary {
    BillSummary {
        rows,
        payments,
        refunds,
        payment_cents,
        refund_cents,
    }
}

#[test]
fn wechat_v3_all_27_columns() {
    // 3 data rows, all 交易状态 SUCCESS with 应结订单金额 0.01: 3 payments, 0.03 yuan; the summary
    // says `3,0.03,0.00,0.00,0.00000,0.03,0.00`.
    let (rows, s) = wechat("wechat/bill/v3_tradebill_ALL_20210128.csv");
    assert_eq!(s, summary(3, 3, 0, 3, 0));
    let first = &rows[0];
    assert_eq!(
        (
            first.line,
            &first.kind,
            first.out_trade_no.as_str(),
            first.provider_txn_id.as_str()
        ),
        (
            2,
            &BillKind::Payment,
            "S20210128170702357723",
            "4200000925202101284997714292"
        )
    );
    assert_eq!((first.amount_cents, first.trade_time), (1, at("2021-01-28 17:07:11")));
    // `0` in 微信退款单号/商户退款单号 of a payment is no refund number.
    assert!(rows
        .iter()
        .all(|r| r.refund_no.is_none() && r.provider_refund_id.is_none()));
}

#[test]
fn wechat_v3_success_20_columns_without_refund_columns() {
    // 1 row, SUCCESS, 应结订单金额 0.01; the bill has no 退款金额 column at all, and its summary's
    // 退款总金额 0.00 is what zero rows of it add up to.
    let (rows, s) = wechat("wechat/bill/v3_tradebill_SUCCESS_20210201.csv");
    assert_eq!(s, summary(1, 1, 0, 1, 0));
    assert_eq!(rows[0].out_trade_no, "S20210201143829466741");
    assert_eq!(rows[0].trade_time, at("2021-02-01 14:38:45"));
    // A REFUND row in a bill without refund columns cannot say what it refunded.
    let text = String::from_utf8(sample("wechat/bill/v3_tradebill_SUCCESS_20210201.csv")).unwrap();
    let refund = text.replace("`NATIVE,`SUCCESS,", "`NATIVE,`REFUND,");
    assert_eq!(
        run(Provider::WechatPay, refund.as_bytes()).unwrap_err(),
        BillError::new(2, "a REFUND row, but the bill has no column 退款金额")
    );
}

#[test]
fn wechat_v3_refund_29_columns() {
    // 2 rows, 交易状态 REFUND, 应结订单金额 0.00 and 退款金额 0.01 each: 2 refunds of 0.01 yuan, no
    // payment money; the summary says `2,0.00,0.02,0.00,0.00000,0.00,0.02`.
    let (rows, s) = wechat("wechat/bill/v3_tradebill_REFUND_20210201.csv");
    assert_eq!(s, summary(2, 0, 2, 0, 2));
    let r = &rows[0];
    assert_eq!(
        (
            &r.kind,
            r.amount_cents,
            r.out_trade_no.as_str(),
            r.provider_txn_id.as_str()
        ),
        (
            &BillKind::Refund,
            1,
            "S20210124161554311546",
            "4200000844202101245866928772"
        )
    );
    assert_eq!(
        (r.refund_no.as_deref(), r.provider_refund_id.as_deref()),
        (Some("S20210201143320649393"), Some("50300807172021020106006664916"))
    );
    // 交易时间 is the payment's (2021-01-24); the refund happened at 退款成功时间.
    assert_eq!(r.trade_time, at("2021-02-01 14:33:24"));
    assert_eq!(rows[1].refund_no.as_deref(), Some("S20210201140044552846"));
}

#[test]
fn wechat_v2_all_24_columns_with_bom_and_5_field_summary() {
    // Starts with EF BB BF. 6 SUCCESS rows, 总金额 0.88 + 5 × 0.17 = 1.73 yuan; 手续费 0.01000 +
    // 5 × 0.00000 = 0.01000; the summary `6,1.73,0.00,0.00,0.01000` agrees.
    let bytes = sample("wechat/bill/v2_downloadbill_ALL_20151028_bom.csv");
    assert!(bytes.starts_with(b"\xEF\xBB\xBF"));
    let (rows, s) = wechat("wechat/bill/v2_downloadbill_ALL_20151028_bom.csv");
    assert_eq!(s, summary(6, 6, 0, 173, 0));
    assert_eq!(
        (rows[0].amount_cents, rows[0].out_trade_no.as_str()),
        (88, "dicwdkof7s8tpfgrl7vmxa6xhd7udrmt")
    );
    // The fee total is checked too, with its five decimals.
    let text = String::from_utf8(bytes).unwrap();
    let fee = text.replace("`0.01000\n", "`0.01001\n");
    assert_eq!(
        run(Provider::WechatPay, fee.as_bytes()).unwrap_err(),
        BillError::new(9, "the summary says 手续费总金额 0.01001, the rows add up to 0.01000")
    );
}

/// The three refunds of 2018-08-21 (refund number, trade time) as the sp ALL bill lists them.
const SP_REFUNDS: [(&str, &str); 3] = [
    ("1012413262018082023005236551534846383", "2018-08-21 18:13:12"),
    ("1012413262018082093528911551534846254", "2018-08-21 18:11:15"),
    ("1012413262018082061125989071534846349", "2018-08-21 18:12:38"),
];

#[test]
fn wechat_v2_service_provider_all_and_refund_bills_of_one_day_agree() {
    // ALL: 3 rows, 交易状态 REFUND, 总金额 0.00, 退款金额 0.01 each: 3 refunds, 0.03 yuan; summary
    // `3,0.00,0.03,0.00,0.00000`. REFUND (26 columns): the same 3 refunds, whose 退款成功时间 is
    // the ALL bill's 交易时间.
    let (all, s) = wechat("wechat/bill/v2_sp_downloadbill_ALL_20180821.csv");
    assert_eq!(s, summary(3, 0, 3, 0, 3));
    let (refunds, s) = wechat("wechat/bill/v2_sp_downloadbill_REFUND_20180821.csv");
    assert_eq!(s, summary(3, 0, 3, 0, 3));
    for rows in [&all, &refunds] {
        let seen: Vec<(&str, Option<NaiveDateTime>, i64)> = rows
            .iter()
            .map(|r| (r.refund_no.as_deref().unwrap(), r.trade_time, r.amount_cents))
            .collect();
        let expected: Vec<(&str, Option<NaiveDateTime>, i64)> =
            SP_REFUNDS.iter().map(|(no, t)| (*no, at(t), 1)).collect();
        assert_eq!(seen, expected);
    }
    assert_eq!(
        all[0].provider_refund_id.as_deref(),
        Some("50000707812018082106030155182")
    );
}

#[test]
fn wechat_summaries_that_disagree_fail() {
    let text = String::from_utf8(sample("wechat/bill/v3_tradebill_REFUND_20210201.csv")).unwrap();
    let cases = [
        (
            "`2,`0.00,`0.02,`0.00,`0.00000,`0.00,`0.02",
            "`2,`0.00,`0.02,`0.00,`0.00000,`0.00,`0.03",
            "the summary says 申请退款总金额 0.03, the rows add up to 0.02",
        ),
        (
            "`2,`0.00,`0.02,`0.00,`0.00000,`0.00,`0.02",
            "`2,`0.00,`0.01,`0.00,`0.00000,`0.00,`0.02",
            "the summary says 退款总金额 0.01, the rows add up to 0.02",
        ),
        (
            "`2,`0.00,`0.02,`0.00,`0.00000,`0.00,`0.02",
            "`2,`0.00,`0.02,`0.00,`0.00000,`0.01,`0.02",
            "the summary says 订单总金额 0.01, the rows add up to 0.00",
        ),
    ];
    for (from, to, why) in cases {
        let edited = text.replace(from, to);
        assert_eq!(
            run(Provider::WechatPay, edited.as_bytes()).unwrap_err(),
            BillError::new(5, why)
        );
    }
    // A row whose 退款金额 was changed no longer adds up to the summary.
    let row = text.replacen("`S20210201143320649393,`0.01,", "`S20210201143320649393,`0.02,", 1);
    assert_eq!(
        run(Provider::WechatPay, row.as_bytes()).unwrap_err(),
        BillError::new(5, "the summary says 退款总金额 0.02, the rows add up to 0.03")
    );
    // The v2 names: 总交易额 against the rows' 总金额.
    let v2 = String::from_utf8(sample("wechat/bill/v2_downloadbill_ALL_20151028_bom.csv")).unwrap();
    let v2 = v2.replace("`6,`1.73,", "`6,`1.74,");
    assert_eq!(
        run(Provider::WechatPay, v2.as_bytes()).unwrap_err(),
        BillError::new(9, "the summary says 总交易额 1.74, the rows add up to 1.73")
    );
}

#[test]
fn wechat_missing_needed_columns_are_named() {
    let text = String::from_utf8(sample("wechat/bill/v3_tradebill_ALL_20210128.csv")).unwrap();
    let no_settle = text.replacen("应结订单金额", "结算金额", 1);
    assert_eq!(
        run(Provider::WechatPay, no_settle.as_bytes()).unwrap_err(),
        BillError::new(1, "missing column 应结订单金额 (or 总金额)")
    );
    let no_txn = text.replacen("微信订单号", "订单号", 1);
    assert_eq!(
        run(Provider::WechatPay, no_txn.as_bytes()).unwrap_err(),
        BillError::new(1, "missing column 微信订单号")
    );
    let no_total = text.replacen("退款总金额", "退款额", 1);
    assert_eq!(
        run(Provider::WechatPay, no_total.as_bytes()).unwrap_err(),
        BillError::new(5, "missing column 退款总金额 (or 总退款金额)")
    );
}

#[test]
fn samples_trimmed_by_their_authors_are_the_stated_exceptions() {
    // SOURCES.md: Tencent's doc example shows 1 row of a bill whose summary says 12 orders. A
    // summary that disagrees with the rows fails the run; here it must, too.
    let doc = sample("wechat/bill/official_wxcloudrun_doc_example_ALL_20220321.txt");
    assert_eq!(
        run(Provider::WechatPay, &doc).unwrap_err(),
        BillError::new(4, "the summary says 12 rows, the bill has 1")
    );
    // Its one row, with the summary made to agree, reads like any ALL row (27-digit txn id).
    let text = String::from_utf8(doc).unwrap();
    let fixed = text.replace(
        "`12,`0.06,`0.06,`0.00,`0.00000,`0.06,`0.06",
        "`1,`0.01,`0.00,`0.00,`0.00000,`0.01,`0.00",
    );
    let (rows, s) = run(Provider::WechatPay, fixed.as_bytes()).unwrap();
    assert_eq!(s, summary(1, 1, 0, 1, 0));
    assert_eq!(rows[0].provider_txn_id, "420000612032130748613220688");
    // SOURCES.md: the fund-flow bill (资金账单) is another bill, not a trade bill, and its summary
    // counts a row its author trimmed. It is refused at its header, plain or gzipped.
    let fund = sample("wechat/bill/v3_fundflowbill_BASIC_20210201.csv");
    assert_eq!(
        run(Provider::WechatPay, &fund).unwrap_err(),
        BillError::new(1, "missing column 交易时间")
    );
}

const ALIPAY_SAMPLE: &str = "alipay/bill/unattributed/20880211096256330156_20190916_业务明细.utf8-rendered.csv";

/// The sample as Alipay ships it: GBK (the saved file is a UTF-8 rendering) with CRLF.
fn alipay_gbk() -> Vec<u8> {
    let text = String::from_utf8(sample(ALIPAY_SAMPLE)).unwrap();
    let crlf = text.replace('\n', "\r\n");
    let (gbk, _, unmappable) = GBK.encode(&crlf);
    assert!(!unmappable);
    gbk.into_owned()
}

#[test]
fn the_real_alipay_detail_reads_in_utf8_and_gbk() {
    // 10 data rows (lines 6–15): 6 of 业务类型 交易 at 0.01 each and 4 of 退款 at -0.01 each, as
    // `#交易合计：6笔，商家实收共0.06元` and `#退款合计：4笔，商家实收退款共-0.04元` say.
    let utf8 = sample(ALIPAY_SAMPLE);
    let gbk = alipay_gbk();
    assert!(std::str::from_utf8(&gbk).is_err(), "really GBK");
    let (rows, s) = run(Provider::Alipay, &utf8).unwrap();
    assert_eq!(run(Provider::Alipay, &gbk).unwrap(), (rows.clone(), s.clone()));
    assert_eq!(s, summary(10, 6, 4, 6, 4));
    // Identifier cells end in a tab; it is not part of the value.
    let paid = &rows[0];
    assert_eq!(
        (
            paid.line,
            &paid.kind,
            paid.out_trade_no.as_str(),
            paid.provider_txn_id.as_str()
        ),
        (
            6,
            &BillKind::Payment,
            "service_1568601259302",
            "2019091622001458860515315453"
        )
    );
    assert_eq!((paid.amount_cents, paid.refund_no.as_deref()), (1, None));
    assert_eq!(paid.trade_time, at("2019-09-16 10:55:23"));
    // A refund is its own row: negative amounts, reported positive; 退款批次号/请求号 is our
    // refund number; 完成时间 is when it was refunded.
    let refund = &rows[1];
    assert_eq!(
        (&refund.kind, refund.amount_cents, refund.out_trade_no.as_str()),
        (&BillKind::Refund, 1, "service_1568601259302")
    );
    assert_eq!(refund.provider_txn_id, paid.provider_txn_id);
    assert_eq!(
        (refund.refund_no.as_deref(), refund.provider_refund_id.as_deref()),
        (Some("re_test_1568602607356"), None)
    );
    assert_eq!(refund.trade_time, at("2019-09-16 10:56:48"));
    let refund_nos: Vec<&str> = rows.iter().filter_map(|r| r.refund_no.as_deref()).collect();
    assert_eq!(
        refund_nos,
        [
            "re_test_1568602607356",
            "re_test_1568604414433",
            "re_test_1568614511552",
            "re_20190916150216125q8Lmiodp"
        ]
    );
}

#[test]
fn the_real_alipay_detail_checks_its_totals_and_columns() {
    let text = String::from_utf8(sample(ALIPAY_SAMPLE)).unwrap();
    let refund_total = text.replace("商家实收退款共-0.04元", "商家实收退款共-0.05元");
    assert_eq!(
        run(Provider::Alipay, refund_total.as_bytes()).unwrap_err(),
        BillError::new(18, "the summary says 退款 商家实收 -0.05, the rows add up to -0.04")
    );
    let refund_count = text.replace("#退款合计：4笔", "#退款合计：3笔");
    assert_eq!(
        run(Provider::Alipay, refund_count.as_bytes()).unwrap_err(),
        BillError::new(18, "the summary says 3 退款 rows, the bill has 4")
    );
    let payment_total = text.replace("商家实收共0.06元", "商家实收共0.07元");
    assert_eq!(
        run(Provider::Alipay, payment_total.as_bytes()).unwrap_err(),
        BillError::new(17, "the summary says 交易 商家实收 0.07, the rows add up to 0.06")
    );
    let no_refund_no = text.replacen("退款批次号/请求号", "批次号", 1);
    assert_eq!(
        run(Provider::Alipay, no_refund_no.as_bytes()).unwrap_err(),
        BillError::new(5, "missing column 退款批次号/请求号")
    );
    // Unknown extra columns are ignored: one more column at the end of every row.
    let extra: String = text
        .lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("{l}\n")
            } else {
                format!("{l},新列\n")
            }
        })
        .collect();
    assert_eq!(
        run(Provider::Alipay, extra.as_bytes()).unwrap().1,
        summary(10, 6, 4, 6, 4)
    );
}
