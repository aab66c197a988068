#![no_main]
//! The WeChat Pay notification envelope and its decrypted resource.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::dev::fuzzing::wechat_notification(data);
});
