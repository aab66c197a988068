//! Every input of the fuzzers' seed corpora and every crash they ever found (`fuzz/regressions`)
//! goes through the same entry points on each test run, without libFuzzer.

fn replay(dir: &str, f: fn(&[u8])) -> usize {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for base in ["corpus", "regressions"] {
        let d = root.join(base).join(dir);
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries {
            let p = e.unwrap().path();
            f(&std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    n
}

#[test]
fn the_fuzz_corpora_replay_cleanly() {
    use fitorder::dev::fuzzing::*;
    assert!(replay("wechat_bill", wechat_bill) >= 1);
    assert!(replay("alipay_bill", alipay_bill) >= 2);
    assert!(replay("wechat_notification", wechat_notification) >= 3);
    assert!(replay("alipay_form", alipay_form) >= 2);
    assert!(replay("cursor", cursor) >= 2);
    // Each document of the probe of issue 34 among them (a stack overflow aborts this test).
    assert!(replay("graphql_request", graphql_request) >= 10);
}

#[test]
fn the_seed_bills_parse() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut rows = 0;
    let s = fitorder::providers::bills::parse_wechat(
        &std::fs::read(root.join("wechat_bill/sample.csv")).unwrap()[..],
        |_| {
            rows += 1;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!((s.rows, s.payments, s.refunds, rows), (3, 2, 1, 3));
    for f in ["sample-utf8.csv", "sample-gbk.csv"] {
        let s = fitorder::providers::bills::parse_alipay(
            &std::fs::read(root.join("alipay_bill").join(f)).unwrap()[..],
            |_| Ok(()),
        )
        .unwrap();
        assert_eq!(
            (s.payments, s.refunds, s.payment_cents, s.refund_cents),
            (1, 1, 10_000, 5_000),
            "{f}"
        );
    }
}
