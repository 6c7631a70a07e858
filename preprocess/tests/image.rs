//! Image decoding and processing: every supported format, the pixel cap read from the header,
//! EXIF orientation, image modes, and bad input (each an error, never a panic).
//!
//! Test images are made here with the `image` crate's encoders (a few KB each), so no binary
//! files are committed for images.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Cursor;

use image::codecs::gif::GifEncoder;
use image::{DynamicImage, ImageFormat, Rgb, RgbImage, Rgba, RgbaImage};
use preprocess::image::{
    decode_image, ClipConfig, ImageError, ImageIoOptions, ImageMode, PatchProcessor, ProcessImage,
    Qwen2VlConfig,
};

/// A deterministic picture: gradients and a checker, so resizes have something to do.
fn picture(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let checker = if (x / 4 + y / 4) % 2 == 0 { 40 } else { 0 };
        Rgb([
            ((x * 255) / w.max(1)) as u8,
            ((y * 255) / h.max(1)) as u8,
            (((x + y) * 3) % 200) as u8 + checker,
        ])
    })
}

fn encode(img: &DynamicImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

const FORMATS: [ImageFormat; 5] = [
    ImageFormat::Png,
    ImageFormat::Jpeg,
    ImageFormat::Bmp,
    ImageFormat::Gif,
    ImageFormat::WebP,
];

fn opts() -> ImageIoOptions {
    ImageIoOptions::default()
}

#[test]
fn every_format_decodes_to_rgb() {
    let pic = DynamicImage::ImageRgb8(picture(40, 30));
    for format in FORMATS {
        let bytes = encode(&pic, format);
        assert!(bytes.len() < 20_000, "{format:?} test image is small");
        let decoded = decode_image(&bytes, &opts()).unwrap_or_else(|e| panic!("{format:?}: {e}"));
        let rgb = decoded.into_rgb();
        assert_eq!((rgb.width(), rgb.height()), (40, 30), "{format:?}");
        // Lossless formats round-trip exactly; JPEG and GIF (palette) come close.
        let diff: u64 = rgb
            .as_raw()
            .iter()
            .zip(pic.as_rgb8().unwrap().as_raw())
            .map(|(a, b)| u64::from(a.abs_diff(*b)))
            .sum();
        let mean = diff as f64 / (40.0 * 30.0 * 3.0);
        match format {
            ImageFormat::Png | ImageFormat::Bmp | ImageFormat::WebP => {
                assert_eq!(mean, 0.0, "{format:?}")
            }
            _ => assert!(mean < 12.0, "{format:?}: mean abs diff {mean}"),
        }
    }
}

#[test]
fn alpha_is_composited_onto_the_background() {
    let mut rgba = RgbaImage::from_pixel(8, 8, Rgba([200, 100, 0, 0]));
    rgba.put_pixel(0, 0, Rgba([200, 100, 0, 255]));
    let bytes = encode(&DynamicImage::ImageRgba8(rgba), ImageFormat::Png);
    // Default background is white, as vLLM's.
    let rgb = decode_image(&bytes, &opts()).unwrap().into_rgb();
    assert_eq!(rgb.get_pixel(0, 0).0, [200, 100, 0]);
    assert_eq!(rgb.get_pixel(3, 3).0, [255, 255, 255]);
    let black = ImageIoOptions {
        rgba_background_color: [0, 0, 0],
        ..opts()
    };
    let rgb = decode_image(&bytes, &black).unwrap().into_rgb();
    assert_eq!(rgb.get_pixel(3, 3).0, [0, 0, 0]);
    // RGBA mode keeps the alpha channel.
    let keep = ImageIoOptions {
        image_mode: ImageMode::Rgba,
        ..opts()
    };
    let d = decode_image(&bytes, &keep).unwrap();
    assert_eq!(d.image.as_rgba8().unwrap().get_pixel(3, 3).0[3], 0);
    // L mode is one channel.
    let gray = ImageIoOptions {
        image_mode: ImageMode::L,
        ..opts()
    };
    assert!(decode_image(&bytes, &gray)
        .unwrap()
        .image
        .as_luma8()
        .is_some());
}

/// Inserts an APP1 EXIF segment with the given orientation right after the JPEG's SOI marker.
fn with_exif_orientation(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    let mut tiff = Vec::new();
    tiff.extend_from_slice(b"MM\x00\x2a\x00\x00\x00\x08"); // big-endian TIFF, IFD at 8
    tiff.extend_from_slice(&1u16.to_be_bytes()); // one entry
    tiff.extend_from_slice(&0x0112u16.to_be_bytes()); // Orientation
    tiff.extend_from_slice(&3u16.to_be_bytes()); // SHORT
    tiff.extend_from_slice(&1u32.to_be_bytes()); // count
    tiff.extend_from_slice(&orientation.to_be_bytes());
    tiff.extend_from_slice(&[0, 0]);
    tiff.extend_from_slice(&0u32.to_be_bytes()); // no next IFD
    let mut payload = b"Exif\x00\x00".to_vec();
    payload.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((payload.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&payload);
    out.extend_from_slice(&jpeg[2..]);
    out
}

#[test]
fn exif_orientation_is_applied() {
    let pic = DynamicImage::ImageRgb8(picture(40, 20));
    let jpeg = encode(&pic, ImageFormat::Jpeg);
    // Orientation 6: rotate 90 degrees clockwise to display, so 40x20 shows as 20x40.
    let rotated = decode_image(&with_exif_orientation(&jpeg, 6), &opts()).unwrap();
    assert_eq!((rotated.stored_width, rotated.stored_height), (40, 20));
    let rgb = rotated.into_rgb();
    assert_eq!((rgb.width(), rgb.height()), (20, 40));
    // The stored top-left (dark red channel) ends up at the top-right after the rotation.
    let plain = decode_image(&jpeg, &opts()).unwrap().into_rgb();
    let top_left = plain.get_pixel(0, 0).0;
    let moved = rgb.get_pixel(19, 0).0;
    let d: u32 = top_left
        .iter()
        .zip(moved)
        .map(|(a, b)| u32::from(a.abs_diff(b)))
        .sum();
    assert!(d < 30, "{top_left:?} vs {moved:?}");
    // Orientation 1 is a no-op.
    let same = decode_image(&with_exif_orientation(&jpeg, 1), &opts())
        .unwrap()
        .into_rgb();
    assert_eq!((same.width(), same.height()), (40, 20));
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG whose IHDR claims `w`x`h` (with a valid CRC) followed by a tiny IDAT.
fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8], data: &[u8]| {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    };
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    chunk(b"IHDR", &ihdr);
    chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(b"IEND", &[]);
    out
}

#[test]
fn pixel_cap_is_checked_from_the_header() {
    let err = decode_image(&png_claiming(100_000, 100_000), &opts()).unwrap_err();
    match err {
        ImageError::TooManyPixels {
            width,
            height,
            pixels,
            max,
        } => {
            assert_eq!((width, height), (100_000, 100_000));
            assert_eq!(pixels, 10_000_000_000);
            assert_eq!(max, preprocess::image::DEFAULT_MAX_PIXELS);
        }
        other => panic!("{other}"),
    }
    // A real image over a small cap is refused the same way.
    let bytes = encode(&DynamicImage::ImageRgb8(picture(40, 30)), ImageFormat::Png);
    let small = ImageIoOptions {
        max_pixels: 1000,
        ..opts()
    };
    let err = decode_image(&bytes, &small).unwrap_err();
    assert!(err.to_string().contains("over the limit of 1000"), "{err}");
    // A header within the cap whose data is missing is a decode error, not a panic.
    let err = decode_image(&png_claiming(4000, 4000), &opts()).unwrap_err();
    assert!(matches!(err, ImageError::Decode(_)), "{err}");
}

#[test]
fn gif_with_thousands_of_frames_takes_the_first() {
    let mut bytes = Vec::new();
    {
        let mut enc = GifEncoder::new_with_speed(&mut bytes, 30);
        for i in 0..3000u32 {
            let frame = RgbaImage::from_pixel(2, 2, Rgba([(i % 256) as u8, 7, 9, 255]));
            enc.encode_frame(image::Frame::new(frame)).unwrap();
        }
    }
    // Cut the file in the middle of its later frames: only the first frame is decoded, so
    // the damage after it is never read.
    bytes.truncate(bytes.len() / 2);
    let rgb = decode_image(&bytes, &opts()).unwrap().into_rgb();
    assert_eq!((rgb.width(), rgb.height()), (2, 2));
    assert_eq!(rgb.get_pixel(0, 0).0[0], 0, "first frame");
}

#[test]
fn bad_input_is_an_error_never_a_panic() {
    let pic = DynamicImage::ImageRgb8(picture(64, 48));
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("text".into(), b"this is not an image at all".to_vec()),
        (
            "garbage".into(),
            (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("png magic only".into(), b"\x89PNG\r\n\x1a\n".to_vec()),
        ("jpeg markers only".into(), vec![0xFF, 0xD8, 0xFF, 0xD9]),
        ("zero-size png".into(), png_claiming(0, 0)),
    ];
    for format in FORMATS {
        let good = encode(&pic, format);
        // Cut in the header, in the pixel data, and in the trailer (where a decoder may
        // rightly have every pixel already).
        for (what, cut) in [
            ("header", 12),
            ("data", good.len() / 2),
            ("trailer", good.len() - 3),
        ] {
            cases.push((
                format!("{format:?} truncated in the {what}"),
                good[..cut].to_vec(),
            ));
        }
        // Corrupt the middle (keep the header so the format is still recognised).
        let mut corrupt = good.clone();
        let start = corrupt.len() / 3;
        for b in &mut corrupt[start..start + 64.min(good.len() / 3)] {
            *b ^= 0x5A;
        }
        cases.push((format!("{format:?} corrupt"), corrupt));
    }
    for (name, bytes) in cases {
        // A corrupt middle may still decode (JPEG is forgiving); what must never happen is a
        // panic, and an empty or truncated file must not pass as a whole image.
        let result = std::panic::catch_unwind(|| decode_image(&bytes, &opts()));
        let result = result.unwrap_or_else(|_| panic!("{name}: panicked"));
        // Without its header no format decodes; PNG, BMP and WebP also refuse missing pixel
        // data (JPEG and GIF decoders fill in what is missing, as Pillow's may).
        let lossless = ["Png", "Bmp", "WebP"].iter().any(|f| name.starts_with(f));
        if name.contains("in the header") || (lossless && name.contains("in the data")) {
            assert!(result.is_err(), "{name}: decoded a truncated file");
        }
        if !name.contains("corrupt") && !name.contains("truncated") {
            let err = result.expect_err(&name);
            assert!(!err.to_string().is_empty());
        }
    }
}

#[test]
fn processors_produce_model_shapes() {
    let rgb = picture(1280, 960);
    let clip = ClipConfig::clip_448().process(&rgb).unwrap();
    assert_eq!(clip.pixel_values.shape, vec![3, 448, 448]);
    let qwen = Qwen2VlConfig {
        max_pixels: 1_003_520,
        ..Qwen2VlConfig::default()
    };
    let out = qwen.process(&rgb).unwrap();
    // The anchor's figures for a 1280x960 image: 840x1148, grid [1, 60, 82], 4920 x 1176.
    assert_eq!(out.grid_thw, Some([1, 60, 82]));
    assert_eq!(out.pixel_values.shape, vec![4920, 1176]);
    // max_pixels from mm_processor_kwargs changes the patch count.
    let fewer = Qwen2VlConfig::default()
        .with_options(&policies::ProcessorOptions {
            max_pixels: Some(200_704),
            ..policies::ProcessorOptions::default()
        })
        .unwrap()
        .process(&rgb)
        .unwrap();
    let patches = |p: &preprocess::image::ProcessedImage| p.pixel_values.shape[0];
    assert!(patches(&fewer) < patches(&out) / 4, "{}", patches(&fewer));
}

#[test]
fn video_patch_output_is_bounded_before_it_is_allocated() {
    // 100 small frames that the processor would upscale to 2 M pixels each: 600 M values.
    let frames = vec![picture(64, 64); 100];
    let q = Qwen2VlConfig {
        min_pixels: 2_000_000,
        max_pixels: 2_000_000,
        ..Qwen2VlConfig::default()
    };
    let err = q.process_frames(&frames).unwrap_err();
    assert!(err.to_string().contains("over the limit of"), "{err}");
    // Four of them are fine.
    let ok = q.process_frames(&frames[..4]).unwrap();
    assert_eq!(ok.grid_thw.unwrap()[0], 2);
}
