//! `embedding.cu`, `rope.cu`, `kv_cache.cu`, `glu.cu` and `logits.cu` against CPU
//! references; the RoPE kernel against the crate's own `ops::rope`/`ops::rope_angles`, so that
//! the GPU decoder and the CPU one agree.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

use kernels::gpu::ops::{
    rope_inv_freq, slot_mapping, Embed, Glu, GluActivation, KvWrite, LogitsSoftcap, RopeQk,
};
use kernels::gpu::{Arg, Gpu, GpuDType, GpuError, Launch};
use kernels::{ops, Activation};
use util::*;

checks!(
    embed,
    rope_qk,
    rope_qk_mrope,
    kv_write,
    glu,
    logits_softcap,
    launchers_refuse_bad_shapes
);

/// Every element within `tol · max(1, |want|)` of the reference (NaN fails).
fn assert_each_near(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: element {i} is {g}, want {w}"
        );
    }
}

fn embed(gpu: &Gpu) {
    let mut rng = Rng::new("embed");
    for t in TYPES {
        // (tokens, hidden, vocab, media rows): odd widths, a row split over several blocks.
        for &(n, hidden, vocab, n_media) in &[
            (1usize, 100usize, 37usize, 0usize),
            (7, 576, 300, 3),
            (5, 2048, 64, 2),
            (3, 64, 11, 0),
        ] {
            let table: Vec<f32> = rng
                .vec(vocab * hidden, 1.0)
                .into_iter()
                .map(|v| round(t, v))
                .collect();
            let tokens: Vec<i32> = (0..n).map(|_| rng.below(vocab) as i32).collect();
            let media = rng.vec(n_media.max(1) * hidden, 3.0);
            // Every media row used once, at random rows; the rest are text.
            let mut slots = vec![-1i32; n];
            for m in 0..n_media {
                loop {
                    let r = rng.below(n);
                    if slots[r] < 0 {
                        slots[r] = m as i32;
                        break;
                    }
                }
            }
            let tb = upload_as(gpu, t, &table);
            let tokb = gpu.upload(&tokens).unwrap();
            let sb = gpu.upload(&slots).unwrap();
            let mb = gpu.upload(&media).unwrap();
            // Gemma's √hidden on the text rows; media rows are taken as they are.
            let scale = (hidden as f32).sqrt();
            for (with_media, scale) in [(false, 1.0), (true, 1.0), (false, scale), (true, scale)] {
                let x = poisoned(gpu, GpuDType::F32, n * hidden);
                Embed {
                    dtype: t,
                    table: tb.ptr(),
                    tokens: tokb.ptr(),
                    media_slot: with_media.then(|| sb.ptr()),
                    media: with_media.then(|| mb.ptr()),
                    x: x.ptr(),
                    n_tokens: n,
                    hidden,
                    scale,
                }
                .launch(gpu)
                .unwrap();
                let want: Vec<f32> = (0..n)
                    .flat_map(|r| match (with_media, slots[r]) {
                        (true, m) if m >= 0 => {
                            let m = m as usize;
                            media[m * hidden..(m + 1) * hidden].to_vec()
                        }
                        _ => {
                            let tok = tokens[r] as usize;
                            table[tok * hidden..(tok + 1) * hidden]
                                .iter()
                                .map(|v| v * scale)
                                .collect()
                        }
                    })
                    .collect();
                // A copy, an exact conversion and one f32 product, as the CPU decoder does:
                // bit for bit.
                let got = x.read::<f32>().unwrap();
                assert_eq!(
                    got, want,
                    "{t}: {n} × {hidden}, media {with_media}, scale {scale}"
                );
            }
        }
    }
}

/// One RoPE configuration.
#[derive(Debug, Clone, Copy)]
struct RopeCase {
    n_tokens: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    rope_dim: usize,
    neox: bool,
    bias: bool,
    norms: bool,
    /// M-RoPE sections (three positions per token).
    mrope: Option<[usize; 2]>,
    base: f32,
    freq_scale: f32,
    factors: bool,
    /// RMSNorm epsilon of the head norms.
    eps: f32,
}

/// The CPU decoder's M-RoPE choice (engine's `MropeScratch::angles`): each axis's angles from
/// `ops::rope_angles`, then frequency `j` takes the axis whose section it falls in.
fn mrope_angles(
    c: &RopeCase,
    factors: Option<&[f32]>,
    sections: [usize; 3],
    pos: [i32; 3],
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let half = c.rope_dim / 2;
    let mut per_axis = vec![(vec![0f32; half], vec![0f32; half]); 3];
    for ((ac, asn), &p) in per_axis.iter_mut().zip(&pos) {
        ops::rope_angles(
            p.max(0) as usize,
            c.base,
            c.rope_dim,
            c.freq_scale,
            factors,
            ac,
            asn,
        );
    }
    let mut axis = 0;
    let mut left = sections[0];
    for j in 0..half {
        while left == 0 && axis < 2 {
            axis += 1;
            left = sections[axis];
        }
        left = left.saturating_sub(1);
        cos[j] = per_axis[axis].0[j];
        sin[j] = per_axis[axis].1[j];
    }
}

/// The CPU decoder's order (engine's `LlamaModel::run`): biases, per-head norms, then
/// `ops::rope` on the q and k heads with `ops::rope_angles`' angles.
#[allow(clippy::too_many_arguments)]
fn rope_reference(
    c: &RopeCase,
    qkv: &[f32],
    bias: Option<&[f32]>,
    norms: Option<(&[f32], &[f32])>,
    factors: Option<&[f32]>,
    positions: &[i32],
    eps: f32,
) -> Vec<f32> {
    let (hd, half) = (c.head_dim, c.rope_dim / 2);
    let width = (c.n_heads + 2 * c.n_kv_heads) * hd;
    let q_dim = c.n_heads * hd;
    let kv_dim = c.n_kv_heads * hd;
    let axes = if c.mrope.is_some() { 3 } else { 1 };
    let mut out = qkv.to_vec();
    let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
    for (t, row) in out.chunks_exact_mut(width).enumerate() {
        if let Some(b) = bias {
            ops::add_assign(row, b);
        }
        let (q, rest) = row.split_at_mut(q_dim);
        let k = &mut rest[..kv_dim];
        if let Some((qn, kn)) = norms {
            let mut tmp = vec![0f32; hd];
            for (x, w) in [(&mut *q, qn), (&mut *k, kn)] {
                for head in x.chunks_exact_mut(hd) {
                    ops::rmsnorm(head, w, eps, &mut tmp);
                    head.copy_from_slice(&tmp);
                }
            }
        }
        let p = &positions[t * axes..(t + 1) * axes];
        match c.mrope {
            Some([s0, s1]) => {
                let s2 = half - s0 - s1;
                mrope_angles(
                    c,
                    factors,
                    [s0, s1, s2],
                    [p[0], p[1], p[2]],
                    &mut cos,
                    &mut sin,
                )
            }
            None => ops::rope_angles(
                p[0] as usize,
                c.base,
                c.rope_dim,
                c.freq_scale,
                factors,
                &mut cos,
                &mut sin,
            ),
        }
        ops::rope(q, c.n_heads, hd, c.rope_dim, &cos, &sin, c.neox);
        ops::rope(k, c.n_kv_heads, hd, c.rope_dim, &cos, &sin, c.neox);
    }
    out
}

fn check_rope(gpu: &Gpu, rng: &mut Rng, c: &RopeCase, positions: &[i32]) {
    let eps = c.eps;
    let hd = c.head_dim;
    let width = (c.n_heads + 2 * c.n_kv_heads) * hd;
    let qkv = rng.vec(c.n_tokens * width, 2.0);
    let bias = c.bias.then(|| rng.vec(width, 0.5));
    let qn = rng.vec(hd, 1.5);
    let kn = rng.vec(hd, 1.5);
    let factors: Option<Vec<f32>> = c.factors.then(|| {
        (0..c.rope_dim / 2)
            .map(|_| 1.0 + 7.0 * rng.unit())
            .collect()
    });
    let inv = rope_inv_freq(c.base, c.rope_dim, factors.as_deref());

    let qkvb = gpu.upload(&qkv).unwrap();
    let bb = bias.as_ref().map(|b| gpu.upload(b).unwrap());
    let qnb = gpu.upload(&qn).unwrap();
    let knb = gpu.upload(&kn).unwrap();
    let ib = gpu.upload(&inv).unwrap();
    let pb = gpu.upload(positions).unwrap();
    RopeQk {
        qkv: qkvb.ptr(),
        bias: bb.as_ref().map(|b| b.ptr()),
        q_norm: c.norms.then(|| qnb.ptr()),
        k_norm: c.norms.then(|| knb.ptr()),
        inv_freq: ib.ptr(),
        positions: pb.ptr(),
        pos_axes: if c.mrope.is_some() { 3 } else { 1 },
        sections: c.mrope.unwrap_or([0, 0]),
        n_tokens: c.n_tokens,
        n_heads: c.n_heads,
        n_kv_heads: c.n_kv_heads,
        head_dim: hd,
        rope_dim: c.rope_dim,
        neox: c.neox,
        freq_scale: c.freq_scale,
        eps,
    }
    .launch(gpu)
    .unwrap();
    let want = rope_reference(
        c,
        &qkv,
        bias.as_deref(),
        c.norms.then_some((&qn[..], &kn[..])),
        factors.as_deref(),
        positions,
        eps,
    );
    let got = qkvb.read::<f32>().unwrap();
    let what = format!("{c:?}");
    assert_close(&what, GpuDType::F32, &got, &want);
    assert_each_near(&what, &got, &want, 2e-5);
    // v is only biased: exactly the CPU's sum, and untouched without a bias.
    let v0 = (c.n_heads + c.n_kv_heads) * hd;
    for t in 0..c.n_tokens {
        let r = t * width;
        assert_eq!(
            got[r + v0..r + width],
            want[r + v0..r + width],
            "{what}: v of token {t}"
        );
    }
}

fn rope_qk(gpu: &Gpu) {
    let mut rng = Rng::new("rope_qk");
    let base = RopeCase {
        n_tokens: 5,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 64,
        rope_dim: 64,
        neox: true,
        bias: false,
        norms: false,
        mrope: None,
        base: 10000.0,
        freq_scale: 1.0,
        factors: false,
        eps: 1e-6,
    };
    let cases = [
        base,
        RopeCase {
            neox: false,
            bias: true,
            ..base
        },
        // Qwen3-like: 128-wide heads with norms, more heads than warps.
        RopeCase {
            n_tokens: 3,
            n_heads: 16,
            n_kv_heads: 4,
            head_dim: 128,
            rope_dim: 128,
            norms: true,
            base: 1_000_000.0,
            ..base
        },
        RopeCase {
            n_tokens: 2,
            n_heads: 8,
            n_kv_heads: 8,
            head_dim: 128,
            rope_dim: 128,
            neox: false,
            bias: true,
            norms: true,
            // Large enough to matter next to mean(x²).
            eps: 0.5,
            ..base
        },
        // Partial rotation, 32-wide heads, with factors and linear scaling.
        RopeCase {
            n_tokens: 7,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 32,
            rope_dim: 16,
            neox: false,
            bias: true,
            norms: true,
            factors: true,
            // Not a power of two: the kernel takes the scale as the CPU does, exactly.
            freq_scale: 0.3,
            ..base
        },
        RopeCase {
            n_tokens: 4,
            n_heads: 6,
            n_kv_heads: 3,
            head_dim: 64,
            rope_dim: 32,
            neox: true,
            factors: true,
            base: 500000.0,
            ..base
        },
        // Nothing rotated: bias and norms only.
        RopeCase {
            n_tokens: 2,
            rope_dim: 0,
            bias: true,
            norms: true,
            ..base
        },
    ];
    for c in &cases {
        let positions: Vec<i32> = (0..c.n_tokens).map(|_| rng.below(30000) as i32).collect();
        check_rope(gpu, &mut rng, c, &positions);
    }
    // A decode-like batch: positions at the edge of the range and zero.
    let c = RopeCase {
        n_tokens: 3,
        ..cases[2]
    };
    check_rope(gpu, &mut rng, &c, &[0, 29999, 32767]);
}

fn rope_qk_mrope(gpu: &Gpu) {
    let mut rng = Rng::new("rope_qk_mrope");
    // Qwen2-VL: head 128, sections [16, 24, 24] of 64 frequencies, biases, NeoX layout.
    let vl = RopeCase {
        n_tokens: 9,
        n_heads: 12,
        n_kv_heads: 2,
        head_dim: 128,
        rope_dim: 128,
        neox: true,
        bias: true,
        norms: false,
        mrope: Some([16, 24]),
        base: 1_000_000.0,
        freq_scale: 1.0,
        factors: false,
        eps: 1e-6,
    };
    let cases = [
        vl,
        RopeCase {
            n_tokens: 5,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 64,
            rope_dim: 64,
            neox: false,
            norms: true,
            mrope: Some([8, 12]),
            ..vl
        },
        // An empty first section, a partial rotation.
        RopeCase {
            n_tokens: 4,
            n_heads: 2,
            n_kv_heads: 2,
            head_dim: 64,
            rope_dim: 48,
            mrope: Some([0, 10]),
            ..vl
        },
    ];
    for c in &cases {
        // Image tokens have three different positions; text tokens after a media item may sit
        // before the text position (a negative delta): negative ones count as zero.
        let positions: Vec<i32> = (0..c.n_tokens * 3)
            .map(|_| match rng.below(8) {
                0 => -(rng.below(50) as i32) - 1,
                _ => rng.below(30000) as i32,
            })
            .collect();
        check_rope(gpu, &mut rng, c, &positions);
    }
}

fn kv_write(gpu: &Gpu) {
    let mut rng = Rng::new("kv_write");
    let (block_size, num_blocks) = (16usize, 8usize);
    for t in TYPES {
        // (n_heads, n_kv_heads, head_dim): kv_dim 128 and an odd 100.
        for &(nh, nkv, hd) in &[(4usize, 2usize, 64usize), (8, 4, 25)] {
            let kv_dim = nkv * hd;
            let stride = (nh + 2 * nkv) * hd;
            let k_cache = poisoned(gpu, t, num_blocks * block_size * kv_dim);
            let v_cache = poisoned(gpu, t, num_blocks * block_size * kv_dim);
            let mut want_k: Vec<Option<Vec<f32>>> = vec![None; num_blocks * block_size];
            let mut want_v = want_k.clone();

            // Step 1: a prefill of 9 tokens from position 10 over blocks [5, 1] (crossing a
            // block edge), one of 4 from 0 in block [3], padding rows between them.
            // Step 2: one decode token each.
            let steps: [Vec<(&[u32], usize, usize)>; 2] = [
                vec![(&[5, 1], 10, 9), (&[3], 0, 4)],
                vec![(&[5, 1], 19, 1), (&[3], 4, 1)],
            ];
            for (step, seqs) in steps.iter().enumerate() {
                let mut slots = Vec::new();
                for &(table, start, n) in seqs {
                    slot_mapping(table, start, n, block_size, &mut slots);
                    slots.push(-1);
                }
                slots.insert(0, -1);
                let n = slots.len();
                let qkv = rng.vec(n * stride, 3.0);
                let qb = gpu.upload(&qkv).unwrap();
                let sb = gpu.upload(&slots).unwrap();
                KvWrite {
                    dtype: t,
                    qkv: qb.ptr(),
                    k_cache: k_cache.ptr(),
                    v_cache: v_cache.ptr(),
                    slots: sb.ptr(),
                    n_tokens: n,
                    qkv_stride: stride,
                    k_offset: nh * hd,
                    v_offset: (nh + nkv) * hd,
                    kv_dim,
                }
                .launch(gpu)
                .unwrap();
                for (r, &s) in slots.iter().enumerate() {
                    if s < 0 {
                        continue;
                    }
                    let row = &qkv[r * stride..(r + 1) * stride];
                    let conv = |off: usize| -> Vec<f32> {
                        row[off..off + kv_dim]
                            .iter()
                            .map(|&v| round(t, v))
                            .collect()
                    };
                    want_k[s as usize] = Some(conv(nh * hd));
                    want_v[s as usize] = Some(conv((nh + nkv) * hd));
                }

                for (name, cache, want) in [("k", &k_cache, &want_k), ("v", &v_cache, &want_v)] {
                    let got = read_as(gpu, t, cache, num_blocks * block_size * kv_dim);
                    let bytes = cache.read::<u8>().unwrap();
                    let slot_bytes = kv_dim * t.size();
                    for (s, w) in want.iter().enumerate() {
                        let what = format!("{t}, kv_dim {kv_dim}, step {step}, {name} slot {s}");
                        match w {
                            // Conversions round as the host does: bit for bit.
                            Some(w) => {
                                assert_eq!(&got[s * kv_dim..(s + 1) * kv_dim], &w[..], "{what}")
                            }
                            None => assert!(
                                bytes[s * slot_bytes..(s + 1) * slot_bytes]
                                    .iter()
                                    .all(|&b| b == 0xFF),
                                "{what}: written, but no row maps to it"
                            ),
                        }
                    }
                }
            }
        }
    }
}

/// `act(g)` in f64.
fn glu_reference(act: GluActivation, g: f64) -> f64 {
    match act {
        GluActivation::Silu => g / (1.0 + (-g).exp()),
        GluActivation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * g * (1.0 + (k * (g + 0.044715 * g * g * g)).tanh())
        }
    }
}

fn glu(gpu: &Gpu) {
    let mut rng = Rng::new("glu");
    for (t, activation) in TYPES
        .into_iter()
        .flat_map(|t| [(t, GluActivation::Silu), (t, GluActivation::GeluTanh)])
    {
        for &(n, ffn) in &[(1usize, 100usize), (5, 576), (3, 1000), (2, 4096)] {
            let mut gate_up = rng.vec(n * 2 * ffn, 8.0);
            // Saturated gates: the tails, including silu's exp(−g) overflowing.
            gate_up[0] = -100.0;
            gate_up[1] = 100.0;
            gate_up[2] = -88.5;
            let gb = gpu.upload(&gate_up).unwrap();
            let out = poisoned(gpu, t, n * ffn);
            Glu {
                dtype: t,
                gate_up: gb.ptr(),
                out: out.ptr(),
                n_tokens: n,
                ffn,
                activation,
            }
            .launch(gpu)
            .unwrap();
            let got = read_as(gpu, t, &out, n * ffn);
            // f64 reference, and the CPU decoder's own op.
            let mut exact = Vec::with_capacity(n * ffn);
            let mut cpu = Vec::with_capacity(n * ffn);
            for row in gate_up.chunks_exact(2 * ffn) {
                let (g, u) = row.split_at(ffn);
                exact.extend(g.iter().zip(u).map(|(&g, &u)| {
                    round(
                        t,
                        (glu_reference(activation, f64::from(g)) * f64::from(u)) as f32,
                    )
                }));
                let mut g = g.to_vec();
                match activation {
                    GluActivation::Silu => ops::silu_mul(&mut g, u),
                    GluActivation::GeluTanh => {
                        Activation::GeluTanh.apply(&mut g);
                        g.iter_mut().zip(u).for_each(|(g, u)| *g *= u);
                    }
                }
                cpu.extend(g.into_iter().map(|v| round(t, v)));
            }
            let what = format!("{activation:?} {n} × {ffn}");
            assert_close(&what, t, &got, &exact);
            assert_close(&format!("{what} vs ops::silu_mul"), t, &got, &cpu);
            assert_each_near(&what, &got, &exact, 2.0 * tolerance(t) as f32);
        }
    }
}

fn softcap_reference(x: &[f32], cap: f32) -> Vec<f32> {
    x.iter()
        .map(|&v| (f64::from(cap) * (f64::from(v) / f64::from(cap)).tanh()) as f32)
        .collect()
}

fn logits_softcap(gpu: &Gpu) {
    let mut rng = Rng::new("logits_softcap");
    for &(n, cap) in &[
        (1usize, 30.0f32),
        (1000, 30.0),
        (3 * 50_257, 50.0),
        (77, 0.5),
    ] {
        let mut x = rng.vec(n, 120.0);
        x[0] = 1e30;
        let b = gpu.upload(&x).unwrap();
        LogitsSoftcap {
            logits: b.ptr(),
            n,
            cap,
        }
        .launch(gpu)
        .unwrap();
        let got = b.read::<f32>().unwrap();
        let want = softcap_reference(&x, cap);
        assert_each_near(&format!("n {n}, cap {cap}"), &got, &want, 1e-6);
    }
    // The kernel covers n with a grid-stride loop, whatever the grid.
    let n = 5000usize;
    let x = rng.vec(n, 100.0);
    let b = gpu.upload(&x).unwrap();
    gpu.launch(
        "logits_softcap",
        Launch::new([3, 1, 1], 64),
        &[Arg::Ptr(b.ptr()), Arg::I64(n as i64), Arg::F32(20.0)],
    )
    .unwrap();
    assert_each_near(
        "grid-stride",
        &b.read::<f32>().unwrap(),
        &softcap_reference(&x, 20.0),
        1e-6,
    );
}

fn launchers_refuse_bad_shapes(gpu: &Gpu) {
    let buf = gpu.zeros(4096).unwrap();
    let p = buf.ptr();
    let invalid = |r: kernels::gpu::Result<()>, what: &str| match r {
        Err(GpuError::Invalid(_)) => {}
        other => panic!("{what}: expected Invalid, got {other:?}"),
    };
    let embed = Embed {
        dtype: GpuDType::F32,
        table: p,
        tokens: p,
        media_slot: Some(p),
        media: None,
        x: p,
        n_tokens: 1,
        hidden: 8,
        scale: 1.0,
    };
    invalid(embed.launch(gpu), "media_slot without media");
    let rope = RopeQk {
        qkv: p,
        bias: None,
        q_norm: None,
        k_norm: None,
        inv_freq: p,
        positions: p,
        pos_axes: 1,
        sections: [0, 0],
        n_tokens: 1,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 16,
        rope_dim: 16,
        neox: true,
        freq_scale: 1.0,
        eps: 1e-6,
    };
    invalid(
        RopeQk {
            rope_dim: 15,
            ..rope
        }
        .launch(gpu),
        "odd rope_dim",
    );
    invalid(
        RopeQk {
            rope_dim: 32,
            ..rope
        }
        .launch(gpu),
        "rope_dim over head_dim",
    );
    invalid(
        RopeQk {
            pos_axes: 2,
            ..rope
        }
        .launch(gpu),
        "two position axes",
    );
    invalid(
        RopeQk {
            n_tokens: 0,
            ..rope
        }
        .launch(gpu),
        "no tokens",
    );
    let kv = KvWrite {
        dtype: GpuDType::BF16,
        qkv: p,
        k_cache: p,
        v_cache: p,
        slots: p,
        n_tokens: 1,
        qkv_stride: 64,
        k_offset: 32,
        v_offset: 48,
        kv_dim: 16,
    };
    invalid(
        KvWrite { v_offset: 49, ..kv }.launch(gpu),
        "values past the row",
    );
    invalid(KvWrite { kv_dim: 0, ..kv }.launch(gpu), "empty kv_dim");
    invalid(
        Glu {
            dtype: GpuDType::F16,
            gate_up: p,
            out: p,
            n_tokens: 1,
            ffn: 0,
            activation: GluActivation::Silu,
        }
        .launch(gpu),
        "empty ffn",
    );
    for cap in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        invalid(
            LogitsSoftcap {
                logits: p,
                n: 4,
                cap,
            }
            .launch(gpu),
            "bad cap",
        );
    }
}
