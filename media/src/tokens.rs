//! How many placeholder tokens an item takes in the prompt: the one count, used by the engine
//! when it expands placeholders and by anything that must predict the prompt's length.

/// Tokens for a patch grid `[t, h, w]` whose `merge x merge` neighbourhoods become one token
/// (Qwen2-VL's `spatial_merge_size`).
pub fn vision(grid_thw: [usize; 3], merge: usize) -> usize {
    let merge = merge.max(1);
    grid_thw[0] * grid_thw[1] * grid_thw[2] / (merge * merge)
}

/// Tokens for an audio clip of `valid_frames` mel frames in Qwen2-Audio: the encoder's
/// stride-2 convolution gives `(frames - 1) / 2 + 1` positions, then 2x pooling
/// `(n - 2) / 2 + 1`, with the reference's floor division (0 for a clip of 2 frames or less).
pub fn audio(valid_frames: usize) -> usize {
    let after_conv = valid_frames.saturating_sub(1) / 2 + 1;
    if after_conv < 2 {
        0
    } else {
        (after_conv - 2) / 2 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audio_counts_match_the_reference() {
        // Whisper's 30 s window (3000 frames) gives 750 tokens.
        for (frames, tokens) in [(3000, 750), (200, 50), (124, 31), (3, 1), (2, 0), (0, 0)] {
            assert_eq!(audio(frames), tokens, "{frames} frames");
        }
    }

    #[test]
    fn vision_merges_neighbourhoods() {
        assert_eq!(vision([1, 4, 6], 2), 6);
        assert_eq!(vision([2, 4, 4], 2), 8);
        assert_eq!(vision([1, 3, 3], 1), 9);
    }
}
