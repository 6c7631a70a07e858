//! Audio: decoding under a duration cap, resampling and the Whisper log-mel.
//!
//! * [`decode_audio`] (in `decode.rs`) reads WAV, MP3, FLAC, Ogg Vorbis and
//!   AAC/M4A from memory with symphonia (the bytes decide the format; the MIME
//!   type is only a hint), refuses a declared duration over the cap before
//!   decoding, counts frames while decoding and stops at the cap, and
//!   downmixes to mono by the mean of the channels.
//! * [`resample`] (in `resample.rs`) converts between sample rates with
//!   rubato's FFT resampler.
//! * [`LogMel::log_mel`] (in `mel.rs`) computes the log-mel
//!   spectrogram exactly as openai-whisper and Hugging Face's
//!   `WhisperFeatureExtractor` do.
//! * [`audio_to_features`] chains the three.

use policies::AudioLoadOptions;

mod decode;
mod mel;
mod resample;

pub use decode::{declared_frames, decode_audio, DecodedAudio};
pub use media::spec::{MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, WHISPER_SAMPLE_RATE};
pub use mel::{AudioFeatures, LogMel, WhisperFeatureConfig};
pub use resample::{resample, resampled_len};

/// The decoded-duration cap's default (CONTRACT section 4).
pub const DEFAULT_MAX_DURATION_S: f64 = 600.0;
/// Most channels a decoded stream may have.
pub const MAX_CHANNELS: usize = 64;

/// Errors of audio decoding and processing; every one is a 400 naming the problem.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum AudioError {
    /// The container declares a duration over the cap (refused before decoding).
    #[error("The audio is {seconds:.1} s long, over the limit of {max} s.")]
    TooLong { seconds: f64, max: f64 },
    /// Decoding reached the cap (the container declared no length, or a wrong one).
    #[error("The audio is longer than the limit of {max} s (decoding stopped there).")]
    TooLongWhileDecoding { max: f64 },
    #[error("The audio data is empty (0 bytes).")]
    EmptyInput,
    #[error("The audio contains no samples.")]
    NoSamples,
    #[error("Cannot decode the audio: {0}")]
    Decode(String),
    #[error(
        "The audio's sample rate of {rate} Hz is not supported (allowed: {MIN_SAMPLE_RATE} to \
         {MAX_SAMPLE_RATE} Hz)."
    )]
    BadSampleRate { rate: u64 },
    #[error("The audio has {channels} channels (allowed: 1 to {MAX_CHANNELS}).")]
    BadChannels { channels: usize },
    /// A server-side setting: a preprocessor config key or the duration cap.
    #[error("Invalid audio processing setting {key}: {reason}")]
    InvalidConfig { key: String, reason: String },
    #[error("Cannot resample the audio: {0}")]
    Resample(String),
}

impl From<media::spec::SpecError> for AudioError {
    fn from(e: media::spec::SpecError) -> Self {
        let (key, reason) = e.into_parts();
        AudioError::InvalidConfig { key, reason }
    }
}

/// Checks a sample rate against [`MIN_SAMPLE_RATE`]..=[`MAX_SAMPLE_RATE`].
pub(crate) fn check_rate(rate: u64) -> Result<u32, AudioError> {
    u32::try_from(rate)
        .ok()
        .filter(|r| (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(r))
        .ok_or(AudioError::BadSampleRate { rate })
}

/// How audio is read: the `audio` entry of media_io_kwargs plus the duration cap.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioIoOptions {
    /// Decoded-duration cap in seconds (default 600).
    pub max_duration_s: f64,
    /// When set, [`decode_audio`] resamples its output to this rate.
    pub target_sample_rate: Option<u32>,
}

impl Default for AudioIoOptions {
    fn default() -> Self {
        AudioIoOptions {
            max_duration_s: DEFAULT_MAX_DURATION_S,
            target_sample_rate: None,
        }
    }
}

impl AudioIoOptions {
    /// How a request's audio is read: its typed `media_io_kwargs.audio` under the server's
    /// duration cap (seconds).
    pub fn new(load: &AudioLoadOptions, max_duration_s: f64) -> Self {
        AudioIoOptions {
            max_duration_s,
            target_sample_rate: load.target_sample_rate,
        }
    }
}

/// The whole pipeline: decode -> mono -> resample to `cfg.sample_rate` ->
/// log-mel. The model's rate wins over `opts.target_sample_rate` (the audio
/// is resampled once, straight to the rate the features need).
pub fn audio_to_features(
    bytes: &[u8],
    mime_hint: Option<&str>,
    opts: &AudioIoOptions,
    cfg: &WhisperFeatureConfig,
) -> Result<AudioFeatures, AudioError> {
    let decode_opts = AudioIoOptions {
        target_sample_rate: None,
        ..opts.clone()
    };
    let decoded = decode_audio(bytes, mime_hint, &decode_opts)?;
    let samples = resample(&decoded.samples, decoded.sample_rate, cfg.sample_rate)?;
    cfg.log_mel(&samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_options_keep_the_server_cap() {
        let o = AudioIoOptions::new(
            &AudioLoadOptions {
                target_sample_rate: Some(8_000),
            },
            30.0,
        );
        assert_eq!(
            (o.target_sample_rate, o.max_duration_s),
            (Some(8_000), 30.0)
        );
        // The accepted request rates are the decoder's.
        assert_eq!(
            (MIN_SAMPLE_RATE, MAX_SAMPLE_RATE),
            (
                policies::options::MIN_TARGET_SAMPLE_RATE,
                policies::options::MAX_TARGET_SAMPLE_RATE
            )
        );
    }

    #[test]
    fn error_messages_name_the_problem() {
        let e = AudioError::TooLong {
            seconds: 3605.2,
            max: 600.0,
        };
        assert_eq!(
            e.to_string(),
            "The audio is 3605.2 s long, over the limit of 600 s."
        );
        assert_eq!(
            AudioError::BadSampleRate { rate: 5 }.to_string(),
            "The audio's sample rate of 5 Hz is not supported (allowed: 1000 to 384000 Hz)."
        );
        assert!(check_rate(16_000).is_ok());
        assert!(check_rate(999).is_err());
        assert!(check_rate(u64::MAX).is_err());
    }
}
