#![no_main]
//! The Alipay bill parser (GBK or UTF-8): never panics, whatever the bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::dev::fuzzing::alipay_bill(data);
});
