//! Audio feature-extractor settings (Hugging Face `WhisperFeatureExtractor`), read from a
//! checkpoint's `preprocessor_config.json` and checked so the features they ask for stay bounded.

use serde_json::Value;

use super::SpecError;

/// Whisper's input rate.
pub const WHISPER_SAMPLE_RATE: u32 = 16_000;
/// Lowest sample rate accepted, for decoded audio and for resampling targets.
pub const MIN_SAMPLE_RATE: u32 = 1_000;
/// Highest sample rate accepted, for decoded audio and for resampling targets.
pub const MAX_SAMPLE_RATE: u32 = 384_000;

/// Most values a feature tensor may hold (64 MiB of f32).
const MAX_FEATURE_VALUES: usize = 1 << 24;
/// Largest FFT size accepted from a preprocessor config.
const MAX_N_FFT: usize = 8192;
/// Largest mel bin count accepted.
const MAX_N_MELS: usize = 512;
/// Longest window accepted, in seconds.
const MAX_CHUNK_LENGTH_S: usize = 600;

/// The feature extractor's settings (Hugging Face `WhisperFeatureExtractor`).
#[derive(Debug, Clone, PartialEq)]
pub struct WhisperFeatureConfig {
    /// Mel bins: 80 (Whisper up to large-v2) or 128 (large-v3).
    pub n_mels: usize,
    pub sample_rate: u32,
    pub n_fft: usize,
    pub hop_length: usize,
    /// The window every input is padded or trimmed to, in seconds.
    pub chunk_length_s: usize,
}

fn bad(key: &str, reason: String) -> SpecError {
    SpecError::Audio {
        key: key.to_owned(),
        reason,
    }
}

/// The reason a sample rate is refused, if it is.
fn rate_problem(rate: u64) -> Option<String> {
    let ok = u32::try_from(rate)
        .ok()
        .is_some_and(|r| (MIN_SAMPLE_RATE..=MAX_SAMPLE_RATE).contains(&r));
    (!ok).then(|| {
        format!(
            "The audio's sample rate of {rate} Hz is not supported (allowed: {MIN_SAMPLE_RATE} \
             to {MAX_SAMPLE_RATE} Hz)."
        )
    })
}

impl WhisperFeatureConfig {
    /// Whisper's settings with `n_mels` bins: 16 kHz, `n_fft` 400, hop 160, 30 s.
    pub fn whisper(n_mels: usize) -> Self {
        WhisperFeatureConfig {
            n_mels,
            sample_rate: WHISPER_SAMPLE_RATE,
            n_fft: 400,
            hop_length: 160,
            chunk_length_s: 30,
        }
    }

    /// Reads a `preprocessor_config.json` of a `WhisperFeatureExtractor`:
    /// `feature_size`, `sampling_rate`, `n_fft`, `hop_length`, `chunk_length`
    /// (missing keys take Whisper's defaults; other keys are ignored).
    pub fn from_preprocessor_config(cfg: &Value) -> Result<Self, SpecError> {
        let map = cfg
            .as_object()
            .ok_or_else(|| bad("preprocessor_config", "must be a JSON object".to_owned()))?;
        let mut out = WhisperFeatureConfig::whisper(80);
        let int = |key: &str| -> Result<Option<usize>, SpecError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| bad(key, "must be a positive integer".to_owned())),
            }
        };
        if let Some(n) = int("feature_size")? {
            out.n_mels = n;
        }
        if let Some(n) = int("sampling_rate")? {
            if let Some(problem) = rate_problem(n as u64) {
                return Err(bad("sampling_rate", problem));
            }
            out.sample_rate = n as u32;
        }
        if let Some(n) = int("n_fft")? {
            out.n_fft = n;
        }
        if let Some(n) = int("hop_length")? {
            out.hop_length = n;
        }
        if let Some(n) = int("chunk_length")? {
            out.chunk_length_s = n;
        }
        out.check()?;
        Ok(out)
    }

    /// Samples in the window (480000 for Whisper).
    pub fn n_samples(&self) -> usize {
        self.chunk_length_s
            .saturating_mul(self.sample_rate as usize)
    }

    /// Frames in the output (3000 for Whisper): the centred STFT's frame count
    /// less the dropped last one.
    pub fn n_frames(&self) -> usize {
        let padded = self.n_samples() + 2 * (self.n_fft / 2);
        padded.saturating_sub(self.n_fft) / self.hop_length.max(1)
    }

    /// Frames covering real audio for a clip of `samples` at [`Self::sample_rate`]: the
    /// window's share of it, `ceil(len / hop)`, at most [`Self::n_frames`].
    pub fn valid_frames(&self, samples: usize) -> usize {
        samples
            .min(self.n_samples())
            .div_ceil(self.hop_length.max(1))
            .min(self.n_frames())
    }

    /// The settings are within bounds: the features they ask for exist and fit in memory.
    pub fn check(&self) -> Result<(), SpecError> {
        if !(1..=MAX_N_MELS).contains(&self.n_mels) {
            return Err(bad(
                "feature_size",
                format!("must be from 1 to {MAX_N_MELS}"),
            ));
        }
        if let Some(problem) = rate_problem(u64::from(self.sample_rate)) {
            return Err(bad("sampling_rate", problem));
        }
        if !(2..=MAX_N_FFT).contains(&self.n_fft) {
            return Err(bad("n_fft", format!("must be from 2 to {MAX_N_FFT}")));
        }
        if !(1..=MAX_CHUNK_LENGTH_S).contains(&self.chunk_length_s) {
            return Err(bad(
                "chunk_length",
                format!("must be from 1 to {MAX_CHUNK_LENGTH_S} s"),
            ));
        }
        if self.hop_length == 0 || self.hop_length > self.n_samples() {
            return Err(bad(
                "hop_length",
                "must be at least 1 and at most the window's sample count".to_owned(),
            ));
        }
        // Reflect padding needs more samples than it mirrors.
        if self.n_fft / 2 >= self.n_samples() {
            return Err(bad("n_fft", "is longer than the window".to_owned()));
        }
        let values = self.n_mels.saturating_mul(self.n_frames());
        if self.n_frames() == 0 || values > MAX_FEATURE_VALUES {
            return Err(bad(
                "hop_length",
                format!("gives {values} feature values (allowed: 1 to {MAX_FEATURE_VALUES})"),
            ));
        }
        Ok(())
    }
}
