//! `rmsnorm.cu` against a CPU reference: the residual add, the add of a normed delta (Gemma's
//! post-attention and post-MLP norms), and picked rows.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

use kernels::gpu::ops::AddRmsNorm;
use kernels::gpu::{Gpu, GpuDType};
use util::*;

checks!(add_rmsnorm);

fn reference(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| (v * v) as f64).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms as f32 + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * inv * g).collect()
}

fn add_rmsnorm(gpu: &Gpu) {
    let mut rng = Rng::new("add_rmsnorm");
    for t in TYPES {
        for &(rows, hidden) in &[(1usize, 64usize), (5, 576), (3, 2048), (2, 100)] {
            let eps = 1e-5;
            let x = rng.vec(rows * hidden, 2.0);
            let delta = rng.vec(rows * hidden, 1.0);
            let w = rng.vec(hidden, 1.5);
            let xb = gpu.upload(&x).unwrap();
            let db = gpu.upload(&delta).unwrap();
            let wb = gpu.upload(&w).unwrap();
            // With the residual add, over every row.
            let out = poisoned(gpu, t, rows * hidden);
            AddRmsNorm {
                dtype: t,
                x: xb.ptr(),
                delta: Some(db.ptr()),
                delta_norm: None,
                weight: wb.ptr(),
                out: out.ptr(),
                rows: None,
                n_rows: rows,
                hidden,
                eps,
            }
            .launch(gpu)
            .unwrap();
            let sum: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
            let got_x = gpu.read::<f32>(xb.ptr(), rows * hidden).unwrap();
            assert_close("residual stream", GpuDType::F32, &got_x, &sum);
            let want: Vec<f32> = sum
                .chunks(hidden)
                .flat_map(|r| reference(r, &w, eps))
                .map(|v| round(t, v))
                .collect();
            assert_close(
                "normed rows",
                t,
                &read_as(gpu, t, &out, rows * hidden),
                &want,
            );

            // Picked rows, without the add: row b of out is row rows[b] of x.
            let picks: Vec<i32> = (0..rows as i32).rev().collect();
            let pb = gpu.upload(&picks).unwrap();
            let out = poisoned(gpu, t, rows * hidden);
            AddRmsNorm {
                dtype: t,
                x: xb.ptr(),
                delta: None,
                delta_norm: None,
                weight: wb.ptr(),
                out: out.ptr(),
                rows: Some(pb.ptr()),
                n_rows: rows,
                hidden,
                eps,
            }
            .launch(gpu)
            .unwrap();
            let want: Vec<f32> = picks
                .iter()
                .flat_map(|&r| {
                    let r = r as usize;
                    reference(&sum[r * hidden..(r + 1) * hidden], &w, eps)
                })
                .map(|v| round(t, v))
                .collect();
            assert_close(
                "picked rows",
                t,
                &read_as(gpu, t, &out, rows * hidden),
                &want,
            );

            // A normed delta added to picked rows (the final norm after a sandwich-normed
            // MLP): only those rows of x change.
            let dw = rng.vec(hidden, 1.5);
            let dwb = gpu.upload(&dw).unwrap();
            let picks: Vec<i32> = (0..rows as i32).step_by(2).collect();
            let pb = gpu.upload(&picks).unwrap();
            let out = poisoned(gpu, t, picks.len() * hidden);
            AddRmsNorm {
                dtype: t,
                x: xb.ptr(),
                delta: Some(db.ptr()),
                delta_norm: Some(dwb.ptr()),
                weight: wb.ptr(),
                out: out.ptr(),
                rows: Some(pb.ptr()),
                n_rows: picks.len(),
                hidden,
                eps,
            }
            .launch(gpu)
            .unwrap();
            let mut stream = sum.clone();
            for &r in &picks {
                let r = r as usize;
                let d = reference(&delta[r * hidden..(r + 1) * hidden], &dw, eps);
                for (x, d) in stream[r * hidden..(r + 1) * hidden].iter_mut().zip(d) {
                    *x += d;
                }
            }
            let got_x = gpu.read::<f32>(xb.ptr(), rows * hidden).unwrap();
            assert_close(
                "stream after a normed delta",
                GpuDType::F32,
                &got_x,
                &stream,
            );
            let want: Vec<f32> = picks
                .iter()
                .flat_map(|&r| {
                    let r = r as usize;
                    reference(&stream[r * hidden..(r + 1) * hidden], &w, eps)
                })
                .map(|v| round(t, v))
                .collect();
            assert_close(
                "normed delta, picked rows",
                t,
                &read_as(gpu, t, &out, picks.len() * hidden),
                &want,
            );
            // Rows not picked are untouched, bit for bit.
            for r in (1..rows).step_by(2) {
                assert_eq!(
                    &got_x[r * hidden..(r + 1) * hidden],
                    &sum[r * hidden..(r + 1) * hidden],
                    "row {r}"
                );
            }
        }
    }
    // A delta norm needs a delta.
    let p = gpu.zeros(64).unwrap();
    assert!(AddRmsNorm {
        dtype: GpuDType::F32,
        x: p.ptr(),
        delta: None,
        delta_norm: Some(p.ptr()),
        weight: p.ptr(),
        out: p.ptr(),
        rows: None,
        n_rows: 1,
        hidden: 16,
        eps: 1e-6,
    }
    .launch(gpu)
    .is_err());
}
