//! The audio decoder entry point on arbitrary bytes: no panic, and decoded audio respects the
//! duration cap (small here, so the fuzzer explores the refusal path cheaply).
#![no_main]

use libfuzzer_sys::fuzz_target;
use preprocess::audio::{decode_audio, AudioIoOptions};

fuzz_target!(|data: &[u8]| {
    let opts = AudioIoOptions {
        max_duration_s: 5.0,
        ..AudioIoOptions::default()
    };
    if let Ok(audio) = decode_audio(data, None, &opts) {
        assert!(audio.sample_rate > 0);
        assert!(audio.duration_s <= 5.0 + 1e-6);
        assert!(audio.samples.len() as f64 <= 5.0 * f64::from(audio.sample_rate) + 1.0);
        assert!(audio.samples.iter().all(|s| s.is_finite()));
    }
});
