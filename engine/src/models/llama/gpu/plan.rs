//! A step's host-side description for the GPU, built once per step and uploaded in one copy:
//! token ids, rotary positions, KV slots, attention work lists and block tables, and the rows
//! whose logits are wanted.
//!
//! Rows follow the batch's chunks in order, and every chunk, a single decode token or a
//! prompt's piece, is cut into the attention kernel's tiles: one kernel for every row, whose
//! result for a row does not depend on its tile, so a sequence's attention is the same in any
//! step (see `ops::attention`). Logits come back per chunk.

use kernels::gpu::ops::{prefill_tiles, slot_mapping, PrefillChunk};

use crate::model::SeqChunk;

/// Offsets (in i32 elements) of each section of [`StepPlan::ints`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Sections {
    pub tokens: usize,
    /// Per row: the media row it takes its input from, or -1 (only when `has_media`).
    pub media_slot: usize,
    /// `rows × pos_axes` positions.
    pub positions: usize,
    pub slots: usize,
    pub tiles: usize,
    /// `n_chunks × max_blocks` block ids.
    pub tables: usize,
    pub logit_rows: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct StepPlan {
    pub ints: Vec<i32>,
    pub at: Sections,
    pub n_rows: usize,
    pub n_tiles: usize,
    pub max_blocks: usize,
    /// The chunks whose logits are wanted, in batch order; logit row `j` belongs to
    /// `logit_chunks[j]`.
    pub logit_chunks: Vec<usize>,
    /// Media rows' inputs, `n × hidden`, in the order of their slots.
    pub media: Vec<f32>,
    pub has_media: bool,
}

impl StepPlan {
    /// `pos_axes` is 3 for models with M-RoPE (Qwen2-VL), else 1.
    pub fn build(batch: &[SeqChunk<'_>], block_size: usize, pos_axes: usize) -> StepPlan {
        let mut first_row = Vec::with_capacity(batch.len());
        let mut row = 0;
        for chunk in batch {
            first_row.push(row);
            row += chunk.tokens.len();
        }
        let n_rows = row;
        let has_media = batch.iter().any(|c| c.media.is_some());
        let max_blocks = batch
            .iter()
            .map(|c| (c.start_pos + c.tokens.len()).div_ceil(block_size))
            .max()
            .unwrap_or(0)
            .max(1);

        let mut plan = StepPlan {
            n_rows,
            max_blocks,
            has_media,
            ..Default::default()
        };
        let ints = &mut plan.ints;

        plan.at.tokens = ints.len();
        for chunk in batch {
            ints.extend(chunk.tokens.iter().map(|&t| t as i32));
        }

        plan.at.media_slot = ints.len();
        if has_media {
            for chunk in batch {
                let mut slots = vec![-1i32; chunk.tokens.len()];
                if let Some(m) = &chunk.media {
                    let width = m.embeds.len() / m.rows.len().max(1);
                    for (j, &r) in m.rows.iter().enumerate() {
                        slots[r as usize] = (plan.media.len() / width.max(1)) as i32;
                        plan.media
                            .extend_from_slice(&m.embeds[j * width..(j + 1) * width]);
                    }
                }
                ints.extend(slots);
            }
        }

        plan.at.positions = ints.len();
        for chunk in batch {
            for i in 0..chunk.tokens.len() {
                let p = (chunk.start_pos + i) as i64;
                if pos_axes == 1 {
                    ints.push(p as i32);
                    continue;
                }
                let three = match &chunk.media {
                    Some(m) => match m.positions {
                        Some(ps) => ps[i].map(i64::from),
                        None => [p + m.position_delta; 3],
                    },
                    None => [p; 3],
                };
                ints.extend(three.iter().map(|&v| v.max(0) as i32));
            }
        }

        plan.at.slots = ints.len();
        let mut slots = Vec::with_capacity(n_rows);
        for chunk in batch {
            slot_mapping(
                chunk.block_table,
                chunk.start_pos,
                chunk.tokens.len(),
                block_size,
                &mut slots,
            );
        }
        ints.extend(slots);

        plan.at.tiles = ints.len();
        let chunks: Vec<PrefillChunk> = batch
            .iter()
            .enumerate()
            .map(|(c, chunk)| PrefillChunk {
                first_row: first_row[c],
                n_rows: chunk.tokens.len(),
                seq: c,
                start_pos: chunk.start_pos,
            })
            .collect();
        let before = ints.len();
        prefill_tiles(&chunks, ints);
        plan.n_tiles = (ints.len() - before) / 4;

        plan.at.tables = ints.len();
        for chunk in batch {
            let needed = (chunk.start_pos + chunk.tokens.len()).div_ceil(block_size);
            ints.extend(chunk.block_table[..needed].iter().map(|&b| b as i32));
            ints.extend(std::iter::repeat_n(0, max_blocks - needed));
        }

        plan.at.logit_rows = ints.len();
        for (c, chunk) in batch.iter().enumerate() {
            if chunk.want_logits {
                ints.push((first_row[c] + chunk.tokens.len() - 1) as i32);
                plan.logit_chunks.push(c);
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ChunkMedia;

    fn chunk<'a>(tokens: &'a [u32], start: usize, table: &'a [u32], want: bool) -> SeqChunk<'a> {
        SeqChunk {
            lora: None,
            tokens,
            start_pos: start,
            block_table: table,
            want_logits: want,
            media: None,
        }
    }

    #[test]
    fn rows_follow_the_batch_and_every_chunk_is_tiled() {
        let (t0, t1, t2) = ([5u32, 6, 7], [9u32], [11u32, 12]);
        let (b0, b1, b2) = ([3u32, 8], [4u32, 0, 2], [1u32]);
        // Chunk 0 is a prefill at 0, chunk 1 a decode at position 33, chunk 2 a prefill that
        // continues at position 2 without logits.
        let batch = [
            chunk(&t0, 0, &b0, true),
            chunk(&t1, 33, &b1, true),
            chunk(&t2, 2, &b2, false),
        ];
        let p = StepPlan::build(&batch, 16, 1);
        assert_eq!((p.n_rows, p.max_blocks), (6, 3));
        let sec = |a: usize, n: usize| &p.ints[a..a + n];
        assert_eq!(sec(p.at.tokens, 6), &[5, 6, 7, 9, 11, 12]);
        assert_eq!(sec(p.at.positions, 6), &[0, 1, 2, 33, 2, 3]);
        // Position 33 of chunk 1: block 2 of its table (id 2), slot 1.
        assert_eq!(sec(p.at.slots, 6), &[48, 49, 50, 33, 18, 19]);
        // One tile per chunk (first row, rows, table row, context of its first row): the
        // decode row is a tile of its own.
        assert_eq!(p.n_tiles, 3);
        assert_eq!(sec(p.at.tiles, 12), &[0, 3, 0, 1, 3, 1, 1, 34, 4, 2, 2, 3]);
        assert_eq!(
            p.at.media_slot, p.at.positions,
            "no media section without media"
        );
        // Tables padded to the longest need: chunk 0 needs 1 block, chunk 1 three, chunk 2 one.
        assert_eq!(sec(p.at.tables, 9), &[3, 0, 0, 4, 0, 2, 1, 0, 0]);
        // Logits of chunk 0 (its last row is 2) and chunk 1 (row 3), in batch order.
        assert_eq!(sec(p.at.logit_rows, 2), &[2, 3]);
        assert_eq!(p.logit_chunks, vec![0, 1]);
        assert_eq!(p.at.logit_rows + 2, p.ints.len());
    }

    #[test]
    fn media_rows_and_mrope_positions() {
        let t = [1u32, 2, 3];
        let table = [0u32];
        let embeds = [0.5f32; 8];
        let positions = [[0u32, 0, 0], [1, 1, 2], [3, 3, 3]];
        let media = ChunkMedia {
            rows: &[1, 2],
            embeds: &embeds,
            positions: Some(&positions),
            position_delta: 0,
        };
        let mut c = chunk(&t, 0, &table, true);
        c.media = Some(media);
        let p = StepPlan::build(&[c], 16, 3);
        assert!(p.has_media);
        assert_eq!(&p.ints[p.at.media_slot..p.at.media_slot + 3], &[-1, 0, 1]);
        assert_eq!(p.media.len(), 8);
        assert_eq!(
            &p.ints[p.at.positions..p.at.positions + 9],
            &[0, 0, 0, 1, 1, 2, 3, 3, 3]
        );
    }
}
