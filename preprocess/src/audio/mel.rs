//! The Whisper log-mel spectrogram, as openai-whisper's
//! `log_mel_spectrogram` and Hugging Face's `WhisperFeatureExtractor` (numpy
//! backend) compute it:
//!
//! 1. pad with zeros or trim to `chunk_length_s * sample_rate` samples;
//! 2. centred STFT: reflect-pad `n_fft / 2` on each side, periodic Hann
//!    window of `n_fft`, hop `hop_length`; power `|X|^2`; the last frame is
//!    dropped (30 s at 16 kHz gives 3000 frames);
//! 3. Slaney-scale mel filterbank with Slaney area normalisation, 0 Hz to
//!    `sample_rate / 2` (librosa's `filters.mel(sr, n_fft, n_mels)`);
//! 4. `log10(max(x, 1e-10))`, then `max(x, global_max - 8)`, then `(x + 4) / 4`.
//!
//! The window, the (sparse) filterbank and the FFT plan are built once per
//! configuration and cached.

use std::sync::{Arc, Mutex, OnceLock};

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use super::AudioError;

/// Distinct configurations whose plans are kept.
const PLAN_CACHE_SIZE: usize = 8;

pub use media::spec::WhisperFeatureConfig;
pub use media::AudioFeatures;

/// The feature extractor's computations over its settings (the model's spec).
pub trait LogMel {
    /// The mel filterbank, `[n_mels, n_fft / 2 + 1]` row-major, as
    /// `librosa.filters.mel(sr, n_fft, n_mels, htk=False, norm="slaney")`.
    fn mel_filters(&self) -> Result<Vec<f32>, AudioError>;
    /// The log-mel features of mono `samples` at the settings' sample rate.
    fn log_mel(&self, samples: &[f32]) -> Result<AudioFeatures, AudioError>;
}

impl LogMel for WhisperFeatureConfig {
    fn mel_filters(&self) -> Result<Vec<f32>, AudioError> {
        self.check()?;
        Ok(slaney_filterbank(self.sample_rate, self.n_fft, self.n_mels))
    }

    fn log_mel(&self, samples: &[f32]) -> Result<AudioFeatures, AudioError> {
        let plan = plan_for(self)?;
        Ok(plan.run(samples))
    }
}

/// Slaney's mel scale: linear below 1 kHz, logarithmic above.
fn hz_to_mel(hz: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let logstep = 6.4f64.ln() / 27.0;
    if hz >= MIN_LOG_HZ {
        min_log_mel + (hz / MIN_LOG_HZ).ln() / logstep
    } else {
        hz / F_SP
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    let min_log_mel = MIN_LOG_HZ / F_SP;
    let logstep = 6.4f64.ln() / 27.0;
    if mel >= min_log_mel {
        MIN_LOG_HZ * (logstep * (mel - min_log_mel)).exp()
    } else {
        F_SP * mel
    }
}

/// numpy's `linspace(start, stop, num)` (endpoint included, last value exact).
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    if num == 1 {
        return vec![start];
    }
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| start + i as f64 * step).collect();
    if let Some(last) = v.last_mut() {
        *last = stop;
    }
    v
}

/// Dense `[n_mels, n_fft / 2 + 1]` Slaney filterbank (computed in f64).
fn slaney_filterbank(sample_rate: u32, n_fft: usize, n_mels: usize) -> Vec<f32> {
    let n_bins = n_fft / 2 + 1;
    let sr = f64::from(sample_rate);
    // librosa's fft_frequencies: k * sr / n_fft.
    let fft_hz: Vec<f64> = (0..n_bins).map(|k| k as f64 * sr / n_fft as f64).collect();
    let mel_hz: Vec<f64> = linspace(hz_to_mel(0.0), hz_to_mel(sr / 2.0), n_mels + 2)
        .into_iter()
        .map(mel_to_hz)
        .collect();
    let mut w = vec![0.0f32; n_mels * n_bins];
    for (m, row) in w.chunks_exact_mut(n_bins).enumerate() {
        let (Some(&lo), Some(&mid), Some(&hi)) =
            (mel_hz.get(m), mel_hz.get(m + 1), mel_hz.get(m + 2))
        else {
            continue;
        };
        let (d_lo, d_hi) = (mid - lo, hi - mid);
        let enorm = 2.0 / (hi - lo);
        for (slot, &f) in row.iter_mut().zip(&fft_hz) {
            let lower = -(lo - f) / d_lo;
            let upper = (hi - f) / d_hi;
            let v = lower.min(upper).max(0.0);
            *slot = (v * enorm) as f32;
        }
    }
    w
}

/// One mel filter's non-zero span.
#[derive(Debug)]
struct MelRow {
    start: usize,
    weights: Vec<f32>,
}

/// Everything a configuration needs, built once.
struct MelPlan {
    cfg: WhisperFeatureConfig,
    window: Vec<f32>,
    rows: Vec<MelRow>,
    fft: Arc<dyn RealToComplex<f32>>,
}

fn plan_for(cfg: &WhisperFeatureConfig) -> Result<Arc<MelPlan>, AudioError> {
    static PLANS: OnceLock<Mutex<Vec<Arc<MelPlan>>>> = OnceLock::new();
    let plans = PLANS.get_or_init(|| Mutex::new(Vec::new()));
    {
        let cached = plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plan) = cached.iter().find(|p| &p.cfg == cfg) {
            return Ok(plan.clone());
        }
    }
    cfg.check()?;
    let plan = Arc::new(MelPlan::new(cfg));
    let mut cached = plans.lock().unwrap_or_else(|e| e.into_inner());
    if cached.len() >= PLAN_CACHE_SIZE {
        cached.remove(0);
    }
    cached.push(plan.clone());
    Ok(plan)
}

impl MelPlan {
    fn new(cfg: &WhisperFeatureConfig) -> MelPlan {
        let n_fft = cfg.n_fft;
        let n_bins = n_fft / 2 + 1;
        // Periodic Hann: 0.5 - 0.5 cos(2 pi k / n).
        let window = (0..n_fft)
            .map(|k| {
                (0.5 - 0.5 * (2.0 * std::f64::consts::PI * k as f64 / n_fft as f64).cos()) as f32
            })
            .collect();
        let dense = slaney_filterbank(cfg.sample_rate, n_fft, cfg.n_mels);
        let rows = dense
            .chunks_exact(n_bins)
            .map(|row| {
                let first = row.iter().position(|v| *v != 0.0);
                let last = row.iter().rposition(|v| *v != 0.0);
                match (first, last) {
                    (Some(a), Some(b)) => MelRow {
                        start: a,
                        weights: row.get(a..=b).unwrap_or_default().to_vec(),
                    },
                    _ => MelRow {
                        start: 0,
                        weights: Vec::new(),
                    },
                }
            })
            .collect();
        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(n_fft);
        MelPlan {
            cfg: cfg.clone(),
            window,
            rows,
            fft,
        }
    }

    fn run(&self, samples: &[f32]) -> AudioFeatures {
        let cfg = &self.cfg;
        let (n_fft, hop) = (cfg.n_fft, cfg.hop_length);
        let n_samples = cfg.n_samples();
        let n_frames = cfg.n_frames();
        let n_mels = cfg.n_mels;
        let pad = n_fft / 2;
        let used = samples.len().min(n_samples);

        // The padded signal: reflect | samples, zeros to n_samples | reflect.
        let mut xp = vec![0.0f32; n_samples + 2 * pad];
        for (d, s) in xp[pad..].iter_mut().zip(&samples[..used]) {
            *d = if s.is_finite() { *s } else { 0.0 };
        }
        for j in 1..=pad {
            xp[pad - j] = xp[pad + j];
            xp[pad + n_samples - 1 + j] = xp[pad + n_samples - 1 - j];
        }

        let mut data = vec![0.0f32; n_mels * n_frames];
        let mut input = self.fft.make_input_vec();
        let mut spectrum = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0.0f32; spectrum.len()];
        for t in 0..n_frames {
            let frame = &xp[t * hop..t * hop + n_fft];
            if frame.iter().all(|v| *v == 0.0) {
                continue; // silence: every mel value is 0 (the log floor)
            }
            for ((d, s), w) in input.iter_mut().zip(frame).zip(&self.window) {
                *d = s * w;
            }
            if self
                .fft
                .process_with_scratch(&mut input, &mut spectrum, &mut scratch)
                .is_err()
            {
                continue; // buffer sizes come from the plan itself; cannot happen
            }
            for (p, c) in power.iter_mut().zip(&spectrum) {
                *p = norm_sqr(*c);
            }
            for (m, row) in self.rows.iter().enumerate() {
                let span = power.get(row.start..row.start + row.weights.len());
                let acc: f32 = span
                    .unwrap_or_default()
                    .iter()
                    .zip(&row.weights)
                    .map(|(p, w)| p * w)
                    .sum();
                data[m * n_frames + t] = acc;
            }
        }

        let mut max = f32::NEG_INFINITY;
        for v in data.iter_mut() {
            *v = v.max(1e-10).log10();
            max = max.max(*v);
        }
        let floor = max - 8.0;
        for v in data.iter_mut() {
            *v = (v.max(floor) + 4.0) / 4.0;
        }
        AudioFeatures {
            data,
            n_mels,
            n_frames,
            valid_frames: cfg.valid_frames(used),
        }
    }
}

fn norm_sqr(c: Complex<f32>) -> f32 {
    c.re * c.re + c.im * c.im
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whisper_shapes() {
        let cfg = WhisperFeatureConfig::whisper(80);
        assert_eq!(cfg.n_samples(), 480_000);
        assert_eq!(cfg.n_frames(), 3000);
        let f = cfg.log_mel(&vec![0.1f32; 16_000]).unwrap();
        assert_eq!((f.n_mels, f.n_frames, f.valid_frames), (80, 3000, 100));
        assert_eq!(f.data.len(), 240_000);
        assert_eq!(f.weight_bytes(), 960_000);
        let f = WhisperFeatureConfig::whisper(128)
            .log_mel(&[0.0; 161])
            .unwrap();
        assert_eq!((f.n_mels, f.n_frames, f.valid_frames), (128, 3000, 2));
    }

    #[test]
    fn silence_is_the_floor_everywhere() {
        let f = WhisperFeatureConfig::whisper(80).log_mel(&[]).unwrap();
        // log10(1e-10) = -10 is also the maximum, so every value is (-10 + 4) / 4.
        assert!(f.data.iter().all(|v| (*v - -1.5).abs() < 1e-6));
        assert_eq!(f.valid_frames, 0);
    }

    #[test]
    fn input_longer_than_the_window_is_trimmed() {
        let cfg = WhisperFeatureConfig::whisper(80);
        let x: Vec<f32> = (0..500_000)
            .map(|i| ((i as f32) * 0.07).sin() * 0.3)
            .collect();
        let long = cfg.log_mel(&x).unwrap();
        let trimmed = cfg.log_mel(&x[..480_000]).unwrap();
        assert_eq!(long, trimmed);
        assert_eq!(long.valid_frames, 3000);
    }

    #[test]
    fn slaney_scale_round_trips() {
        for hz in [0.0, 100.0, 999.0, 1000.0, 4000.0, 8000.0] {
            assert!((mel_to_hz(hz_to_mel(hz)) - hz).abs() < 1e-9);
        }
        assert!((hz_to_mel(1000.0) - 15.0).abs() < 1e-12);
        assert_eq!(linspace(0.0, 1.0, 5), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    }
}
