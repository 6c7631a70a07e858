//! `attention_decode.cu` and `attention_prefill.cu` against an f64 reference over the cache
//! values as stored (rounded to the cache's type); sliding windows and soft-capped scores are
//! checked in `gpu_attention_window.rs`.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

#[path = "gpu/paged_cache.rs"]
mod paged_cache;

use kernels::gpu::ops::{prefill_tiles, PagedAttention, PrefillChunk, PREFILL_TILE};
use kernels::gpu::{Gpu, GpuBuffer, GpuDType, GpuError};
use paged_cache::*;
use util::*;

checks!(
    decode_ragged_contexts,
    decode_head_sizes_and_groups,
    prefill_varlen_chunks,
    prefill_agrees_with_decode,
    decode_long_context_every_type,
    odd_strides_and_head_sizes,
    launch_rejects_bad_shapes
);

/// Decode over `(seq, ctx)` rows; checks every output row and head against the reference.
fn run_decode(gpu: &Gpu, rng: &mut Rng, t: GpuDType, s: &Shape, lens: &[usize]) {
    let cache = Cache::new(gpu, rng, t, lens, s.n_kv, s.hd, s.block_size);
    // One query per sequence at its last position, plus an early position of sequence 0.
    let mut rows: Vec<(usize, usize)> = lens.iter().enumerate().map(|(i, &l)| (i, l)).collect();
    rows.push((0, 1.max(lens[0] / 2)));
    let (q, q_stride) = queries(rng, rows.len(), s);
    let out_stride = s.n_heads * s.hd + 8;
    let qb = gpu.upload(&q).unwrap();
    let seqs: Vec<i32> = rows.iter().map(|r| r.0 as i32).collect();
    let ctxs: Vec<i32> = rows.iter().map(|r| r.1 as i32).collect();
    let (sb, cb) = (gpu.upload(&seqs).unwrap(), gpu.upload(&ctxs).unwrap());
    let out = poisoned(gpu, t, rows.len() * out_stride);
    let scale = 1.0 / (s.hd as f32).sqrt();
    cache
        .attention(t, s, &qb, q_stride, &out, out_stride, scale)
        .decode(gpu, sb.ptr(), cb.ptr(), rows.len())
        .unwrap();
    let got = read_as(gpu, t, &out, rows.len() * out_stride);
    let group = s.n_heads / s.n_kv;
    let (mut want_all, mut got_all) = (Vec::new(), Vec::new());
    for (r, &(seq, ctx)) in rows.iter().enumerate() {
        for h in 0..s.n_heads {
            let qh = &q[r * q_stride + h * s.hd..][..s.hd];
            let want = cache.reference(qh, seq, ctx, h / group, scale);
            want_all.extend(want.iter().map(|&x| round(t, x)));
            got_all.extend_from_slice(&got[r * out_stride + h * s.hd..][..s.hd]);
        }
        // The padding between rows stays unwritten.
        let pad = &got[r * out_stride + s.n_heads * s.hd..(r + 1) * out_stride];
        assert!(pad.iter().all(|x| x.is_nan()), "row {r}: padding written");
    }
    assert_close(
        &format!(
            "decode hd {} heads {}/{} block {}",
            s.hd, s.n_heads, s.n_kv, s.block_size
        ),
        t,
        &got_all,
        &want_all,
    );
}

fn decode_ragged_contexts(gpu: &Gpu) {
    let mut rng = Rng::new("decode_ragged_contexts");
    for t in TYPES {
        for block_size in [1, 7, 16, 32] {
            let s = Shape {
                n_heads: 4,
                n_kv: 2,
                hd: 64,
                block_size,
            };
            let lens = [
                1,
                block_size.saturating_sub(1).max(1),
                block_size,
                block_size + 1,
                300,
            ];
            run_decode(gpu, &mut rng, t, &s, &lens);
        }
    }
    // A long context for the online softmax, one head group.
    let s = Shape {
        n_heads: 2,
        n_kv: 1,
        hd: 32,
        block_size: 16,
    };
    run_decode(gpu, &mut rng, GpuDType::F32, &s, &[2100]);
}

fn decode_head_sizes_and_groups(gpu: &Gpu) {
    let mut rng = Rng::new("decode_head_sizes_and_groups");
    for (n_heads, n_kv) in [(8, 8), (8, 2), (8, 1)] {
        for hd in [16, 32, 64, 80, 128, 256] {
            let s = Shape {
                n_heads,
                n_kv,
                hd,
                block_size: 16,
            };
            let t = TYPES[(n_heads / n_kv + hd) % 3];
            run_decode(gpu, &mut rng, t, &s, &[37, 5]);
        }
    }
}

/// Prefill chunks as the engine cuts them: `(seq, start_pos, n_rows)`, laid out one after the
/// other in the activation rows starting at `first`.
fn run_prefill(
    gpu: &Gpu,
    rng: &mut Rng,
    t: GpuDType,
    s: &Shape,
    lens: &[usize],
    chunks: &[(usize, usize, usize)],
    first: usize,
) {
    let cache = Cache::new(gpu, rng, t, lens, s.n_kv, s.hd, s.block_size);
    let rows = first + chunks.iter().map(|c| c.2).sum::<usize>();
    let (q, q_stride) = queries(rng, rows, s);
    let out_stride = s.n_heads * s.hd;
    let qb = gpu.upload(&q).unwrap();
    let mut descr = Vec::new();
    let mut row = first;
    for &(seq, start, n) in chunks {
        descr.push(PrefillChunk {
            first_row: row,
            n_rows: n,
            seq,
            start_pos: start,
        });
        row += n;
    }
    let mut tiles = Vec::new();
    prefill_tiles(&descr, &mut tiles);
    let tb = gpu.upload(&tiles).unwrap();
    let out = poisoned(gpu, t, rows * out_stride);
    let scale = 1.0 / (s.hd as f32).sqrt();
    cache
        .attention(t, s, &qb, q_stride, &out, out_stride, scale)
        .prefill(gpu, tb.ptr(), tiles.len() / 4)
        .unwrap();
    let got = read_as(gpu, t, &out, rows * out_stride);
    // Rows before `first` belong to no chunk (decode rows in a step): untouched.
    assert!(got[..first * out_stride].iter().all(|x| x.is_nan()));
    let group = s.n_heads / s.n_kv;
    let (mut want_all, mut got_all) = (Vec::new(), Vec::new());
    for d in &descr {
        for i in 0..d.n_rows {
            let r = d.first_row + i;
            for h in 0..s.n_heads {
                let qh = &q[r * q_stride + h * s.hd..][..s.hd];
                let want = cache.reference(qh, d.seq, d.start_pos + i + 1, h / group, scale);
                want_all.extend(want.iter().map(|&x| round(t, x)));
                got_all.extend_from_slice(&got[r * out_stride + h * s.hd..][..s.hd]);
            }
        }
    }
    assert_close(
        &format!(
            "prefill hd {} heads {}/{} block {}",
            s.hd, s.n_heads, s.n_kv, s.block_size
        ),
        t,
        &got_all,
        &want_all,
    );
}

fn prefill_varlen_chunks(gpu: &Gpu) {
    let mut rng = Rng::new("prefill_varlen_chunks");
    for t in TYPES {
        for (hd, block_size) in [(64, 16), (128, 7), (256, 32), (16, 1)] {
            let s = Shape {
                n_heads: 4,
                n_kv: 2,
                hd,
                block_size,
            };
            // Sequence 0 from the start (two full tiles and a partial one), sequence 1 a chunk
            // starting mid-way (its earlier positions only in the cache), sequence 2 a short
            // one; the first two rows stand for decode rows of the same step.
            let lens = [40, 90, 3];
            let chunks = [(0, 0, 40), (1, 61, 29), (2, 0, 3)];
            run_prefill(gpu, &mut rng, t, &s, &lens, &chunks, 2);
        }
    }
    let s = Shape {
        n_heads: 8,
        n_kv: 1,
        hd: 32,
        block_size: 16,
    };
    run_prefill(
        gpu,
        &mut rng,
        GpuDType::F32,
        &s,
        &[PREFILL_TILE + 1],
        &[(0, 0, PREFILL_TILE + 1)],
        0,
    );
}

/// The same queries through both kernels give the same rows: a chunk of 40 rows from position
/// 13 (earlier positions only in the cache), for each cache type.
fn prefill_agrees_with_decode(gpu: &Gpu) {
    let mut rng = Rng::new("prefill_agrees_with_decode");
    for (t, hd) in TYPES.into_iter().zip([64, 128, 96]) {
        let s = Shape {
            n_heads: 4,
            n_kv: 1,
            hd,
            block_size: 16,
        };
        let (start, len) = (13, 40);
        let cache = Cache::new(gpu, &mut rng, t, &[start + len], s.n_kv, s.hd, s.block_size);
        let (q, q_stride) = queries(&mut rng, len, &s);
        let qb = gpu.upload(&q).unwrap();
        let out_stride = s.n_heads * s.hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut tiles = Vec::new();
        prefill_tiles(
            &[PrefillChunk {
                first_row: 0,
                n_rows: len,
                seq: 0,
                start_pos: start,
            }],
            &mut tiles,
        );
        let tb = gpu.upload(&tiles).unwrap();
        let a = poisoned(gpu, t, len * out_stride);
        cache
            .attention(t, &s, &qb, q_stride, &a, out_stride, scale)
            .prefill(gpu, tb.ptr(), tiles.len() / 4)
            .unwrap();
        let seqs = vec![0i32; len];
        let ctxs: Vec<i32> = (start as i32 + 1..=(start + len) as i32).collect();
        let (sb, cb) = (gpu.upload(&seqs).unwrap(), gpu.upload(&ctxs).unwrap());
        let b = poisoned(gpu, t, len * out_stride);
        cache
            .attention(t, &s, &qb, q_stride, &b, out_stride, scale)
            .decode(gpu, sb.ptr(), cb.ptr(), len)
            .unwrap();
        let (a, b) = (
            read_as(gpu, t, &a, len * out_stride),
            read_as(gpu, t, &b, len * out_stride),
        );
        assert_close(&format!("prefill vs decode, hd {hd}"), t, &a, &b);
    }
}

/// One query over a context past 2000 positions, with sharp scores (the running maximum moves
/// many times and the weights span many orders of magnitude), for each cache type.
fn decode_long_context_every_type(gpu: &Gpu) {
    let mut rng = Rng::new("decode_long_context_every_type");
    for t in TYPES {
        let s = Shape {
            n_heads: 4,
            n_kv: 1,
            hd: 128,
            block_size: 16,
        };
        let ctx = 2000 + rng.below(300);
        // Later positions belong to the sequence but not to the query: NaN-free yet unread.
        let cache = Cache::new(gpu, &mut rng, t, &[ctx + 40], s.n_kv, s.hd, s.block_size);
        let q_stride = s.n_heads * s.hd + 3;
        let out_stride = s.n_heads * s.hd + 5;
        let q = rng.vec(q_stride, 12.0);
        let qb = gpu.upload(&q).unwrap();
        let sb = gpu.upload(&[0i32]).unwrap();
        let cb = gpu.upload(&[ctx as i32]).unwrap();
        let out = poisoned(gpu, t, out_stride);
        let scale = 1.0 / (s.hd as f32).sqrt();
        cache
            .attention(t, &s, &qb, q_stride, &out, out_stride, scale)
            .decode(gpu, sb.ptr(), cb.ptr(), 1)
            .unwrap();
        let got = read_as(gpu, t, &out, out_stride);
        check_rows(
            &format!("decode over {ctx} positions"),
            t,
            &s,
            &cache,
            &q,
            q_stride,
            &got,
            out_stride,
            &[(0, 0, ctx)],
            scale,
            Extras::default(),
        );
    }
}

/// Strides that are no multiple of anything, head sizes whose lanes are partly idle (80, 8;
/// 168 also takes two lanes per key in the prefill scores), grouped heads 1/4/8 and block sizes
/// 1/7/32, through decode and prefill; the prefill tiles include a one-row tile and chunks
/// starting mid-sequence, in a reversed tile order.
fn odd_strides_and_head_sizes(gpu: &Gpu) {
    let mut rng = Rng::new("odd_strides_and_head_sizes");
    let shapes = [(8, 8, 80, 7), (8, 2, 8, 1), (8, 1, 48, 32), (4, 1, 168, 7)];
    for (i, &(n_heads, n_kv, hd, block_size)) in shapes.iter().enumerate() {
        for t in TYPES {
            let s = Shape {
                n_heads,
                n_kv,
                hd,
                block_size,
            };
            let lens = [45, 20];
            let cache = Cache::new(gpu, &mut rng, t, &lens, s.n_kv, s.hd, s.block_size);
            let q_stride = n_heads * hd + 2 * n_kv * hd + 1 + i;
            let out_stride = n_heads * hd + 3;
            let scale = 0.7 / (hd as f32).sqrt();

            // Decode: rows 1..4 of a 5-row batch (rows 0 and 4 are not queries).
            let n_rows = 5;
            let q = rng.vec(n_rows * q_stride, 1.5);
            let qb = gpu.upload(&q).unwrap();
            let dec = [(1, 1, 1), (2, 0, 45), (3, 1, block_size.min(20))];
            let seqs: Vec<i32> = dec.iter().map(|d| d.1 as i32).collect();
            let ctxs: Vec<i32> = dec.iter().map(|d| d.2 as i32).collect();
            let (sb, cb) = (gpu.upload(&seqs).unwrap(), gpu.upload(&ctxs).unwrap());
            let out = poisoned(gpu, t, n_rows * out_stride);
            // Decode writes row t of the launch at out row t: offset both by one row.
            let at = |b: &GpuBuffer, stride: usize, elem: usize| b.at(stride * elem);
            let attn = PagedAttention {
                q: at(&qb, q_stride, 4),
                out: at(&out, out_stride, t.size()),
                ..cache.attention(t, &s, &qb, q_stride, &out, out_stride, scale)
            };
            attn.decode(gpu, sb.ptr(), cb.ptr(), dec.len()).unwrap();
            let got = read_as(gpu, t, &out, n_rows * out_stride);
            check_rows(
                &format!("decode hd {hd} heads {n_heads}/{n_kv} block {block_size}"),
                t,
                &s,
                &cache,
                &q,
                q_stride,
                &got,
                out_stride,
                &dec,
                scale,
                Extras::default(),
            );

            // Prefill: all of sequence 1 from position 3 (positions 0..3 only in the cache),
            // then sequence 0 in chunks of 1 and 17 rows from position 27; row 0 is skipped.
            let chunks = [
                PrefillChunk {
                    first_row: 1,
                    n_rows: 17,
                    seq: 1,
                    start_pos: 3,
                },
                PrefillChunk {
                    first_row: 18,
                    n_rows: 1,
                    seq: 0,
                    start_pos: 27,
                },
                PrefillChunk {
                    first_row: 19,
                    n_rows: 17,
                    seq: 0,
                    start_pos: 28,
                },
            ];
            let n_rows = 36;
            let q = rng.vec(n_rows * q_stride, 1.5);
            let qb = gpu.upload(&q).unwrap();
            let mut tiles = Vec::new();
            prefill_tiles(&chunks, &mut tiles);
            // Tiles are independent: their order in the list does not matter.
            let mut order: Vec<[i32; 4]> =
                tiles.chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect();
            order.reverse();
            let tiles: Vec<i32> = order.concat();
            let tb = gpu.upload(&tiles).unwrap();
            let out = poisoned(gpu, t, n_rows * out_stride);
            cache
                .attention(t, &s, &qb, q_stride, &out, out_stride, scale)
                .prefill(gpu, tb.ptr(), tiles.len() / 4)
                .unwrap();
            let got = read_as(gpu, t, &out, n_rows * out_stride);
            let rows: Vec<(usize, usize, usize)> = chunks
                .iter()
                .flat_map(|c| (0..c.n_rows).map(|i| (c.first_row + i, c.seq, c.start_pos + i + 1)))
                .collect();
            check_rows(
                &format!("prefill hd {hd} heads {n_heads}/{n_kv} block {block_size}"),
                t,
                &s,
                &cache,
                &q,
                q_stride,
                &got,
                out_stride,
                &rows,
                scale,
                Extras::default(),
            );
        }
    }
}

/// Shapes the kernels cannot take are refused before any launch.
fn launch_rejects_bad_shapes(gpu: &Gpu) {
    let mut rng = Rng::new("launch_rejects_bad_shapes");
    let t = GpuDType::BF16;
    let s = Shape {
        n_heads: 4,
        n_kv: 2,
        hd: 64,
        block_size: 16,
    };
    let cache = Cache::new(gpu, &mut rng, t, &[20], s.n_kv, s.hd, s.block_size);
    let qb = gpu.upload(&rng.vec(4 * 256, 1.0)).unwrap();
    let out = poisoned(gpu, t, 4 * 256);
    let ints = gpu.upload(&[0i32, 1, 0, 1]).unwrap();
    let good = cache.attention(t, &s, &qb, 256, &out, 256, 0.125);
    let bad = [
        PagedAttention { n_heads: 3, ..good },
        PagedAttention {
            head_dim: 60,
            ..good
        },
        PagedAttention {
            head_dim: 264,
            ..good
        },
        PagedAttention {
            block_size: 0,
            ..good
        },
        PagedAttention {
            q_stride: 255,
            ..good
        },
        PagedAttention {
            out_stride: 100,
            ..good
        },
        PagedAttention {
            max_blocks: 0,
            ..good
        },
        PagedAttention {
            k_cache: good.k_cache.offset(2),
            ..good
        },
        PagedAttention {
            window: Some(0),
            ..good
        },
        PagedAttention {
            softcap: Some(0.0),
            ..good
        },
        PagedAttention {
            softcap: Some(f32::NAN),
            ..good
        },
        PagedAttention {
            softcap: Some(f32::INFINITY),
            ..good
        },
    ];
    for (i, a) in bad.iter().enumerate() {
        assert!(
            matches!(
                a.decode(gpu, ints.ptr(), ints.ptr(), 1),
                Err(GpuError::Invalid(_))
            ),
            "decode case {i}"
        );
        assert!(
            matches!(a.prefill(gpu, ints.ptr(), 1), Err(GpuError::Invalid(_))),
            "prefill case {i}"
        );
    }
    for (n, heads) in [(0, 4), (1, 0), (1, 70000)] {
        let a = PagedAttention {
            n_heads: heads,
            n_kv_heads: heads.max(1),
            ..good
        };
        assert!(matches!(
            a.decode(gpu, ints.ptr(), ints.ptr(), n),
            Err(GpuError::Invalid(_))
        ));
        assert!(matches!(
            a.prefill(gpu, ints.ptr(), n),
            Err(GpuError::Invalid(_))
        ));
    }
    // The good shape launches (one decode row of sequence 0 at context 1).
    good.decode(gpu, ints.ptr(), ints.at(4), 1).unwrap();
}
