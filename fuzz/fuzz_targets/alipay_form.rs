#![no_main]
//! The Alipay notification form.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::fuzzing::alipay_form(data);
});
