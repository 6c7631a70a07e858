//! Qwen2-VL: a vision tower ([`vision`]) whose merged patch embeddings replace the image and
//! video placeholder tokens of the prompt, and a Qwen2 decoder whose rotary embedding turns
//! with three positions per token (M-RoPE: temporal, row, column).

pub mod vision;

use crate::error::{EngineError, Result};

/// What a prompt token stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Text,
    Image,
    Video,
}

/// M-RoPE positions `(t, h, w)` of each prompt token, and the offset later tokens add to their
/// index (`max position + 1 - prompt length`), as the reference's `get_rope_index` computes
/// them.
///
/// Each run of consecutive image (video) tokens is one image (video) and takes the next grid
/// of `image_grids` (`video_grids`), `(t, h, w)` in patches; it must hold
/// `t*h*w / merge^2` tokens. Text tokens count on from the position after the previous run;
/// a vision run starting at `p` gives its token at `(i, j, k)` of the merged grid the
/// positions `(p + i, p + j, p + k)`, and the text after it starts at
/// `p + max(t, h / merge, w / merge)`, one past the run's largest position. That is vLLM's
/// and transformers 4's rule; transformers 5.24 leaves `t` out, which differs only for a
/// video of more temporal patches than merged rows or columns.
pub fn mrope_positions(
    kinds: &[TokenKind],
    image_grids: &[[usize; 3]],
    video_grids: &[[usize; 3]],
    merge: usize,
) -> Result<(Vec<[u32; 3]>, i64)> {
    let mut out = Vec::with_capacity(kinds.len());
    let (mut images, mut videos) = (image_grids.iter(), video_grids.iter());
    let mut pos = 0usize;
    let mut i = 0;
    while i < kinds.len() {
        let kind = kinds[i];
        let run = kinds[i..].iter().take_while(|k| **k == kind).count();
        match kind {
            TokenKind::Text => {
                out.extend((pos..pos + run).map(|p| [p as u32; 3]));
                pos += run;
            }
            TokenKind::Image | TokenKind::Video => {
                let (name, grid) = if kind == TokenKind::Image {
                    ("image", images.next())
                } else {
                    ("video", videos.next())
                };
                let &[t, h, w] = grid.ok_or_else(|| {
                    EngineError::invalid(
                        format!("the prompt has more {name} placeholders than {name}s"),
                        None,
                    )
                })?;
                let (gh, gw) = (h / merge.max(1), w / merge.max(1));
                if t * gh * gw != run {
                    return Err(EngineError::invalid(
                        format!(
                            "a run of {run} {name} placeholder tokens does not match its {t}x{h}x{w} grid ({} tokens)",
                            t * gh * gw
                        ),
                        None,
                    ));
                }
                for it in 0..t {
                    for ih in 0..gh {
                        for iw in 0..gw {
                            out.push([(pos + it) as u32, (pos + ih) as u32, (pos + iw) as u32]);
                        }
                    }
                }
                pos += t.max(gh).max(gw);
            }
        }
        i += run;
    }
    if images.next().is_some() || videos.next().is_some() {
        return Err(EngineError::invalid(
            "the prompt has fewer media placeholders than media items",
            None,
        ));
    }
    let max = out
        .iter()
        .flat_map(|p| p.iter())
        .copied()
        .max()
        .map_or(-1, i64::from);
    Ok((out, max + 1 - kinds.len() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenKind::*;

    #[test]
    fn text_only_counts_up_and_has_no_delta() {
        let (p, d) = mrope_positions(&[Text; 4], &[], &[], 2).unwrap();
        assert_eq!(p, [[0; 3], [1; 3], [2; 3], [3; 3]]);
        assert_eq!(d, 0);
    }

    #[test]
    fn an_image_takes_its_grid_and_text_resumes_after_the_longer_side() {
        // 2 text, an image of 1x4x6 patches (merged 2x3 = 6 tokens), 1 text.
        let mut kinds = vec![Text, Text];
        kinds.extend([Image; 6]);
        kinds.push(Text);
        let (p, d) = mrope_positions(&kinds, &[[1, 4, 6]], &[], 2).unwrap();
        assert_eq!(
            &p[2..8],
            &[
                [2, 2, 2],
                [2, 2, 3],
                [2, 2, 4],
                [2, 3, 2],
                [2, 3, 3],
                [2, 3, 4]
            ]
        );
        assert_eq!(p[8], [5; 3]); // 2 + max(1, 4 / 2, 6 / 2)
        assert_eq!(d, 6 - 9);
    }

    #[test]
    fn video_frames_advance_the_temporal_position() {
        let mut kinds = vec![Text];
        kinds.extend([Video; 8]); // 2 temporal groups of 2x2 merged
        let (p, _) = mrope_positions(&kinds, &[], &[[2, 4, 4]], 2).unwrap();
        assert_eq!(p[1], [1, 1, 1]);
        assert_eq!(p[5], [2, 1, 1]);
        assert_eq!(p[8], [2, 2, 2]);
    }

    #[test]
    fn a_long_video_moves_the_text_past_its_last_frame() {
        // 4 temporal patches of 1x1 merged tokens: the text continues at 1 + 4.
        let mut kinds = vec![Text];
        kinds.extend([Video; 4]);
        kinds.push(Text);
        let (p, d) = mrope_positions(&kinds, &[], &[[4, 2, 2]], 2).unwrap();
        assert_eq!(p[4], [4, 1, 1]);
        assert_eq!(p[5], [5; 3]);
        assert_eq!(d, 0);
    }

    #[test]
    fn mismatched_runs_are_refused() {
        assert!(mrope_positions(&[Text, Image, Image], &[[1, 4, 4]], &[], 2).is_err());
        assert!(mrope_positions(&[Text, Image], &[], &[], 2).is_err());
        assert!(mrope_positions(&[Text], &[[1, 2, 2]], &[], 2).is_err());
    }
}
