//! The matrices the CPU's kernels read faster interleaved (eight rows side by side, see
//! [`kernels::interleave_rows`]: every quantised type but Q2_K and Q3_K, on every SIMD
//! level), copied once at load into an anonymous map of the same size, in place of their pages of the file.
//!
//! Only the integer (q8) activation path gains: the f32 path would bring every group back to
//! rows on each use, so switching to f32 activations returns to the file's bytes and frees the
//! copy. The results are the same bits either way.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use memmap2::{MmapMut, UncheckedAdvice};

use super::{LlamaModel, Weight};
use crate::error::{EngineError, Result};

/// The interleaved copy: which map holds it, and every matrix as the file stores it (in
/// [`LlamaModel::for_each_weight`]'s order) to return to.
pub(super) struct Interleaved {
    map: usize,
    by_rows: Vec<Weight>,
    /// The copy's size.
    pub(super) bytes: usize,
}

impl LlamaModel {
    /// Every matrix of the model, in a fixed order (the tied head after the embedding table,
    /// as the same bytes).
    fn for_each_weight(&mut self, mut f: impl FnMut(&mut Weight)) {
        f(&mut self.token_embd);
        f(&mut self.output);
        for l in &mut self.layers {
            for w in [
                &mut l.wq,
                &mut l.wk,
                &mut l.wv,
                &mut l.wo,
                &mut l.w_gate,
                &mut l.w_up,
                &mut l.w_down,
            ] {
                f(w);
            }
        }
    }

    /// Copy the matrices this CPU's kernels read faster interleaved into that layout (no-op
    /// when none does, or when already done). Where the map is the file's own pages (not the
    /// weight cache's shared memory), the copied ranges leave this process's resident set;
    /// they are read back from the file if ever needed.
    pub(super) fn interleave(&mut self) -> Result<()> {
        let drop_file_pages = self.file_pages;
        if self.interleaved.is_some() {
            return Ok(());
        }
        let t0 = Instant::now();
        // Distinct byte ranges that gain, each placed once in the copy.
        let mut place: HashMap<(usize, usize, usize), usize> = HashMap::new();
        let mut todo: Vec<Weight> = Vec::new();
        let mut total = 0usize;
        self.for_each_weight(|w| {
            let gains = kernels::interleaving_pays(w.dtype)
                && w.rows.is_multiple_of(8)
                && w.cols.is_multiple_of(w.dtype.block_elems());
            if gains && !place.contains_key(&(w.file, w.start, w.len)) {
                place.insert((w.file, w.start, w.len), total);
                todo.push(*w);
                total += w.len;
            }
        });
        if todo.is_empty() {
            return Ok(());
        }
        let err = |e: std::io::Error| {
            EngineError::Internal(format!("cannot map {total} bytes for the weights: {e}"))
        };
        let mut copy = MmapMut::map_anon(total).map_err(err)?;
        // A decode step streams every matrix once: on 4 KiB pages a 1B model's copy spans
        // ~200k of them, far past what the TLB covers, so every page costs a walk. Asked
        // before the first write, so the copy is faulted in as 2 MiB pages where the kernel
        // allows (`transparent_hugepage` set to `madvise` or `always`).
        #[cfg(target_os = "linux")]
        if let Err(e) = copy.advise(memmap2::Advice::HugePage) {
            tracing::debug!(error = %e, "no transparent huge pages for the interleaved copy");
        }
        for w in &todo {
            let at = place[&(w.file, w.start, w.len)];
            let src = &self.maps[w.file][w.start..w.start + w.len];
            kernels::interleave_rows(w.dtype, w.rows, w.cols, src, &mut copy[at..at + w.len])
                .map_err(|e| EngineError::Internal(format!("interleaving a matrix: {e}")))?;
            if drop_file_pages {
                // SAFETY: the range is inside a read-only map of a file; dropping its pages
                // loses nothing (a later read faults them back from the file), and nothing
                // holds a pointer into them across this call.
                let dropped = unsafe {
                    self.maps[w.file].unchecked_advise_range(
                        UncheckedAdvice::DontNeed,
                        w.start,
                        w.len,
                    )
                };
                if let Err(e) = dropped {
                    tracing::debug!(error = %e, "could not release the file's pages");
                }
            }
        }
        let map = self.maps.len();
        self.maps
            .push(Arc::new(copy.make_read_only().map_err(err)?));
        let mut by_rows = Vec::new();
        self.for_each_weight(|w| {
            by_rows.push(*w);
            if let Some(&at) = place.get(&(w.file, w.start, w.len)) {
                *w = Weight {
                    file: map,
                    start: at,
                    interleaved: true,
                    ..*w
                };
            }
        });
        self.interleaved = Some(Interleaved {
            map,
            by_rows,
            bytes: total,
        });
        tracing::info!(
            matrices = todo.len(),
            bytes = total,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "interleaved the quantised matrices for this CPU's kernels"
        );
        Ok(())
    }

    /// Return every matrix to the file's bytes and free the interleaved copy.
    pub(super) fn deinterleave(&mut self) {
        let Some(Interleaved { map, by_rows, .. }) = self.interleaved.take() else {
            return;
        };
        let mut saved = by_rows.into_iter();
        self.for_each_weight(|w| {
            if let Some(orig) = saved.next() {
                *w = orig;
            }
        });
        self.maps.truncate(map);
    }
}
