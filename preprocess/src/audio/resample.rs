//! Sample-rate conversion with rubato's FFT resampler.
//!
//! A fixed-ratio, FFT-based resampler (overlap-add with a windowed-sinc
//! anti-aliasing filter, Blackman-Harris window) whose filter spans one FFT
//! block of about [`TARGET_BLOCK_IN`] input samples; for 44.1 kHz -> 16 kHz
//! that is 882 input taps (20 ms). rubato sets the cutoff so the transition
//! band ends at the new Nyquist frequency; with this block length it starts
//! near 95 % of it, close to soxr's HQ setting, which is what vLLM's
//! librosa path and the Python anchor use (longer blocks pass more of the top
//! band and move the highest mel bin away from theirs). The resampler's
//! start-up delay is trimmed, so output sample `i` lines up with input time
//! `i / to_rate`.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Resampler, WindowFunction};

use super::{check_rate, AudioError};

/// Input frames per FFT block the resampler aims for (rounded up to a whole
/// number of the rate pair's minimum blocks). 882 = 2 x 441, the minimum
/// block for 44.1 kHz -> 16 kHz.
const TARGET_BLOCK_IN: usize = 882;

/// The FFT block's input length: whole minimum blocks of the rate pair
/// (`from / gcd`), about [`TARGET_BLOCK_IN`], and even. rubato centres its
/// filter on the block's middle and trims `block_out / 2` output frames of
/// delay; with an odd block the middle falls half an input sample off that,
/// so the output would lag by half an input sample.
fn block_in(from: u32, to: u32) -> usize {
    let (mut a, mut b) = (from, to);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let min_in = (from / a.max(1)) as usize;
    let mut chunks = TARGET_BLOCK_IN.div_ceil(min_in).max(1);
    if (chunks * min_in) % 2 == 1 {
        chunks += 1;
    }
    chunks * min_in
}

/// Samples [`resample`] gives for `len` input samples: `round(len * to_rate / from_rate)`
/// (`None` when that does not fit a `usize`).
pub fn resampled_len(len: usize, from_rate: u32, to_rate: u32) -> Option<usize> {
    if from_rate == to_rate || from_rate == 0 {
        return Some(len);
    }
    // In integers: (2 * len * to + from) / (2 * from).
    let (from, to) = (u128::from(from_rate), u128::from(to_rate));
    usize::try_from((2 * len as u128 * to + from) / (2 * from)).ok()
}

/// Resamples mono `samples` from `from_rate` to `to_rate`.
///
/// The output has `round(len * to_rate / from_rate)` samples; equal rates
/// return the input unchanged. Rates outside
/// [`MIN_SAMPLE_RATE`](super::MIN_SAMPLE_RATE)..=[`MAX_SAMPLE_RATE`](super::MAX_SAMPLE_RATE)
/// are refused.
pub fn resample(samples: &[f32], from_rate: u32, to_rate: u32) -> Result<Vec<f32>, AudioError> {
    let from = check_rate(u64::from(from_rate))?;
    let to = check_rate(u64::from(to_rate))?;
    if from == to {
        return Ok(samples.to_vec());
    }
    let len = samples.len();
    let out_len = resampled_len(len, from, to)
        .ok_or_else(|| AudioError::Resample("the output would be too long".to_owned()))?;
    if len == 0 || out_len == 0 {
        return Ok(Vec::new());
    }
    let fail = |e: &dyn std::fmt::Display| AudioError::Resample(e.to_string());

    let mut resampler = Fft::<f32>::new_custom(
        from as usize,
        to as usize,
        block_in(from, to),
        1,
        1,
        WindowFunction::BlackmanHarris2,
        FixedSync::Input,
    )
    .map_err(|e| fail(&e))?;
    let needed = resampler.process_all_needed_output_len(len);
    let mut out = vec![0.0f32; needed];
    let input = InterleavedSlice::new(samples, 1, len).map_err(|e| fail(&e))?;
    let produced = {
        let mut output = InterleavedSlice::new_mut(&mut out, 1, needed).map_err(|e| fail(&e))?;
        let (_consumed, produced) = resampler
            .process_all_into_buffer(&input, &mut output, len, None)
            .map_err(|e| fail(&e))?;
        produced
    };
    // rubato gives ceil(len * ratio) samples; keep the rounded count (the
    // buffer is longer than either, so resizing only ever truncates or keeps
    // a computed sample).
    out.truncate(produced.max(out_len));
    out.resize(out_len, 0.0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_rounded() {
        let x = vec![0.0f32; 44_100];
        assert_eq!(resample(&x, 44_100, 16_000).unwrap().len(), 16_000);
        // 1001 * 16000 / 44100 = 363.17
        assert_eq!(resample(&x[..1001], 44_100, 16_000).unwrap().len(), 363);
        // 1000 * 16000 / 22050 = 725.6
        assert_eq!(resample(&x[..1000], 22_050, 16_000).unwrap().len(), 726);
        assert_eq!(resample(&x[..10], 8_000, 16_000).unwrap().len(), 20);
        assert!(resample(&[], 44_100, 16_000).unwrap().is_empty());
    }

    #[test]
    fn equal_rates_copy_and_bad_rates_fail() {
        let x = vec![0.5f32, -0.25, 0.125];
        assert_eq!(resample(&x, 16_000, 16_000).unwrap(), x);
        assert_eq!(
            resample(&x, 0, 16_000),
            Err(AudioError::BadSampleRate { rate: 0 })
        );
        assert!(resample(&x, 16_000, 10_000_000).is_err());
    }

    #[test]
    fn blocks_are_even_whole_minimum_blocks() {
        // 44100 / 16000: gcd 100, minimum block 441 input frames.
        assert_eq!(block_in(44_100, 16_000), 882);
        assert_eq!(block_in(48_000, 16_000), 882);
        assert_eq!(block_in(22_050, 16_000), 882);
        assert_eq!(block_in(16_000, 8_000), 882);
        // gcd 1: the minimum block is the whole input rate, doubled to be even.
        assert_eq!(block_in(44_101, 16_000), 88_202);
        for (from, to) in [(8_000, 16_000), (11_025, 16_000), (96_000, 16_000)] {
            assert_eq!(block_in(from, to) % 2, 0);
        }
    }

    #[test]
    fn dc_level_is_kept() {
        let x = vec![0.5f32; 8_000];
        let y = resample(&x, 8_000, 16_000).unwrap();
        assert_eq!(y.len(), 16_000);
        // Away from the edges (the filter sees zeros beyond them) the level holds.
        for v in &y[2_000..14_000] {
            assert!((v - 0.5).abs() < 1e-3, "{v}");
        }
    }
}
