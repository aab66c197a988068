#![no_main]
//! The WeChat Pay trade bill parser: never panics, never loops, whatever the bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::dev::fuzzing::wechat_bill(data);
});
