//! Typed launchers, one per kernel job: each struct names a kernel's inputs and outputs (device
//! pointers, shapes, scalars) and `launch` checks the shapes it can and issues the kernel. The
//! engine's GPU model and the kernel tests call these, never `Gpu::launch` with raw argument
//! lists, so a kernel's signature has one owner on the host side.

mod attention;
mod elementwise;
mod gemm;
mod norm;
mod sampling;

pub use attention::*;
pub use elementwise::*;
pub use gemm::{gemm_in_row_chunks, padded_rows, row_chunks, GEMM_ROWS};
pub use norm::AddRmsNorm;
pub use sampling::*;

use super::{DevicePtr, GpuError, Result};

/// `Some(ptr)` as a kernel argument, `None` as a null pointer.
pub(crate) fn opt(p: Option<DevicePtr>) -> super::Arg {
    super::Arg::Ptr(p.unwrap_or(DevicePtr::NULL))
}

/// A dimension as a kernel's `int`.
pub(crate) fn int(what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| GpuError::Invalid(format!("{what} = {v} does not fit an int")))
}

/// A grid dimension (`x` may be up to 2^31 - 1; `y` and `z` up to 65535).
pub(crate) fn grid_x(what: &str, v: usize) -> Result<u32> {
    if v == 0 {
        return Err(GpuError::Invalid(format!(
            "{what} is zero: nothing to launch"
        )));
    }
    u32::try_from(v)
        .ok()
        .filter(|&g| g < (1 << 31))
        .ok_or_else(|| GpuError::Invalid(format!("{what} = {v} is too many blocks")))
}

pub(crate) fn grid_yz(what: &str, v: usize) -> Result<u32> {
    if v == 0 || v > 65535 {
        return Err(GpuError::Invalid(format!(
            "{what} = {v} is outside a grid's 1..=65535"
        )));
    }
    Ok(v as u32)
}

#[cfg(test)]
mod tests {
    //! Each launcher at its widest (long rows, many heads, the most sampling threads) launches
    //! a block within its kernel's declared bound: `Gpu::launch` refuses one past it before
    //! the backend sees it, and this backend records what got through.
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use super::*;
    use crate::gpu::{
        sources, Arg, Backend, BackendKind, DeviceInfo, Gemm, Gpu, GpuDType, Launch, Step,
    };

    struct Recorder {
        info: DeviceInfo,
        next: Mutex<u64>,
        launches: Mutex<Vec<(String, u32)>>,
    }

    impl Backend for Recorder {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
            let mut next = self.next.lock().unwrap();
            let p = *next;
            *next += bytes as u64 + 256;
            Ok(DevicePtr(p))
        }
        unsafe fn free(&self, _: DevicePtr) {}
        fn upload(&self, _: DevicePtr, _: &[u8]) -> Result<()> {
            Ok(())
        }
        fn download(&self, _: DevicePtr, dst: &mut [u8]) -> Result<()> {
            dst.fill(0);
            Ok(())
        }
        fn copy(&self, _: DevicePtr, _: DevicePtr, _: usize) -> Result<()> {
            Ok(())
        }
        fn memset(&self, _: DevicePtr, _: u8, _: usize) -> Result<()> {
            Ok(())
        }
        fn launch(&self, kernel: &str, shape: Launch, _: &[Arg]) -> Result<()> {
            self.launches
                .lock()
                .unwrap()
                .push((kernel.to_string(), shape.block));
            Ok(())
        }
        fn gemm(&self, _: &Gemm) -> Result<()> {
            Ok(())
        }
        fn synchronize(&self) -> Result<()> {
            Ok(())
        }
        fn memory(&self) -> Result<(usize, usize)> {
            Ok((1 << 30, 1 << 30))
        }
        fn enter(&self, _: Option<Step>) {}
    }

    fn recorder() -> std::sync::Arc<Recorder> {
        std::sync::Arc::new(Recorder {
            info: DeviceInfo {
                kind: BackendKind::Emulated,
                ordinal: 0,
                name: "recorder".into(),
                compute_capability: (9, 0),
                total_memory: 1 << 30,
                driver_version: 0,
            },
            next: Mutex::new(1 << 20),
            launches: Mutex::new(Vec::new()),
        })
    }

    #[test]
    fn launchers_at_their_widest_stay_within_each_kernels_bound() {
        let rec = recorder();
        let gpu = Gpu::from_backend(rec.clone());
        let p = DevicePtr(1 << 20);
        let wide = 1 << 14;
        for dtype in [GpuDType::F32, GpuDType::BF16, GpuDType::F16] {
            Embed {
                dtype,
                table: p,
                tokens: p,
                media_slot: None,
                media: None,
                x: p,
                n_tokens: 3,
                hidden: wide,
                scale: 8.0,
            }
            .launch(&gpu)
            .unwrap();
            KvWrite {
                dtype,
                qkv: p,
                k_cache: p,
                v_cache: p,
                slots: p,
                n_tokens: 3,
                qkv_stride: 3 * wide,
                k_offset: wide,
                v_offset: 2 * wide,
                kv_dim: wide,
            }
            .launch(&gpu)
            .unwrap();
            Glu {
                dtype,
                gate_up: p,
                out: p,
                n_tokens: 3,
                ffn: wide,
                activation: GluActivation::GeluTanh,
            }
            .launch(&gpu)
            .unwrap();
            AddRmsNorm {
                dtype,
                x: p,
                delta: Some(p),
                delta_norm: Some(p),
                weight: p,
                out: p,
                rows: None,
                n_rows: 3,
                hidden: wide,
                eps: 1e-6,
            }
            .launch(&gpu)
            .unwrap();
            let attn = PagedAttention {
                dtype,
                out: p,
                q: p,
                k_cache: p,
                v_cache: p,
                block_tables: p,
                q_stride: 96 * 128,
                out_stride: 64 * 128,
                n_heads: 64,
                n_kv_heads: 16,
                head_dim: 128,
                block_size: 16,
                max_blocks: 8,
                scale: 1.0,
                window: Some(4096),
                softcap: Some(50.0),
            };
            attn.decode(&gpu, p, p, 5).unwrap();
            attn.prefill(&gpu, p, 2).unwrap();
        }
        RopeQk {
            qkv: p,
            bias: None,
            q_norm: None,
            k_norm: None,
            inv_freq: p,
            positions: p,
            pos_axes: 1,
            sections: [32, 0],
            n_tokens: 3,
            n_heads: 64,
            n_kv_heads: 16,
            head_dim: 128,
            rope_dim: 64,
            neox: true,
            freq_scale: 1.0,
            eps: 1e-6,
        }
        .launch(&gpu)
        .unwrap();
        LogitsSoftcap {
            logits: p,
            n: wide * 16,
            cap: 30.0,
        }
        .launch(&gpu)
        .unwrap();
        SampleTokens {
            logits: p,
            work: p,
            vocab: wide,
            layout: SampleLayout {
                n_rows: 4,
                n_penalties: 0,
                n_masked: 0,
            },
            inputs: p,
            outputs: p,
            threads: 1024,
        }
        .launch(&gpu)
        .unwrap();

        let launches = rec.launches.lock().unwrap();
        let mut seen: Vec<&str> = launches.iter().map(|(k, _)| k.as_str()).collect();
        seen.sort();
        seen.dedup();
        let mut every: Vec<&str> = sources::all_kernels().into_iter().map(|(_, k)| k).collect();
        every.sort();
        assert_eq!(seen, every, "every kernel is launched above");
        for (kernel, block) in launches.iter() {
            let bound = sources::launch_bound(kernel).unwrap();
            assert!(*block <= bound, "{kernel}: block {block} > bound {bound}");
        }
    }

    #[test]
    fn a_block_past_the_bound_is_refused_naming_the_kernel() {
        let rec = recorder();
        let gpu = Gpu::from_backend(rec.clone());
        let bound = sources::launch_bound("attn_decode_f32").unwrap();
        let err = gpu
            .launch("attn_decode_f32", Launch::new([1, 1, 1], bound + 32), &[])
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("attn_decode_f32") && msg.contains("__launch_bounds__"),
            "{msg}"
        );
        assert!(
            rec.launches.lock().unwrap().is_empty(),
            "the backend saw it"
        );
    }
}
