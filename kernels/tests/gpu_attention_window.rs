//! `attention_decode.cu` and `attention_prefill.cu` with a sliding window and soft-capped
//! scores (Mistral, Gemma 2/3) against the f64 reference: the positions before each query's
//! window hold NaN in the cache, so a kernel that reads one fails, not only one that weighs it.
//!
//! And `attention_prefill.cu` gives a query row the same bits whatever tile it is in: the last
//! 40 positions of a sequence as one-row tiles (decode rows, as the GPU decoder runs them), as
//! one prefill chunk, and as chunks cut elsewhere and placed at other activation rows (every
//! tile boundary moves), with and without a window and a cap, for head sizes that stage 32, 16
//! and 8 keys per pass; positions before the first window NaN here too.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

#[path = "gpu/paged_cache.rs"]
mod paged_cache;

use kernels::gpu::ops::{prefill_tiles, PagedAttention, PrefillChunk, PREFILL_TILE};
use kernels::gpu::{Gpu, GpuDType};
use paged_cache::*;
use util::*;

checks!(
    decode_sliding_window_and_softcap,
    prefill_sliding_window_and_softcap,
    a_row_is_the_same_in_every_tiling
);

/// The caps the checks use: none, one that flattens most scores, one that barely bites.
const CAPS: [Option<f32>; 3] = [None, Some(1.0), Some(30.0)];

/// Queries for `n_rows` activation rows, sharp enough that a cap of 1 bites, through `launch`
/// with `window` and each cap in turn; `rows` (`(row, seq, ctx)`) are checked and every other
/// output element must stay unwritten.
#[allow(clippy::too_many_arguments)]
fn each_cap(
    gpu: &Gpu,
    rng: &mut Rng,
    what: &str,
    t: GpuDType,
    s: &Shape,
    cache: &Cache,
    n_rows: usize,
    rows: &[(usize, usize, usize)],
    window: usize,
    launch: impl Fn(&PagedAttention),
) {
    let (q, q_stride) = queries(rng, n_rows, s);
    let q: Vec<f32> = q.into_iter().map(|x| 3.0 * x).collect();
    let qb = gpu.upload(&q).unwrap();
    let out_stride = s.n_heads * s.hd;
    let scale = 1.0 / (s.hd as f32).sqrt();
    for softcap in CAPS {
        let extras = Extras {
            window: Some(window),
            softcap,
        };
        let out = poisoned(gpu, t, n_rows * out_stride);
        launch(&PagedAttention {
            window: extras.window,
            softcap,
            ..cache.attention(t, s, &qb, q_stride, &out, out_stride, scale)
        });
        let got = read_as(gpu, t, &out, n_rows * out_stride);
        check_rows(
            &format!("{what} window {window} cap {softcap:?} hd {}", s.hd),
            t,
            s,
            cache,
            &q,
            q_stride,
            &got,
            out_stride,
            rows,
            scale,
            extras,
        );
    }
}

/// Decode with windows shorter and longer than the contexts: one query per sequence at its
/// last position, the positions before its window NaN.
fn decode_sliding_window_and_softcap(gpu: &Gpu) {
    let mut rng = Rng::new("decode_sliding_window_and_softcap");
    for (i, window) in [1, 5, 12, 33, 4096].into_iter().enumerate() {
        for t in TYPES {
            let s = Shape {
                n_heads: 4,
                n_kv: 2,
                hd: [64, 16, 128, 80, 32][i],
                block_size: [7, 16, 1, 32, 5][i],
            };
            let lens = [40, 13, 5, 300];
            let mut cache = Cache::new(gpu, &mut rng, t, &lens, s.n_kv, s.hd, s.block_size);
            for (seq, &len) in lens.iter().enumerate() {
                cache.poison_before(gpu, t, seq, len.saturating_sub(window));
            }
            let seqs: Vec<i32> = (0..lens.len() as i32).collect();
            let ctxs: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
            let (sb, cb) = (gpu.upload(&seqs).unwrap(), gpu.upload(&ctxs).unwrap());
            let rows: Vec<(usize, usize, usize)> =
                lens.iter().enumerate().map(|(r, &l)| (r, r, l)).collect();
            each_cap(
                gpu,
                &mut rng,
                "decode",
                t,
                &s,
                &cache,
                lens.len(),
                &rows,
                window,
                |a| a.decode(gpu, sb.ptr(), cb.ptr(), lens.len()).unwrap(),
            );
        }
    }
}

/// Prefill with windows shorter than a tile, of a tile, and longer: a chunk that starts past
/// its first window (the positions before it NaN) beside one from position 0, so the window
/// starts inside the tiles and moves with each query.
fn prefill_sliding_window_and_softcap(gpu: &Gpu) {
    let mut rng = Rng::new("prefill_sliding_window_and_softcap");
    for (i, window) in [1, 12, PREFILL_TILE, 40].into_iter().enumerate() {
        for t in TYPES {
            let s = Shape {
                n_heads: 4,
                n_kv: 1,
                hd: [64, 16, 256, 48][i],
                block_size: [16, 5, 7, 1][i],
            };
            let start = 29;
            let lens = [start + 45, 20];
            let chunks = [
                PrefillChunk {
                    first_row: 1,
                    n_rows: 45,
                    seq: 0,
                    start_pos: start,
                },
                PrefillChunk {
                    first_row: 46,
                    n_rows: 20,
                    seq: 1,
                    start_pos: 0,
                },
            ];
            let mut cache = Cache::new(gpu, &mut rng, t, &lens, s.n_kv, s.hd, s.block_size);
            cache.poison_before(gpu, t, 0, (start + 1).saturating_sub(window));
            let mut tiles = Vec::new();
            prefill_tiles(&chunks, &mut tiles);
            let tb = gpu.upload(&tiles).unwrap();
            let rows: Vec<(usize, usize, usize)> = chunks
                .iter()
                .flat_map(|c| (0..c.n_rows).map(|i| (c.first_row + i, c.seq, c.start_pos + i + 1)))
                .collect();
            each_cap(
                gpu,
                &mut rng,
                "prefill",
                t,
                &s,
                &cache,
                66,
                &rows,
                window,
                |a| a.prefill(gpu, tb.ptr(), tiles.len() / 4).unwrap(),
            );
        }
    }
}

/// Positions of the sequence, and the first one computed.
const LEN: usize = 70;
const FROM: usize = 30;

fn a_row_is_the_same_in_every_tiling(gpu: &Gpu) {
    let mut rng = Rng::new("a_row_is_the_same_in_every_tiling");
    // Chunks as (first position, positions), and the activation row of position FROM.
    let one_row: Vec<(usize, usize)> = (FROM..LEN).map(|p| (p, 1)).collect();
    let tilings: [(&[(usize, usize)], usize); 4] = [
        (&[(FROM, LEN - FROM)], 0),
        (&one_row, 0),
        (&[(FROM, 7), (37, 33)], 3),
        (&[(FROM, 3), (33, 1), (34, 20), (54, 16)], 1),
    ];
    let cases = [
        (GpuDType::F32, 16, 5, None, None),
        (GpuDType::BF16, 64, 16, Some(12), None),
        (GpuDType::BF16, 128, 7, None, Some(30.0)),
        (GpuDType::F16, 256, 16, Some(40), Some(1.0)),
    ];
    for (t, hd, block_size, window, softcap) in cases {
        let s = Shape {
            n_heads: 4,
            n_kv: 2,
            hd,
            block_size,
        };
        let what = format!("{t} hd {hd} block {block_size} window {window:?} cap {softcap:?}");
        let mut cache = Cache::new(gpu, &mut rng, t, &[LEN], s.n_kv, hd, block_size);
        if let Some(w) = window {
            cache.poison_before(gpu, t, 0, (FROM + 1).saturating_sub(w));
        }
        // Queries of positions FROM..LEN, sharp enough that a cap of 1 bites.
        let (q, q_stride) = queries(&mut rng, LEN - FROM, &s);
        let q: Vec<f32> = q.into_iter().map(|x| 3.0 * x).collect();
        let out_stride = s.n_heads * s.hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut first: Option<Vec<u32>> = None;
        for (i, &(chunks, shift)) in tilings.iter().enumerate() {
            // Row `shift + p - FROM` holds position p; the rows before are never read.
            let rows = shift + LEN - FROM;
            let mut qs = vec![f32::NAN; shift * q_stride];
            qs.extend_from_slice(&q);
            let qb = gpu.upload(&qs).unwrap();
            let descr: Vec<PrefillChunk> = chunks
                .iter()
                .map(|&(start, n)| PrefillChunk {
                    first_row: shift + start - FROM,
                    n_rows: n,
                    seq: 0,
                    start_pos: start,
                })
                .collect();
            let mut tiles = Vec::new();
            prefill_tiles(&descr, &mut tiles);
            let tb = gpu.upload(&tiles).unwrap();
            let out = poisoned(gpu, t, rows * out_stride);
            let attn = cache.attention(t, &s, &qb, q_stride, &out, out_stride, scale);
            PagedAttention {
                window,
                softcap,
                ..attn
            }
            .prefill(gpu, tb.ptr(), tiles.len() / 4)
            .unwrap();
            let got = read_as(gpu, t, &out, rows * out_stride);
            let bits: Vec<u32> = got[shift * out_stride..]
                .iter()
                .map(|x| x.to_bits())
                .collect();
            match &first {
                None => {
                    let rows: Vec<(usize, usize, usize)> =
                        (FROM..LEN).map(|p| (p - FROM, 0, p + 1)).collect();
                    let extras = Extras { window, softcap };
                    check_rows(
                        &what, t, &s, &cache, &q, q_stride, &got, out_stride, &rows, scale, extras,
                    );
                    first = Some(bits);
                }
                Some(want) => {
                    let differ = bits.iter().zip(want).filter(|(a, b)| a != b).count();
                    assert_eq!(differ, 0, "{what}: tiling {i} differs in {differ} values");
                }
            }
        }
    }
}
