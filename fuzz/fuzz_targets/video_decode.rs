//! The video decoder entry points on arbitrary bytes (a container, and a JPEG frame list made
//! by splitting the input): no panic, and what decodes respects the frame and size caps.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use preprocess::video::{decode_jpeg_frames, decode_video, VideoIoOptions, VideoLimits};

fuzz_target!(|data: &[u8]| {
    let opts = VideoIoOptions {
        num_frames: 4,
        ..VideoIoOptions::default()
    };
    let limits = VideoLimits {
        max_frames: 16,
        max_width: 512,
        max_height: 512,
        max_pixels_per_frame: 512 * 512,
        max_total_frames_scanned: 2_000,
        time_budget: std::time::Duration::from_secs(2),
        decoder_threads: 1,
        ..VideoLimits::default()
    };
    if let Ok(video) = decode_video(data, &opts, &limits) {
        assert!(video.frames.len() <= limits.max_frames);
        assert_eq!(video.frames.len(), video.timestamps_s.len());
        for f in &video.frames {
            assert!(f.width() <= limits.max_width && f.height() <= limits.max_height);
        }
    }
    let frames: Vec<Bytes> = data
        .split(|b| *b == b'|')
        .map(|part| Bytes::copy_from_slice(part))
        .collect();
    if let Ok(video) = decode_jpeg_frames(&frames, &opts, &limits) {
        assert!(video.frames.len() <= 4);
    }
});
