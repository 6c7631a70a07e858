//! The kernels' f16 conversions, exactly as the host's `half` crate converts: every one of the
//! 65,536 f16 values widened to f32 (through `embed_f16`), and f32 values of every exponent,
//! the rounding ties, the overflow edge and NaN narrowed to f16 (through `kv_write_f16`). The
//! conversions are plain integer code, so the emulator runs what the device runs.
#![cfg(feature = "emu")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "gpu/util.rs"]
mod util;

use kernels::gpu::{Arg, DevicePtr, Gpu, Launch};
use util::*;

checks!(f16_widens_exactly, f16_narrows_to_nearest_even);

fn f16_widens_exactly(gpu: &Gpu) {
    let table: Vec<u16> = (0..=u16::MAX).collect();
    let n = table.len();
    let tb = gpu.upload(&table).unwrap();
    let tokens = gpu.upload(&[0i32]).unwrap();
    let out = gpu.upload(&vec![f32::NAN; n]).unwrap();
    gpu.launch(
        "embed_f16",
        Launch::new([1, 64, 1], 256),
        &[
            (&tb).into(),
            (&tokens).into(),
            Arg::Ptr(DevicePtr::NULL),
            Arg::Ptr(DevicePtr::NULL),
            (&out).into(),
            Arg::I32(n as i32),
            // No scale: the row is copied as it widens.
            Arg::F32(1.0),
        ],
    )
    .unwrap();
    let got: Vec<f32> = out.read().unwrap();
    for (bits, g) in table.iter().zip(&got) {
        let want = half::f16::from_bits(*bits).to_f32();
        assert_eq!(
            g.to_bits(),
            want.to_bits(),
            "f16 {bits:#06x}: got {g:e}, want {want:e}"
        );
    }
}

fn f16_narrows_to_nearest_even(gpu: &Gpu) {
    let mut rng = Rng::new("f16_narrows_to_nearest_even");
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.99,
        65520.0,
        65536.0,
        1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        2f32.powi(-24),
        2f32.powi(-25),
        2f32.powi(-25) * 1.5,
        2f32.powi(-14),
        2f32.powi(-14) * (1.0 - 2f32.powi(-11)),
    ];
    // Every f16 value, and the exact midpoints to its neighbour (the ties).
    for bits in 0..0x7c00u16 {
        let v = half::f16::from_bits(bits).to_f32();
        let next = half::f16::from_bits(bits + 1).to_f32();
        values.extend([v, -v, (v + next) / 2.0, -(v + next) / 2.0]);
    }
    // Random bit patterns over every exponent.
    values.extend((0..20_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
    let n = values.len();
    // Keys from `values`, values from the same list reversed: both halves are checked.
    let mut qkv = values.clone();
    qkv.extend(values.iter().rev());
    let qb = gpu.upload(&qkv).unwrap();
    let k = gpu.upload(&vec![0xffffu16; n]).unwrap();
    let v = gpu.upload(&vec![0xffffu16; n]).unwrap();
    let slots = gpu.upload(&[0i32]).unwrap();
    gpu.launch(
        "kv_write_f16",
        Launch::new([1, 64, 1], 256),
        &[
            (&qb).into(),
            (&k).into(),
            (&v).into(),
            (&slots).into(),
            Arg::I32(2 * n as i32),
            Arg::I32(0),
            Arg::I32(n as i32),
            Arg::I32(n as i32),
        ],
    )
    .unwrap();
    let got_k: Vec<u16> = k.read().unwrap();
    let got_v: Vec<u16> = v.read().unwrap();
    let reversed: Vec<f32> = values.iter().rev().copied().collect();
    for (got, input) in [(&got_k, &values), (&got_v, &reversed)] {
        for (g, x) in got.iter().zip(input.iter()) {
            let want = half::f16::from_f32(*x);
            if x.is_nan() {
                assert!(half::f16::from_bits(*g).is_nan(), "{x}: got {g:#06x}");
            } else {
                assert_eq!(*g, want.to_bits(), "{x:e} ({:#010x})", x.to_bits());
            }
        }
    }
}
