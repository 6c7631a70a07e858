//! One step of the decoder on the CPU: embeddings and rotary angles, the layers, and the
//! LM head over the rows whose logits are wanted.

use kernels::{ops, Activation, MatmulJob};
use rayon::prelude::*;

use super::attention::{self, AttnShape, ChunkSpan};
use super::{LlamaConfig, LlamaModel, MlpActivation, Scratch};
use crate::error::{EngineError, Result};
use crate::lora::{Proj, StepLoras};
use crate::model::{PagedKvCache, SeqChunk};

impl LlamaModel {
    /// One step; `all_rows[i]` (when present) asks for chunk `i`'s logits at every token,
    /// as [`CausalLm::forward_rows`] returns them.
    pub(super) fn run(
        &self,
        batch: &[SeqChunk<'_>],
        all_rows: &[bool],
        kv: &mut PagedKvCache,
        s: &mut Scratch,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let spans = self.layers(batch, kv, s)?;
        self.logits(batch, &spans, all_rows, s)
    }

    /// The embeddings and every layer over the step's tokens: leaves the last layer's output
    /// (before the final norm) in `s.x`, one row per token, and returns where each chunk's
    /// rows are. A cache of one layer is reused by every layer in turn: a layer reads only the
    /// keys and values it wrote itself, so a one-off pass (embeddings) needs no more.
    pub(super) fn layers<'a>(
        &self,
        batch: &[SeqChunk<'a>],
        kv: &mut PagedKvCache,
        s: &mut Scratch,
    ) -> Result<Vec<ChunkSpan<'a>>> {
        let cfg = &self.cfg;
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let half = cfg.rope_dim / 2;
        let t_total: usize = batch.iter().map(|c| c.tokens.len()).sum();

        let mut spans = Vec::with_capacity(batch.len());
        let mut row = 0;
        for c in batch {
            spans.push(ChunkSpan {
                row,
                len: c.tokens.len(),
                start_pos: c.start_pos,
                block_table: c.block_table,
            });
            row += c.tokens.len();
        }

        s.x.resize(t_total * h, 0.0);
        s.h.resize(t_total * h, 0.0);
        s.q.resize(t_total * q_dim, 0.0);
        s.k.resize(t_total * kv_dim, 0.0);
        s.v.resize(t_total * kv_dim, 0.0);
        s.attn.resize(t_total * q_dim, 0.0);
        s.gate.resize(t_total * cfg.ffn, 0.0);
        s.up.resize(t_total * cfg.ffn, 0.0);
        s.cos.resize(t_total * half, 0.0);
        s.sin.resize(t_total * half, 0.0);
        let local_base = cfg.local_rope_base;
        let local_len = if local_base.is_some() {
            t_total * half
        } else {
            0
        };
        s.cos_local.resize(local_len, 0.0);
        s.sin_local.resize(local_len, 0.0);

        // Embeddings (only the looked-up rows are dequantised; media rows are copied from the
        // encoder's output) and rotary angles.
        let embd = self.qm(&self.token_embd)?;
        let mut mrope = MropeScratch::default();
        for (c, span) in batch.iter().zip(&spans) {
            let mut media_rows = c
                .media
                .map(|m| m.rows.iter().zip(m.embeds.chunks_exact(h)))
                .into_iter()
                .flatten()
                .peekable();
            for (i, &tok) in c.tokens.iter().enumerate() {
                let t = span.row + i;
                let x = &mut s.x[t * h..(t + 1) * h];
                match media_rows.next_if(|(r, _)| **r as usize == i) {
                    Some((_, e)) => x.copy_from_slice(e),
                    None => {
                        embd.dequantize_row_into(tok as usize, x);
                        if let Some(scale) = cfg.traits.embed_scale {
                            x.iter_mut().for_each(|v| *v *= scale);
                        }
                    }
                }
                if let Some(base) = local_base {
                    ops::rope_angles(
                        c.start_pos + i,
                        base,
                        cfg.rope_dim,
                        1.0,
                        None,
                        &mut s.cos_local[t * half..(t + 1) * half],
                        &mut s.sin_local[t * half..(t + 1) * half],
                    );
                }
                let (cos, sin) = (
                    &mut s.cos[t * half..(t + 1) * half],
                    &mut s.sin[t * half..(t + 1) * half],
                );
                match (cfg.mrope_section, c.media) {
                    (Some(sections), Some(m)) => {
                        let pos = match m.positions {
                            Some(p) => p[i].map(|v| v as i64),
                            None => [(c.start_pos + i) as i64 + m.position_delta; 3],
                        };
                        mrope.angles(cfg, self.rope_factors.as_deref(), sections, pos, cos, sin);
                    }
                    _ => ops::rope_angles(
                        c.start_pos + i,
                        cfg.rope_base,
                        cfg.rope_dim,
                        cfg.rope_freq_scale,
                        self.rope_factors.as_deref(),
                        cos,
                        sin,
                    ),
                }
            }
        }

        // Each row's adapter, when any row has one: its deltas follow the base projections.
        let loras = StepLoras::new(batch.iter().map(|c| (c.lora, c.tokens.len())));
        let lora = |li: usize, proj: Proj, x: &[f32], y: &mut [f32]| {
            if let Some(l) = &loras {
                l.add(li, proj, x, y);
            }
        };
        let base_scale = cfg.traits.attn_scale.unwrap_or(1.0 / (hd as f32).sqrt());
        // A prefill's per-token work (norms, rotary, the activation) in parallel; a decode
        // step's few rows on this thread.
        let par = t_total >= PAR_ROWS;
        // Rows of the attention's and the MLP's normed outputs (sandwich norms).
        let mut normed = vec![0f32; h];
        for (li, layer) in self.layers.iter().enumerate() {
            let window = cfg.window(li);
            // Gemma 3's sliding layers turn with their own base and no scaling: YaRN's
            // attention factor belongs to the scaled RoPE only.
            let local = window.is_some() && local_base.is_some();
            let (cos_all, sin_all, attn_factor) = if local {
                (&s.cos_local, &s.sin_local, 1.0)
            } else {
                (&s.cos, &s.sin, cfg.rope_attn_factor)
            };
            let shape = AttnShape {
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: hd,
                block_size: kv.block_size,
                scale: attn_factor * attn_factor * base_scale,
                window,
                softcap: cfg.traits.attn_softcap,
            };
            norm_rows(&s.x, &layer.attn_norm, cfg.eps, &mut s.h, h, par);
            self.matmul_multi(
                &s.h,
                t_total,
                &mut [
                    MatmulJob {
                        w: self.qm(&layer.wq)?,
                        out: &mut s.q,
                    },
                    MatmulJob {
                        w: self.qm(&layer.wk)?,
                        out: &mut s.k,
                    },
                    MatmulJob {
                        w: self.qm(&layer.wv)?,
                        out: &mut s.v,
                    },
                ],
                false,
            )?;
            lora(li, Proj::Q, &s.h, &mut s.q);
            lora(li, Proj::K, &s.h, &mut s.k);
            lora(li, Proj::V, &s.h, &mut s.v);
            let token = |t: usize, q: &mut [f32], k: &mut [f32], v: &mut [f32]| {
                if let Some(b) = &layer.bq {
                    ops::add_assign(q, b);
                }
                if let Some(b) = &layer.bk {
                    ops::add_assign(k, b);
                }
                if let Some(b) = &layer.bv {
                    ops::add_assign(v, b);
                }
                if let Some(w) = &layer.q_norm {
                    head_norm(q, w, hd, cfg.eps);
                }
                if let Some(w) = &layer.k_norm {
                    head_norm(k, w, hd, cfg.eps);
                }
                let cos = &cos_all[t * half..(t + 1) * half];
                let sin = &sin_all[t * half..(t + 1) * half];
                ops::rope(q, cfg.n_heads, hd, cfg.rope_dim, cos, sin, cfg.rope_neox);
                ops::rope(k, cfg.n_kv_heads, hd, cfg.rope_dim, cos, sin, cfg.rope_neox);
            };
            if par {
                s.q.par_chunks_exact_mut(q_dim)
                    .zip(s.k.par_chunks_exact_mut(kv_dim))
                    .zip(s.v.par_chunks_exact_mut(kv_dim))
                    .enumerate()
                    .for_each(|(t, ((q, k), v))| token(t, q, k, v));
            } else {
                let rows =
                    s.q.chunks_exact_mut(q_dim)
                        .zip(s.k.chunks_exact_mut(kv_dim))
                        .zip(s.v.chunks_exact_mut(kv_dim));
                for (t, ((q, k), v)) in rows.enumerate() {
                    token(t, q, k, v);
                }
            }
            // Store this step's keys and values, then attend over the cache.
            let slot = if kv.n_layers == 1 { 0 } else { li };
            for span in &spans {
                for i in 0..span.len {
                    let t = span.row + i;
                    let off = kv.offset(span.block_table, span.start_pos + i);
                    kv.k[slot].write(off, &s.k[t * kv_dim..(t + 1) * kv_dim]);
                    kv.v[slot].write(off, &s.v[t * kv_dim..(t + 1) * kv_dim]);
                }
            }
            attention::attend(&shape, &spans, &s.q, &kv.k[slot], &kv.v[slot], &mut s.attn);
            // The adapter's delta joins the projection's output before any norm of it (a
            // residual add is linear, so it may also go straight into the stream).
            match &layer.post_attn_norm {
                None => {
                    self.matmul(&s.attn, t_total, &layer.wo, &mut s.x, true)?;
                    lora(li, Proj::O, &s.attn, &mut s.x);
                }
                Some(w) => {
                    self.matmul(&s.attn, t_total, &layer.wo, &mut s.h, false)?;
                    lora(li, Proj::O, &s.attn, &mut s.h);
                    add_normed(&mut s.x, &s.h, w, cfg.eps, &mut normed);
                }
            }

            norm_rows(&s.x, &layer.ffn_norm, cfg.eps, &mut s.h, h, par);
            self.matmul_multi(
                &s.h,
                t_total,
                &mut [
                    MatmulJob {
                        w: self.qm(&layer.w_gate)?,
                        out: &mut s.gate,
                    },
                    MatmulJob {
                        w: self.qm(&layer.w_up)?,
                        out: &mut s.up,
                    },
                ],
                false,
            )?;
            lora(li, Proj::Gate, &s.h, &mut s.gate);
            lora(li, Proj::Up, &s.h, &mut s.up);
            match cfg.traits.activation {
                // In pieces of whole vectors: each element takes the operations it takes
                // in one call over the whole buffer.
                MlpActivation::Silu if par => s
                    .gate
                    .par_chunks_mut(SILU_PIECE)
                    .zip(s.up.par_chunks(SILU_PIECE))
                    .for_each(|(g, u)| ops::silu_mul(g, u)),
                MlpActivation::Silu => ops::silu_mul(&mut s.gate, &s.up),
                MlpActivation::GeluTanh => {
                    Activation::GeluTanh.apply(&mut s.gate);
                    s.gate.iter_mut().zip(&s.up).for_each(|(g, u)| *g *= u);
                }
            }
            match &layer.post_ffn_norm {
                None => {
                    self.matmul(&s.gate, t_total, &layer.w_down, &mut s.x, true)?;
                    lora(li, Proj::Down, &s.gate, &mut s.x);
                }
                Some(w) => {
                    self.matmul(&s.gate, t_total, &layer.w_down, &mut s.h, false)?;
                    lora(li, Proj::Down, &s.gate, &mut s.h);
                    add_normed(&mut s.x, &s.h, w, cfg.eps, &mut normed);
                }
            }
        }

        Ok(spans)
    }

    /// The final norm and the LM head over the rows [`Self::layers`] left in `s.x`.
    fn logits(
        &self,
        batch: &[SeqChunk<'_>],
        spans: &[ChunkSpan<'_>],
        all_rows: &[bool],
        s: &Scratch,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let cfg = &self.cfg;
        // Final norm and LM head for the rows whose logits are wanted: each sampling chunk's
        // last row, then the other rows of the chunks that want all of theirs (prompt
        // logprobs). The sampling rows go through the head on their own, as in a step without
        // prompt logprobs: the quantised path depends on the row count, and asking for prompt
        // logprobs must not change what is sampled.
        let every = |ci: usize| all_rows.get(ci).copied().unwrap_or(false);
        let sampling: Vec<usize> = (0..batch.len())
            .filter(|&ci| batch[ci].want_logits)
            .collect();
        let extra: Vec<(usize, std::ops::Range<usize>)> = (0..batch.len())
            .filter(|&ci| every(ci))
            .map(|ci| {
                let end = spans[ci].row + spans[ci].len - usize::from(batch[ci].want_logits);
                (ci, spans[ci].row..end)
            })
            .collect();
        let last_rows: Vec<usize> = sampling
            .iter()
            .map(|&ci| spans[ci].row + spans[ci].len - 1)
            .collect();
        let sampled = self.lm_head(s, &last_rows)?;
        let extra_rows: Vec<usize> = extra.iter().flat_map(|(_, r)| r.clone()).collect();
        let mut rows = self.lm_head(s, &extra_rows)?;
        let vocab = cfg.vocab;
        let mut results: Vec<Option<Vec<f32>>> = vec![None; batch.len()];
        if let ([ci], []) = (&sampling[..], &extra[..]) {
            results[*ci] = Some(sampled);
            return Ok(results);
        }
        let mut at = 0;
        for (ci, r) in extra {
            let mut mine = if at == 0 && r.len() * vocab == rows.len() {
                std::mem::take(&mut rows)
            } else {
                rows[at * vocab..(at + r.len()) * vocab].to_vec()
            };
            at += r.len();
            if let Ok(j) = sampling.binary_search(&ci) {
                mine.extend_from_slice(&sampled[j * vocab..(j + 1) * vocab]);
            }
            results[ci] = Some(mine);
        }
        for (j, &ci) in sampling.iter().enumerate() {
            if results[ci].is_none() {
                results[ci] = Some(sampled[j * vocab..(j + 1) * vocab].to_vec());
            }
        }
        Ok(results)
    }

    /// The final norm and the LM head over rows `rows` of the step's hidden states: one
    /// logits row each, in that order.
    fn lm_head(&self, s: &Scratch, rows: &[usize]) -> Result<Vec<f32>> {
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let normed = self.final_norm(s, rows.iter().copied());
        let mut logits = vec![0f32; n * self.cfg.vocab];
        // The LM head sees only the logit rows: a prefill step's head is decode-sized.
        self.matmul(&normed, n, &self.output, &mut logits, false)?;
        if let Some(cap) = self.cfg.traits.final_softcap {
            logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
        }
        Ok(logits)
    }

    /// The final norm of rows `rows` of the step's hidden states, one row each, in order.
    pub(super) fn final_norm(
        &self,
        s: &Scratch,
        rows: impl ExactSizeIterator<Item = usize>,
    ) -> Vec<f32> {
        let h = self.cfg.hidden;
        let mut normed = vec![0f32; rows.len() * h];
        for (out, t) in normed.chunks_exact_mut(h).zip(rows) {
            ops::rmsnorm(
                &s.x[t * h..(t + 1) * h],
                &self.output_norm,
                self.cfg.eps,
                out,
            );
        }
        normed
    }
}

/// Checks a step's chunks against the model and a cache of `num_blocks` blocks of
/// `block_size` tokens: token ids, positions, media rows and block tables.
pub(super) fn validate_chunks(
    cfg: &LlamaConfig,
    batch: &[SeqChunk<'_>],
    block_size: usize,
    num_blocks: usize,
) -> Result<()> {
    for (i, c) in batch.iter().enumerate() {
        if c.tokens.is_empty() {
            return Err(EngineError::Internal(format!(
                "batch chunk {i} has no tokens"
            )));
        }
        if let Some(m) = &c.media {
            let rows_ok = m.rows.windows(2).all(|w| w[0] < w[1])
                && m.rows.last().is_none_or(|&r| (r as usize) < c.tokens.len());
            if !rows_ok || m.embeds.len() != m.rows.len() * cfg.hidden {
                return Err(EngineError::Internal(format!(
                    "batch chunk {i}: {} media rows with {} values do not fit its {} tokens of width {}",
                    m.rows.len(),
                    m.embeds.len(),
                    c.tokens.len(),
                    cfg.hidden
                )));
            }
            if m.positions.is_some_and(|p| p.len() != c.tokens.len()) {
                return Err(EngineError::Internal(format!(
                    "batch chunk {i}: M-RoPE positions do not cover its {} tokens",
                    c.tokens.len()
                )));
            }
        }
        if let Some(&t) = c.tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(EngineError::invalid(
                format!(
                    "token id {t} is out of range for a vocabulary of {} tokens",
                    cfg.vocab
                ),
                Some("prompt"),
            ));
        }
        let end = c.start_pos + c.tokens.len();
        if end > cfg.max_position {
            return Err(EngineError::invalid(
                format!(
                    "sequence length {end} exceeds the model's maximum of {} positions",
                    cfg.max_position
                ),
                None,
            ));
        }
        let needed = end.div_ceil(block_size);
        if c.block_table.len() < needed {
            return Err(EngineError::Internal(format!(
                "block table of chunk {i} has {} blocks, {needed} needed for {end} positions",
                c.block_table.len()
            )));
        }
        if let Some(b) = c.block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return Err(EngineError::Internal(format!(
                "block id {b} is outside the cache's {} blocks",
                num_blocks
            )));
        }
    }
    Ok(())
}

/// `x[t] += rmsnorm(y[t]) · w` for every row `t`: a residual add through a norm of the branch's
/// output (Gemma's post-attention and post-MLP norms).
fn add_normed(x: &mut [f32], y: &[f32], w: &[f32], eps: f32, row: &mut [f32]) {
    let h = w.len();
    for (xt, yt) in x.chunks_exact_mut(h).zip(y.chunks_exact(h)) {
        ops::rmsnorm(yt, w, eps, row);
        ops::add_assign(xt, row);
    }
}

/// Tokens from which a step's per-token work runs in parallel.
const PAR_ROWS: usize = 16;
/// Elements per parallel piece of the MLP's activation: whole 8-lane vectors.
const SILU_PIECE: usize = 8 * 1024;

/// `out` row `t` = RMSNorm of `x` row `t` (rows of `h`), each row as `ops::rmsnorm` gives it.
fn norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32], h: usize, par: bool) {
    if par {
        out.par_chunks_exact_mut(h)
            .zip(x.par_chunks_exact(h))
            .for_each(|(o, xr)| ops::rmsnorm(xr, w, eps, o));
    } else {
        for (o, xr) in out.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
            ops::rmsnorm(xr, w, eps, o);
        }
    }
}

/// RMSNorm applied to each head of `x` separately (Qwen3 Q/K norms).
fn head_norm(x: &mut [f32], w: &[f32], hd: usize, eps: f32) {
    let mut tmp = vec![0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        ops::rmsnorm(head, w, eps, &mut tmp);
        head.copy_from_slice(&tmp);
    }
}

/// M-RoPE angles: each position's angles computed once, then frequency `j` takes the
/// temporal, row or column one by the section it falls in.
#[derive(Default)]
struct MropeScratch {
    cos: [Vec<f32>; 3],
    sin: [Vec<f32>; 3],
}

impl MropeScratch {
    fn angles(
        &mut self,
        cfg: &LlamaConfig,
        factors: Option<&[f32]>,
        sections: [usize; 3],
        pos: [i64; 3],
        cos: &mut [f32],
        sin: &mut [f32],
    ) {
        let half = cfg.rope_dim / 2;
        for ((c, sn), &p) in self.cos.iter_mut().zip(&mut self.sin).zip(&pos) {
            c.resize(half, 0.0);
            sn.resize(half, 0.0);
            ops::rope_angles(
                p.max(0) as usize,
                cfg.rope_base,
                cfg.rope_dim,
                cfg.rope_freq_scale,
                factors,
                c,
                sn,
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
            cos[j] = self.cos[axis][j];
            sin[j] = self.sin[axis][j];
        }
    }
}
