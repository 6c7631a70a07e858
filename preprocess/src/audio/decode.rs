//! Decoding: symphonia over the in-memory bytes, with the duration cap
//! enforced from the header and again while decoding, downmixed to mono.

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use symphonia::core::codecs::audio::{AudioDecoder, AudioDecoderOptions};
use symphonia::core::common::Limit;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSourceStream, MediaSourceStreamOptions};
use symphonia::core::meta::MetadataOptions;

use super::{check_rate, resample, AudioError, AudioIoOptions, MAX_CHANNELS};

/// Packets that may fail to decode in a row before the stream counts as broken.
const MAX_CONSECUTIVE_BAD_PACKETS: usize = 8;
/// Packets that may fail to decode in a whole stream.
const MAX_BAD_PACKETS: usize = 32;
/// Demuxer errors tolerated (each may skip damaged data) before giving up.
const MAX_DEMUX_ERRORS: usize = 8;
/// Packets beyond one per input byte that a stream may have (empty packets).
const MAX_EMPTY_PACKET_SLACK: usize = 65_536;
/// Tags and pictures are never used; keep what the demuxer may hold small.
const MAX_METADATA_BYTES: usize = 64 * 1024;

/// Decoded audio, downmixed to mono.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedAudio {
    /// Mono samples in [-1, 1] (the mean of the source channels).
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// Channels in the source stream.
    pub source_channels: usize,
    /// `samples.len() / sample_rate`, in seconds.
    pub duration_s: f64,
}

/// Decodes WAV, MP3, FLAC, Ogg Vorbis or AAC/M4A bytes to mono f32.
///
/// `mime_hint` (e.g. `audio/mpeg`) only helps the probe; the bytes decide.
/// A declared duration over `opts.max_duration_s` is refused before any
/// decoding, and decoding stops with the same error once the decoded frames
/// pass the cap. A few corrupt packets are skipped (as ffmpeg does); a stream
/// with no decodable audio is an error. When `opts.target_sample_rate` is set
/// the result is resampled to it.
pub fn decode_audio(
    bytes: &[u8],
    mime_hint: Option<&str>,
    opts: &AudioIoOptions,
) -> Result<DecodedAudio, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::EmptyInput);
    }
    if !(opts.max_duration_s.is_finite() && opts.max_duration_s > 0.0) {
        return Err(AudioError::InvalidConfig {
            key: "max_duration_s".to_owned(),
            reason: "must be a positive number of seconds".to_owned(),
        });
    }
    // symphonia is safe Rust, but its own documentation allows that a malformed
    // stream may panic a decoder; a client's bytes must never take the
    // worker down, so a panic becomes a decode error.
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        decode_mono(bytes, mime_hint, opts.max_duration_s)
    }))
    .unwrap_or_else(|_| {
        tracing::warn!("the audio decoder panicked on malformed input");
        Err(AudioError::Decode(
            "the decoder failed on malformed data".to_owned(),
        ))
    })?;
    match opts.target_sample_rate {
        Some(rate) if rate != decoded.sample_rate => {
            let samples = resample(&decoded.samples, decoded.sample_rate, rate)?;
            Ok(DecodedAudio {
                duration_s: samples.len() as f64 / f64::from(rate),
                samples,
                sample_rate: rate,
                source_channels: decoded.source_channels,
            })
        }
        _ => Ok(decoded),
    }
}

fn probe_hint(mime_hint: Option<&str>) -> Hint {
    let mut hint = Hint::new();
    if let Some(mime) = mime_hint {
        // `audio/mpeg; codecs=...` -> `audio/mpeg`.
        let essence = mime.split(';').next().unwrap_or("").trim();
        if !essence.is_empty() {
            hint.mime_type(&essence.to_ascii_lowercase());
        }
        // An `input_audio` part's `format` becomes `audio/<format>`: pass it on
        // as an extension hint too (`audio/mp3`, `audio/wav`, `audio/flac`).
        if let Some(sub) = essence.strip_prefix("audio/") {
            let ext = match sub {
                "mpeg" | "mp3" => Some("mp3"),
                "wav" | "x-wav" | "wave" | "vnd.wave" => Some("wav"),
                "flac" | "x-flac" => Some("flac"),
                "ogg" | "vorbis" => Some("ogg"),
                "mp4" | "m4a" | "x-m4a" | "aac" => Some("m4a"),
                _ => None,
            };
            if let Some(ext) = ext {
                hint.with_extension(ext);
            }
        }
    }
    hint
}

fn symphonia_message(e: &SymError) -> String {
    match e {
        SymError::Unsupported(what) if what.contains("probe") => {
            "the data is not a supported audio format (WAV, MP3, FLAC, Ogg Vorbis, AAC/M4A)"
                .to_owned()
        }
        SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            "the data ends early (a truncated or incomplete file)".to_owned()
        }
        other => other.to_string(),
    }
}

/// The container's declared length in seconds, when it has one.
fn declared_seconds(track: &symphonia::core::formats::Track, rate: Option<u32>) -> Option<f64> {
    if let (Some(frames), Some(rate)) = (track.num_frames, rate.filter(|r| *r > 0)) {
        return Some(frames as f64 / f64::from(rate));
    }
    match (track.duration, track.time_base) {
        (Some(d), Some(tb)) => {
            Some(d.get() as f64 * f64::from(tb.numer.get()) / f64::from(tb.denom.get()))
        }
        _ => None,
    }
}

/// Mono samples, grown in steps but never past the cap's frame count.
struct MonoBuffer {
    samples: Vec<f32>,
    max_frames: usize,
}

impl MonoBuffer {
    fn new(max_frames: usize, expected: Option<u64>) -> MonoBuffer {
        // The header's count is untrusted: reserve at most the cap.
        let reserve = expected
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
            .min(max_frames);
        MonoBuffer {
            samples: Vec::with_capacity(reserve),
            max_frames,
        }
    }

    /// Room for `extra` more frames; false when that would pass the cap.
    fn make_room(&mut self, extra: usize) -> bool {
        let needed = match self.samples.len().checked_add(extra) {
            Some(n) if n <= self.max_frames => n,
            _ => return false,
        };
        if needed > self.samples.capacity() {
            let grown = self
                .samples
                .capacity()
                .saturating_mul(2)
                .clamp(needed, self.max_frames);
            self.samples.reserve_exact(grown - self.samples.len());
        }
        true
    }
}

/// The container, probed from its header (nothing is decoded).
fn open_format<'a>(
    bytes: &'a [u8],
    mime_hint: Option<&str>,
) -> Result<Box<dyn FormatReader + 'a>, AudioError> {
    let mss = MediaSourceStream::new(
        Box::new(Cursor::new(bytes)),
        MediaSourceStreamOptions::default(),
    );
    let meta_opts = MetadataOptions::default()
        .limit_tag_bytes(Limit::Maximum(MAX_METADATA_BYTES))
        .limit_visual_bytes(Limit::Maximum(MAX_METADATA_BYTES));
    symphonia::default::get_probe()
        .probe(
            &probe_hint(mime_hint),
            mss,
            FormatOptions::default(),
            meta_opts,
        )
        .map_err(|e| AudioError::Decode(symphonia_message(&e)))
}

/// What the container's header declares for its audio track: frames per channel and the
/// sample rate. `None` when the header does not say (the decode then finds out).
pub fn declared_frames(bytes: &[u8], mime_hint: Option<&str>) -> Option<(u64, u32)> {
    catch_unwind(AssertUnwindSafe(|| {
        let format = open_format(bytes, mime_hint).ok()?;
        let track = format.default_track(TrackType::Audio)?;
        let rate = track.codec_params.as_ref()?.audio()?.sample_rate?;
        Some((track.num_frames?, check_rate(u64::from(rate)).ok()?))
    }))
    .ok()
    .flatten()
}

fn decode_mono(
    bytes: &[u8],
    mime_hint: Option<&str>,
    max_duration_s: f64,
) -> Result<DecodedAudio, AudioError> {
    let mut format = open_format(bytes, mime_hint)?;

    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| AudioError::Decode("the file has no audio track".to_owned()))?;
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| AudioError::Decode("the audio track has no codec parameters".to_owned()))?
        .clone();

    let declared_rate = match params.sample_rate {
        Some(rate) => Some(check_rate(u64::from(rate))?),
        None => None,
    };
    if let Some(channels) = params.channels.as_ref().map(|c| c.count()) {
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(AudioError::BadChannels { channels });
        }
    }
    if let Some(seconds) = declared_seconds(track, declared_rate) {
        if seconds > max_duration_s {
            return Err(AudioError::TooLong {
                seconds,
                max: max_duration_s,
            });
        }
    }
    let expected_frames = track.num_frames;

    let mut decoder: Box<dyn AudioDecoder> = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| AudioError::Decode(symphonia_message(&e)))?;

    let mut out: Option<MonoBuffer> = None;
    let mut rate = declared_rate;
    let mut source_channels = params.channels.as_ref().map(|c| c.count());
    let mut planes: Vec<Vec<f32>> = Vec::new();
    let (mut bad_packets, mut bad_in_a_row, mut demux_errors) = (0usize, 0usize, 0usize);
    let mut last_error: Option<String> = None;
    // Every packet comes out of the input; more packets than bytes (plus slack
    // for empty ones) means a demuxer going round in circles.
    let max_packets = bytes.len().saturating_add(MAX_EMPTY_PACKET_SLACK);
    let mut packets = 0usize;

    loop {
        packets += 1;
        if packets > max_packets {
            return Err(AudioError::Decode(
                "the stream has more packets than its size allows".to_owned(),
            ));
        }
        let packet = match format.next_packet() {
            Ok(Some(packet)) => packet,
            // The end, or a chained stream (a new track list): stop at the first.
            Ok(None) | Err(SymError::ResetRequired) => break,
            // Truncated data: keep what decoded.
            Err(SymError::IoError(e)) => {
                tracing::debug!(error = %e, "audio stream ended early");
                break;
            }
            Err(SymError::DecodeError(what)) => {
                demux_errors += 1;
                last_error = Some(format!("malformed stream: {what}"));
                if demux_errors > MAX_DEMUX_ERRORS {
                    break;
                }
                continue;
            }
            Err(e) => return Err(AudioError::Decode(symphonia_message(&e))),
        };
        if packet.track_id != track_id {
            continue;
        }
        let buf = match decoder.decode(&packet) {
            Ok(buf) => {
                bad_in_a_row = 0;
                buf
            }
            Err(e @ (SymError::DecodeError(_) | SymError::IoError(_))) => {
                bad_packets += 1;
                bad_in_a_row += 1;
                tracing::debug!(error = %e, "skipping an undecodable audio packet");
                last_error = Some(e.to_string());
                if bad_packets > MAX_BAD_PACKETS || bad_in_a_row > MAX_CONSECUTIVE_BAD_PACKETS {
                    break;
                }
                continue;
            }
            Err(e) => return Err(AudioError::Decode(symphonia_message(&e))),
        };
        let frames = buf.frames();
        if frames == 0 {
            continue;
        }
        let spec = buf.spec();
        let buf_rate = check_rate(u64::from(spec.rate()))?;
        let channels = spec.channels().count();
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(AudioError::BadChannels { channels });
        }
        match rate {
            Some(r) if r != buf_rate => {
                return Err(AudioError::Decode(format!(
                    "the sample rate changes mid-stream ({r} Hz to {buf_rate} Hz)"
                )))
            }
            _ => rate = Some(buf_rate),
        }
        source_channels.get_or_insert(channels);
        let out = out.get_or_insert_with(|| {
            // The cap in frames at this rate (the cap is a finite positive
            // number of seconds, the rate at most MAX_SAMPLE_RATE).
            let max_frames = (max_duration_s * f64::from(buf_rate)).floor();
            let max_frames = if max_frames >= usize::MAX as f64 {
                usize::MAX
            } else {
                max_frames as usize
            };
            MonoBuffer::new(max_frames, expected_frames)
        });
        if !out.make_room(frames) {
            return Err(AudioError::TooLongWhileDecoding {
                max: max_duration_s,
            });
        }
        buf.copy_to_vecs_planar::<f32>(&mut planes);
        downmix_into(&planes, frames, &mut out.samples);
    }

    if bad_packets > 0 || demux_errors > 0 {
        tracing::debug!(bad_packets, demux_errors, "audio decoded with skipped data");
    }
    let samples = out.map(|b| b.samples).unwrap_or_default();
    let (Some(rate), false) = (rate, samples.is_empty()) else {
        return Err(match last_error {
            Some(e) => AudioError::Decode(format!("no decodable audio ({e})")),
            None => AudioError::NoSamples,
        });
    };
    Ok(DecodedAudio {
        duration_s: samples.len() as f64 / f64::from(rate),
        samples,
        sample_rate: rate,
        source_channels: source_channels.unwrap_or(1),
    })
}

/// Appends the mean of `planes` (each at least `frames` long) to `out`.
fn downmix_into(planes: &[Vec<f32>], frames: usize, out: &mut Vec<f32>) {
    let start = out.len();
    match planes {
        [] => {}
        [mono] => out.extend(mono.iter().take(frames)),
        [first, rest @ ..] => {
            out.extend(first.iter().take(frames));
            let dst = out.get_mut(start..).unwrap_or_default();
            for plane in rest {
                for (d, s) in dst.iter_mut().zip(plane) {
                    *d += *s;
                }
            }
            // Sum, then divide: numpy's mean (for two channels (a + b) / 2).
            let n = planes.len() as f32;
            for d in dst.iter_mut() {
                *d /= n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downmix_is_the_channel_mean() {
        let mut out = vec![9.0];
        downmix_into(&[vec![1.0, 2.0, 3.0], vec![3.0, 0.0, -3.0]], 3, &mut out);
        assert_eq!(out, vec![9.0, 2.0, 1.0, 0.0]);
        let mut out = Vec::new();
        downmix_into(&[vec![3.0], vec![0.0], vec![6.0]], 1, &mut out);
        assert_eq!(out, vec![3.0]);
        let mut out = Vec::new();
        downmix_into(&[vec![0.25, 0.5]], 2, &mut out);
        assert_eq!(out, vec![0.25, 0.5]);
    }

    #[test]
    fn buffer_never_grows_past_the_cap() {
        let b = MonoBuffer::new(1000, Some(u64::MAX));
        assert_eq!(b.samples.capacity(), 1000);
        let mut b = MonoBuffer::new(1000, None);
        assert!(b.make_room(600));
        b.samples.resize(600, 0.0);
        assert!(b.make_room(400));
        b.samples.resize(1000, 0.0);
        assert!(b.samples.capacity() <= 1000);
        assert!(!b.make_room(1));
    }

    #[test]
    fn refuses_empty_input_and_a_bad_cap() {
        assert_eq!(
            decode_audio(b"", Some("audio/wav"), &AudioIoOptions::default()),
            Err(AudioError::EmptyInput)
        );
        let opts = AudioIoOptions {
            max_duration_s: f64::NAN,
            target_sample_rate: None,
        };
        assert!(matches!(
            decode_audio(b"RIFF", None, &opts),
            Err(AudioError::InvalidConfig { .. })
        ));
    }
}
