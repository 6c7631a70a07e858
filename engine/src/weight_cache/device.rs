//! The weight cache on a GPU: the daemon converts and uploads a checkpoint's device weights
//! once and exports them as one shared region (a CUDA VMM POSIX-fd handle; a memfd on the
//! kernels' emulator); an engine maps that region at its bring-up's weights step and builds
//! its device tensors as views into it, copying nothing.
//!
//! The checkpoint's file bytes travel beside them as on the CPU: the engine's host model maps
//! those, for the GPU bring-up's self-test against its CPU twin and for serving on the CPU when
//! `--device auto` falls back.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use kernels::gpu::{Gpu, PackedWeights, Slot};

use super::protocol::{DeviceSlot, DeviceWeights};
use crate::device::DTypeRequest;
use crate::error::{EngineError, Result};
use crate::load::LoadedDecoder;

/// Device weights the daemon holds for engines.
pub struct HeldDevice {
    pub(super) packed: PackedWeights,
}

impl HeldDevice {
    /// `decoder`'s weights converted for `gpu` as `dtype`, packed for sharing.
    pub(super) fn convert(
        decoder: &LoadedDecoder,
        gpu: &Gpu,
        dtype: DTypeRequest,
    ) -> Result<HeldDevice> {
        let packed = decoder.model.export_gpu_weights(gpu, dtype)?;
        Ok(HeldDevice { packed })
    }

    pub fn bytes(&self) -> u64 {
        self.packed.len_bytes() as u64
    }

    /// What an engine is told of the region, beside its handle.
    pub(super) fn wire(&self) -> DeviceWeights {
        DeviceWeights {
            bytes: self.bytes(),
            slots: self
                .packed
                .slots
                .iter()
                .map(|s| DeviceSlot {
                    name: s.name.clone(),
                    offset: s.offset as u64,
                    bytes: s.bytes as u64,
                })
                .collect(),
        }
    }

    /// The handle engines map the region with.
    pub(super) fn handle(&self) -> Result<BorrowedFd<'_>> {
        self.packed
            .region
            .handle()
            .ok_or_else(|| EngineError::Internal("held device weights without a handle".into()))
    }
}

/// Device weights an engine received from the daemon, mapped at its GPU bring-up.
#[derive(Debug)]
pub struct CachedDevice {
    weights: DeviceWeights,
    handle: OwnedFd,
    /// Whether a failure to map them may upload from the host model instead.
    pub fallback: bool,
}

impl CachedDevice {
    pub(super) fn new(weights: DeviceWeights, handle: OwnedFd, fallback: bool) -> Self {
        CachedDevice {
            weights,
            handle,
            fallback,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.weights.bytes
    }

    /// The region mapped on `gpu`. The handle is closed when `self` goes; the mapping stays
    /// while the model's views of it live.
    pub fn map(&self, gpu: &Gpu) -> Result<PackedWeights> {
        let too_big = |what: &str, n: u64| {
            EngineError::load(
                gpu.info().label(),
                format!("the cached device weights' {what} ({n}) does not fit this machine"),
            )
        };
        let bytes =
            usize::try_from(self.weights.bytes).map_err(|_| too_big("size", self.weights.bytes))?;
        let slots = self
            .weights
            .slots
            .iter()
            .map(|s| {
                Ok(Slot {
                    name: s.name.clone(),
                    offset: usize::try_from(s.offset).map_err(|_| too_big("offset", s.offset))?,
                    bytes: usize::try_from(s.bytes).map_err(|_| too_big("size", s.bytes))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        PackedWeights::import(gpu, self.handle.as_fd(), bytes, slots).map_err(|e| {
            EngineError::load(
                gpu.info().label(),
                format!("cannot map the cached device weights: {e}"),
            )
        })
    }
}
