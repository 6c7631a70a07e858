//! Video decoding and sampling against the tiny files in `tests/media/`
//! (made by `tests/media/make_video_media.sh`), and bad input of every kind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Cursor;
use std::time::Duration;

use bytes::Bytes;
use image::{ImageFormat, RgbImage};
use preprocess::video::{
    decode_jpeg_frames, decode_video, DecodedVideo, VideoError, VideoIoOptions, VideoLimits,
};

fn opts(num_frames: usize) -> VideoIoOptions {
    VideoIoOptions {
        num_frames,
        ..VideoIoOptions::default()
    }
}

fn all() -> VideoIoOptions {
    opts(VideoIoOptions::ALL_FRAMES)
}

/// Mean absolute difference of two same-sized images, per channel value.
fn mean_abs_diff(a: &RgbImage, b: &RgbImage) -> f64 {
    assert_eq!(a.dimensions(), b.dimensions());
    let sum: u64 = a
        .as_raw()
        .iter()
        .zip(b.as_raw())
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    sum as f64 / a.as_raw().len() as f64
}

fn assert_consistent(v: &DecodedVideo) {
    assert_eq!(v.frames.len(), v.timestamps_s.len());
    assert_eq!(v.frames.len(), v.frame_indices.len());
    assert!(
        v.frame_indices.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        v.frame_indices
    );
    assert!(
        v.timestamps_s.windows(2).all(|w| w[0] < w[1]),
        "{:?}",
        v.timestamps_s
    );
    for f in &v.frames {
        assert_eq!(f.dimensions(), (v.width, v.height));
        assert_eq!(f.as_raw().len(), v.width as usize * v.height as usize * 3);
    }
}

#[cfg(feature = "video")]
mod containers {
    use super::*;
    use preprocess::video::sample_indices;

    fn media(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/media/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn h264_default_samples_32_of_50() {
        let v = decode_video(
            &media("testsrc_h264.mp4"),
            &VideoIoOptions::default(),
            &VideoLimits::default(),
        )
        .unwrap();
        assert_consistent(&v);
        assert_eq!((v.width, v.height), (160, 120));
        assert_eq!(v.total_frames, 50);
        assert!((v.source_fps - 25.0).abs() < 1e-9);
        assert!((v.duration_s - 2.0).abs() < 1e-6);
        assert_eq!(v.frames.len(), 32);
        assert_eq!(
            v.frame_indices,
            sample_indices(50, 25.0, &VideoIoOptions::default())
        );
        assert_eq!(&v.frame_indices[..5], &[0, 1, 3, 4, 6]);
        for (t, i) in v.timestamps_s.iter().zip(&v.frame_indices) {
            assert!((t - *i as f64 / 25.0).abs() < 1e-6, "{t} vs frame {i}");
        }
    }

    #[test]
    fn every_format_decodes_every_frame() {
        for name in [
            "testsrc_mpeg4.mp4",
            "testsrc_vp8.webm",
            "testsrc_vp9.webm",
            "testsrc_hevc.mp4",
            "testsrc_h264.ts",
        ] {
            let v = decode_video(&media(name), &all(), &VideoLimits::default()).unwrap();
            assert_consistent(&v);
            assert_eq!((v.width, v.height), (64, 48), "{name}");
            assert_eq!(v.total_frames, 25, "{name}");
            assert_eq!(v.frame_indices, (0..25).collect::<Vec<_>>(), "{name}");
            assert!((v.source_fps - 25.0).abs() < 1e-9, "{name}");
            assert!((v.timestamps_s[24] - 0.96).abs() < 1e-6, "{name}");
            // testsrc's counter moves: consecutive frames differ, and the picture is not blank.
            assert!(v.frames[0] != v.frames[24], "{name}");
            assert!(v.frames[0].as_raw().iter().any(|&b| b > 128), "{name}");
        }
    }

    /// Our frames against the ffmpeg CLI's (an independent decode and RGB conversion, made by
    /// `tests/media/make_video_reference.sh`): the same pictures (identical with FFmpeg 5.1's
    /// CLI; the bound of 1 level of mean absolute difference leaves room for another version's
    /// YUV-to-RGB rounding), each closer to its own reference than to the other references.
    #[test]
    fn frames_match_an_independent_decoder() {
        let cases: [(&str, &[usize]); 6] = [
            ("testsrc_h264.mp4", &[0, 6, 25, 49]),
            ("testsrc_mpeg4.mp4", &[0, 12, 24]),
            ("testsrc_vp8.webm", &[0, 12, 24]),
            ("testsrc_vp9.webm", &[0, 12, 24]),
            ("testsrc_hevc.mp4", &[0, 12, 24]),
            ("testsrc_h264.ts", &[0, 12, 24]),
        ];
        for (name, indices) in cases {
            let v = decode_video(&media(name), &all(), &VideoLimits::default()).unwrap();
            let stem = name.replace('.', "_");
            let reference = |i: usize| {
                let path = format!(
                    "{}/tests/media/video_reference/{stem}_{i}.png",
                    env!("CARGO_MANIFEST_DIR")
                );
                image::open(&path)
                    .unwrap_or_else(|e| panic!("{path}: {e}"))
                    .to_rgb8()
            };
            let refs: Vec<RgbImage> = indices.iter().map(|&i| reference(i)).collect();
            for (k, &i) in indices.iter().enumerate() {
                let ours = &v.frames[i];
                let own = mean_abs_diff(ours, &refs[k]);
                assert!(own <= 1.0, "{name} frame {i}: mean abs diff {own:.2}");
                for (m, other) in refs.iter().enumerate().filter(|(m, _)| *m != k) {
                    let d = mean_abs_diff(ours, other);
                    assert!(
                        own < d,
                        "{name} frame {i} is as close to reference {} ({d:.2}) as to its own ({own:.2})",
                        indices[m]
                    );
                }
            }
        }
    }

    #[test]
    fn sampled_frames_equal_the_full_decode() {
        for name in [
            "testsrc_h264.mp4",
            "testsrc_mpeg4.mp4",
            "testsrc_vp8.webm",
            "testsrc_vp9.webm",
            "testsrc_hevc.mp4",
            "testsrc_h264.ts",
        ] {
            let data = media(name);
            let full = decode_video(&data, &all(), &VideoLimits::default()).unwrap();
            assert_eq!(
                full.frame_indices,
                (0..full.total_frames).collect::<Vec<_>>()
            );
            for n in [1, 3, 8, 13] {
                let some = decode_video(&data, &opts(n), &VideoLimits::default()).unwrap();
                assert_eq!(some.frames.len(), n, "{name} n={n}");
                for (frame, &i) in some.frames.iter().zip(&some.frame_indices) {
                    assert!(
                        *frame == full.frames[i],
                        "{name}: frame {i} differs from the full decode"
                    );
                    assert_eq!(some.timestamps_s.len(), some.frames.len());
                }
            }
        }
    }

    #[test]
    fn decoder_threads_do_not_change_frames() {
        let data = media("testsrc_h264.mp4");
        let one = VideoLimits {
            decoder_threads: 1,
            ..VideoLimits::default()
        };
        let a = decode_video(&data, &opts(7), &one).unwrap();
        let b = decode_video(&data, &opts(7), &VideoLimits::default()).unwrap();
        assert_eq!(a.frame_indices, b.frame_indices);
        assert!(a.frames == b.frames);
    }

    #[test]
    fn fps_and_max_duration() {
        let data = media("testsrc_h264.mp4");
        let v = decode_video(
            &data,
            &VideoIoOptions {
                fps: Some(2.0),
                ..VideoIoOptions::default()
            },
            &VideoLimits::default(),
        )
        .unwrap();
        assert_eq!(v.frame_indices, vec![0, 16, 32, 49]);

        let v = decode_video(
            &data,
            &VideoIoOptions {
                max_duration_s: Some(1.0),
                ..VideoIoOptions::default()
            },
            &VideoLimits::default(),
        )
        .unwrap();
        assert_eq!(v.frame_indices, (0..25).collect::<Vec<_>>());
        assert!(v.timestamps_s.iter().all(|&t| t < 1.0));
        assert_eq!(v.total_frames, 50);

        let v = decode_video(
            &data,
            &VideoIoOptions {
                num_frames: 3,
                fps: Some(10.0),
                max_duration_s: Some(0.5),
            },
            &VideoLimits::default(),
        )
        .unwrap();
        // 0.5 s = frames 0..=12; fps allows floor(13 / 25 * 10) = 5, num_frames 3 wins.
        assert_eq!(v.frame_indices, vec![0, 6, 12]);
    }

    #[test]
    fn empty_and_garbage_are_errors() {
        let limits = VideoLimits::default();
        assert_eq!(
            decode_video(&[], &all(), &limits).unwrap_err(),
            VideoError::Empty
        );
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let garbage: Vec<u8> = (0..20_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        assert!(matches!(
            decode_video(&garbage, &all(), &limits),
            Err(VideoError::Decode(_))
        ));
        assert!(matches!(
            decode_video(b"\0\0\0\x18ftypmp42", &all(), &limits),
            Err(VideoError::Decode(_))
        ));
        // A JPEG is not a video container we open.
        let jpeg = jpeg_frame(16, 16, [10, 20, 30]);
        assert!(decode_video(&jpeg, &all(), &limits).is_err());
    }

    /// Playlists and concat scripts would make FFmpeg open other files or
    /// URLs: their demuxers are not on the list, so they are refused at the probe.
    #[test]
    fn playlists_and_scripts_are_refused() {
        let limits = VideoLimits::default();
        for (data, format) in [
            (
                &b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nfile:///etc/hostname\n#EXT-X-ENDLIST\n"[..],
                "hls",
            ),
            (&b"ffconcat version 1.0\nfile /etc/hostname\n"[..], "concat"),
        ] {
            match decode_video(data, &all(), &limits) {
                Err(VideoError::Decode(msg)) => {
                    assert!(msg.contains(&format!("'{format}'")), "{msg}");
                    assert!(msg.contains("not supported"), "{msg}");
                }
                other => panic!("{format}: unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn truncated_files_never_panic() {
        let limits = VideoLimits::default();
        for name in [
            "testsrc_h264.mp4",
            "testsrc_vp8.webm",
            "testsrc_vp9.webm",
            "testsrc_mpeg4.mp4",
            "testsrc_hevc.mp4",
            "testsrc_h264.ts",
        ] {
            let data = media(name);
            for cut in [16, 100, 600, data.len() / 3, data.len() / 2, data.len() - 7] {
                match decode_video(&data[..cut], &all(), &limits) {
                    Ok(v) => {
                        assert_consistent(&v);
                        assert!(!v.frames.is_empty());
                    }
                    Err(VideoError::Decode(msg)) => assert!(!msg.is_empty()),
                    Err(other) => panic!("{name} cut at {cut}: unexpected {other:?}"),
                }
            }
            assert!(
                decode_video(&data[..16], &all(), &limits).is_err(),
                "{name}"
            );
        }
    }

    #[test]
    fn corrupt_payload_never_panics() {
        let limits = VideoLimits::default();
        for name in ["testsrc_h264.mp4", "testsrc_vp9.webm", "testsrc_h264.ts"] {
            let mut data = media(name);
            let len = data.len();
            for i in (len / 4..len).step_by(97) {
                data[i] ^= 0x5a;
            }
            match decode_video(&data, &VideoIoOptions::default(), &limits) {
                Ok(v) => assert_consistent(&v),
                Err(VideoError::Decode(_)) => {}
                Err(other) => panic!("{name}: unexpected {other:?}"),
            }
        }
    }

    /// The `avc1` sample entry's width and height, patched to 40000x40000:
    /// refused from the container header, before FFmpeg opens a decoder.
    #[test]
    fn absurd_dimensions_in_the_header() {
        let mut data = media("testsrc_h264.mp4");
        let stsd = find(&data, b"stsd", 0).unwrap();
        let avc1 = find(&data, b"avc1", stsd).unwrap();
        // type(4) + reserved(6) + data_reference_index(2) + predefined/reserved(16)
        assert_eq!(&data[avc1 + 28..avc1 + 32], &[0, 160, 0, 120]);
        data[avc1 + 28..avc1 + 32].copy_from_slice(&[0x9c, 0x40, 0x9c, 0x40]);
        let err = decode_video(&data, &all(), &VideoLimits::default()).unwrap_err();
        assert_eq!(
            err,
            VideoError::TooLarge {
                width: 40000,
                height: 40000,
                max_width: 8192,
                max_height: 8192
            }
        );
        assert_eq!(
            err.to_string(),
            "The video is 40000x40000, over the limit of 8192x8192."
        );
    }

    #[test]
    fn size_caps() {
        let data = media("testsrc_h264.mp4");
        let narrow = VideoLimits {
            max_width: 100,
            ..VideoLimits::default()
        };
        assert!(matches!(
            decode_video(&data, &all(), &narrow),
            Err(VideoError::TooLarge {
                width: 160,
                height: 120,
                ..
            })
        ));
        let few_pixels = VideoLimits {
            max_pixels_per_frame: 160 * 120 - 1,
            ..VideoLimits::default()
        };
        assert!(matches!(
            decode_video(&data, &all(), &few_pixels),
            Err(VideoError::TooManyPixels { pixels: 19200, .. })
        ));
        let little_memory = VideoLimits {
            max_total_pixels: 160 * 120 * 10,
            ..VideoLimits::default()
        };
        assert!(matches!(
            decode_video(&data, &opts(11), &little_memory),
            Err(VideoError::TooManyTotalPixels { .. })
        ));
        assert_eq!(
            decode_video(&data, &opts(10), &little_memory)
                .unwrap()
                .frames
                .len(),
            10
        );
    }

    #[test]
    fn frame_caps() {
        let data = media("testsrc_h264.mp4");
        let few_frames = VideoLimits {
            max_frames: 20,
            ..VideoLimits::default()
        };
        assert_eq!(
            decode_video(&data, &all(), &few_frames).unwrap_err(),
            VideoError::TooManyFrames {
                frames: 50,
                max: 20
            }
        );
        assert_eq!(
            decode_video(&data, &opts(20), &few_frames)
                .unwrap()
                .frames
                .len(),
            20
        );
        let short_scan = VideoLimits {
            max_total_frames_scanned: 30,
            ..VideoLimits::default()
        };
        // The container claims 50 frames: refused before any walking.
        assert_eq!(
            decode_video(&data, &opts(4), &short_scan).unwrap_err(),
            VideoError::TooLong {
                frames: 50,
                max: 30
            }
        );
        // webm states no count: the walk itself stops at the cap.
        let webm = media("testsrc_vp8.webm");
        let short_scan = VideoLimits {
            max_total_frames_scanned: 10,
            ..VideoLimits::default()
        };
        assert!(matches!(
            decode_video(&webm, &opts(4), &short_scan),
            Err(VideoError::TooLong { max: 10, .. })
        ));
    }

    /// `stsz`'s sample count patched to 2^31 - 1: a claim over the scan cap.
    #[test]
    fn absurd_frame_count_claim() {
        let mut data = media("testsrc_h264.mp4");
        let stsz = find(&data, b"stsz", 0).unwrap();
        // type(4) + version/flags(4) + sample_size(4), then sample_count(4)
        let at = stsz + 12;
        assert_eq!(&data[at..at + 4], &50u32.to_be_bytes());
        data[at..at + 4].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
        // FFmpeg's mov demuxer refuses the table (its allocation is capped);
        // the message carries FFmpeg's reason.
        match decode_video(&data, &VideoIoOptions::default(), &VideoLimits::default()) {
            Err(VideoError::TooLong { .. }) => {}
            Err(VideoError::Decode(msg)) => assert!(!msg.contains("()"), "{msg}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn zero_time_budget_times_out() {
        let limits = VideoLimits {
            time_budget: Duration::ZERO,
            ..VideoLimits::default()
        };
        let err = decode_video(&media("testsrc_h264.mp4"), &all(), &limits).unwrap_err();
        assert_eq!(err, VideoError::Timeout { seconds: 0.0 });
        assert_eq!(err.to_string(), "Decoding the video took longer than 0 s.");
    }

    fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
        hay.get(from..)?
            .windows(needle.len())
            .position(|w| w == needle)
            .map(|p| p + from)
    }
}

#[cfg(not(feature = "video"))]
#[test]
fn without_ffmpeg_decoding_is_a_typed_error() {
    let err = decode_video(
        b"\0\0\0\x18ftypmp42",
        &VideoIoOptions::default(),
        &VideoLimits::default(),
    )
    .unwrap_err();
    assert_eq!(err, VideoError::NotCompiled);
}

fn jpeg_frame(width: u32, height: u32, rgb: [u8; 3]) -> Vec<u8> {
    let img = RgbImage::from_pixel(width, height, image::Rgb(rgb));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Jpeg).unwrap();
    out.into_inner()
}

fn jpeg_list(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            Bytes::from(jpeg_frame(
                32,
                24,
                [(i * 50) as u8, 100, 200 - (i * 40) as u8],
            ))
        })
        .collect()
}

#[test]
fn jpeg_list_is_sampled_uniformly() {
    let frames = jpeg_list(5);
    let v = decode_jpeg_frames(&frames, &opts(3), &VideoLimits::default()).unwrap();
    assert_consistent(&v);
    assert_eq!(v.frame_indices, vec![0, 2, 4]);
    assert_eq!(v.timestamps_s, vec![0.0, 2.0, 4.0]);
    assert_eq!((v.width, v.height, v.total_frames), (32, 24, 5));
    assert_eq!(v.source_fps, 1.0);
    for (frame, &i) in v.frames.iter().zip(&v.frame_indices) {
        let expected = RgbImage::from_pixel(
            32,
            24,
            image::Rgb([(i * 50) as u8, 100, 200 - (i * 40) as u8]),
        );
        assert!(mean_abs_diff(frame, &expected) < 3.0, "frame {i}");
    }
    let v =
        decode_jpeg_frames(&frames, &VideoIoOptions::default(), &VideoLimits::default()).unwrap();
    assert_eq!(v.frame_indices, vec![0, 1, 2, 3, 4]);
    let v = decode_jpeg_frames(
        &frames,
        &VideoIoOptions {
            fps: Some(0.5),
            ..VideoIoOptions::default()
        },
        &VideoLimits::default(),
    )
    .unwrap();
    // 5 s at 1 fps, sampled at 0.5 fps: floor(2.5) = 2 frames.
    assert_eq!(v.frame_indices, vec![0, 4]);
}

#[test]
fn jpeg_list_errors() {
    let limits = VideoLimits::default();
    assert_eq!(
        decode_jpeg_frames(&[], &all(), &limits).unwrap_err(),
        VideoError::Empty
    );

    let mut frames = jpeg_list(4);
    let mut png = Cursor::new(Vec::new());
    RgbImage::new(32, 24)
        .write_to(&mut png, ImageFormat::Png)
        .unwrap();
    frames[3] = Bytes::from(png.into_inner());
    // Frame 3 is checked even though only frame 0 would be kept.
    assert_eq!(
        decode_jpeg_frames(&frames, &opts(1), &limits).unwrap_err(),
        VideoError::NotJpeg { index: 3 }
    );
    frames[3] = Bytes::from_static(b"not an image at all");
    assert_eq!(
        decode_jpeg_frames(&frames, &all(), &limits).unwrap_err(),
        VideoError::NotJpeg { index: 3 }
    );
    // A JPEG cut short after its header: a decode error, not a panic.
    let whole = jpeg_frame(32, 24, [1, 2, 3]);
    frames[3] = Bytes::from(whole[..whole.len() / 2].to_vec());
    assert!(matches!(
        decode_jpeg_frames(&frames, &all(), &limits),
        Err(VideoError::Decode(_))
    ));

    let mut frames = jpeg_list(3);
    frames[1] = Bytes::from(jpeg_frame(16, 16, [0, 0, 0]));
    let err = decode_jpeg_frames(&frames, &all(), &limits).unwrap_err();
    assert!(matches!(
        err,
        VideoError::FrameSizeMismatch {
            index: 1,
            width: 16,
            height: 16,
            ..
        }
    ));

    let small = VideoLimits {
        max_width: 31,
        ..VideoLimits::default()
    };
    assert!(matches!(
        decode_jpeg_frames(&jpeg_list(2), &all(), &small),
        Err(VideoError::TooLarge { width: 32, .. })
    ));
    let few = VideoLimits {
        max_frames: 4,
        ..VideoLimits::default()
    };
    assert_eq!(
        decode_jpeg_frames(&jpeg_list(6), &all(), &few).unwrap_err(),
        VideoError::TooManyFrames { frames: 6, max: 4 }
    );
    assert_eq!(
        decode_jpeg_frames(&jpeg_list(6), &opts(4), &few)
            .unwrap()
            .frames
            .len(),
        4
    );
    let short_scan = VideoLimits {
        max_total_frames_scanned: 5,
        ..VideoLimits::default()
    };
    assert!(matches!(
        decode_jpeg_frames(&jpeg_list(6), &opts(2), &short_scan),
        Err(VideoError::TooLong { frames: 6, max: 5 })
    ));
    let no_time = VideoLimits {
        time_budget: Duration::ZERO,
        ..VideoLimits::default()
    };
    assert_eq!(
        decode_jpeg_frames(&jpeg_list(2), &all(), &no_time).unwrap_err(),
        VideoError::Timeout { seconds: 0.0 }
    );
}

#[test]
fn jpeg_header_claiming_a_huge_frame_is_refused_before_decoding() {
    let mut data = jpeg_frame(32, 24, [9, 9, 9]);
    // SOF0: FF C0, length(2), precision(1), height(2), width(2).
    let sof = data.windows(2).position(|w| w == [0xff, 0xc0]).unwrap();
    data[sof + 5..sof + 9].copy_from_slice(&[0xea, 0x60, 0xea, 0x60]); // 60000x60000
    let err =
        decode_jpeg_frames(&[Bytes::from(data)], &all(), &VideoLimits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            VideoError::TooLarge {
                width: 60000,
                height: 60000,
                ..
            }
        ),
        "{err:?}"
    );
}
