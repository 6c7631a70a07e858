//! The adapters' deltas in one step: after a base projection has run over every row of the
//! step, each row that runs with an adapter gets `scale · Bᵀᵀ(A·x)` added to its output.
//!
//! The work is grouped by adapter (each adapter's rows use its own `A` and `Bᵀ`, one pass
//! over the batch, never a forward per adapter), and each row's delta is computed alone, in a
//! fixed order (`r` dot products over the input, then `r` axpys into the output): the numbers
//! a row gets depend on its own input and adapter only, never on the batch around it, so the
//! engine's batch invariance holds with adapters too. Rows without an adapter are not touched.

use rayon::prelude::*;

use kernels::ops;

use super::{LoraAdapter, Proj};

/// Below this many multiply-adds a step's deltas run on the calling thread.
const PARALLEL_WORK: usize = 1 << 16;

/// The adapter of each row of a step (`None`: the base alone).
#[derive(Debug, Default)]
pub struct StepLoras<'a> {
    rows: Vec<Option<&'a LoraAdapter>>,
}

impl<'a> StepLoras<'a> {
    /// From each chunk's adapter and token count, in batch order; `None` when no row has an
    /// adapter (the step is the base's alone).
    pub fn new(chunks: impl Iterator<Item = (Option<&'a LoraAdapter>, usize)>) -> Option<Self> {
        let mut rows = Vec::new();
        for (lora, len) in chunks {
            rows.extend(std::iter::repeat_n(lora, len));
        }
        rows.iter()
            .any(Option::is_some)
            .then_some(StepLoras { rows })
    }

    /// `y[t] += scale · (A·x[t])·Bᵀ` for every row `t` whose adapter targets `proj` of
    /// `layer`; `x` and `y` hold one row per step row.
    pub fn add(&self, layer: usize, proj: Proj, x: &[f32], y: &mut [f32]) {
        let n = self.rows.len();
        if n == 0 || !x.len().is_multiple_of(n) || !y.len().is_multiple_of(n) {
            return;
        }
        let (in_dim, out_dim) = (x.len() / n, y.len() / n);
        let work: usize = self
            .rows
            .iter()
            .flatten()
            .filter_map(|a| a.pair(layer, proj).map(|_| a.rank * (in_dim + out_dim)))
            .sum();
        if work == 0 {
            return;
        }
        let row = |(t, yt): (usize, &mut [f32])| {
            let Some(adapter) = self.rows[t] else {
                return;
            };
            let Some(pair) = adapter.pair(layer, proj) else {
                return;
            };
            let xt = &x[t * in_dim..(t + 1) * in_dim];
            let r = adapter.rank;
            if pair.a.len() != r * in_dim || pair.bt.len() != r * out_dim {
                return;
            }
            for (a_k, bt_k) in pair
                .a
                .chunks_exact(in_dim)
                .zip(pair.bt.chunks_exact(out_dim))
            {
                let u = adapter.scale * ops::dot(a_k, xt);
                ops::axpy(u, bt_k, yt);
            }
        };
        if work < PARALLEL_WORK {
            y.chunks_exact_mut(out_dim).enumerate().for_each(row);
        } else {
            y.par_chunks_exact_mut(out_dim).enumerate().for_each(row);
        }
    }
}
