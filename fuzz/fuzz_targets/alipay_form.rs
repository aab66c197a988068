#![no_main]
//! The Alipay notification form.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::dev::fuzzing::alipay_form(data);
});
