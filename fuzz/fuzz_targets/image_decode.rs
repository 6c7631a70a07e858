//! The image decoder entry point on arbitrary bytes: no panic, and a decoded image respects the
//! pixel cap and the requested mode. The cap is small so the fuzzer explores the refusal path
//! and cannot make the decoder allocate much.
#![no_main]

use libfuzzer_sys::fuzz_target;
use preprocess::image::{decode_image, ImageIoOptions, ImageMode};

fuzz_target!(|data: &[u8]| {
    let opts = ImageIoOptions {
        max_pixels: 1 << 20,
        ..ImageIoOptions::default()
    };
    if let Ok(decoded) = decode_image(data, &opts) {
        let rgb = decoded.image.as_rgb8().expect("RGB mode gives RGB8");
        assert!(u64::from(rgb.width()) * u64::from(rgb.height()) <= 1 << 20);
    }
    let gray = ImageIoOptions {
        image_mode: ImageMode::L,
        max_pixels: 1 << 16,
        ..ImageIoOptions::default()
    };
    if let Ok(decoded) = decode_image(data, &gray) {
        assert!(decoded.image.as_luma8().is_some());
    }
});
