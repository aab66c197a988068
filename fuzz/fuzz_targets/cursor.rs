#![no_main]
//! The pagination cursor decoder.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    fitorder::dev::fuzzing::cursor(data);
});
