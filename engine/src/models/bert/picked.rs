//! The last layer when the head reads one token per sequence (a classification head over the
//! first token; CLS or last-token pooling). Every token's keys and values are still needed, but
//! the queries, attention output, output projection and feed-forward only matter for that one
//! token, so they run on one row per sequence instead of all of them: for a cross-encoder
//! that is most of a layer's work.
//!
//! A picked row goes through the same products as in the full layer (a row of the GEMM does not
//! depend on the other rows), so only the attention of its single query, a short loop here,
//! sums in another order than the full layer's.

use kernels::softmax_rows;

use super::{BertEncoder, Layer};
use crate::error::Result;

/// Which token of each sequence the head reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Picked {
    First,
    Last,
}

impl Picked {
    /// The row of a sequence that starts at `t0` and has `len` tokens.
    fn row(self, (t0, len): (usize, usize)) -> usize {
        match self {
            Picked::First => t0,
            Picked::Last => t0 + len - 1,
        }
    }
}

/// The buffers of one forward pass the last layer works in.
pub(super) struct LastBuffers<'a> {
    /// Every token's input to the layer, `[total][hidden]`.
    pub x: &'a [f32],
    /// `[total][3 * hidden]`; the keys and values are written here.
    pub qkv: &'a mut [f32],
    /// Scratch space of at least `seqs * hidden` floats each.
    pub rows: &'a mut [f32],
    pub query: &'a mut [f32],
    pub ctx: &'a mut [f32],
    /// At least `seqs * intermediate` floats.
    pub ffn: &'a mut [f32],
}

impl BertEncoder {
    /// Whether this layer can run on picked rows: the fused projection splits into queries
    /// and keys-with-values on a panel boundary.
    pub(super) fn can_pick(&self, layer: &Layer) -> bool {
        let h = self.dims.hidden;
        layer.qkv.has_cols(0, h) && layer.qkv.has_cols(h, 2 * h)
    }

    /// Runs `layer` for the picked row of each sequence; returns the layer's output rows,
    /// `[spans.len()][hidden]`, at the front of `b.rows`.
    pub(super) fn last_layer_picked<'b>(
        &self,
        layer: &Layer,
        pick: Picked,
        spans: &[(usize, usize)],
        b: LastBuffers<'b>,
    ) -> Result<&'b [f32]> {
        let LastBuffers {
            x,
            qkv,
            rows,
            query,
            ctx,
            ffn,
        } = b;
        let d = &self.dims;
        let (h, hd) = (d.hidden, d.head_dim);
        let (total, n) = (x.len() / h, spans.len());
        let ld = 3 * h;
        layer
            .qkv
            .forward_cols(total, x, (h, 2 * h), &mut qkv[h..], ld)?;
        let rows = &mut rows[..n * h];
        for (dst, &span) in rows.chunks_exact_mut(h).zip(spans) {
            let r = pick.row(span);
            dst.copy_from_slice(&x[r * h..(r + 1) * h]);
        }
        let query = &mut query[..n * h];
        layer.qkv.forward_cols(n, rows, (0, h), query, h)?;
        let scale = 1.0 / (hd as f32).sqrt();
        let ctx = &mut ctx[..n * h];
        let mut scores = Vec::new();
        for ((q_row, ctx_row), &(t0, len)) in query
            .chunks_exact(h)
            .zip(ctx.chunks_exact_mut(h))
            .zip(spans)
        {
            scores.resize(len, 0.0);
            for (head, (q, out)) in q_row
                .chunks_exact(hd)
                .zip(ctx_row.chunks_exact_mut(hd))
                .enumerate()
            {
                let keys = (t0..t0 + len).map(|t| &qkv[t * ld + h + head * hd..][..hd]);
                for (s, key) in scores.iter_mut().zip(keys) {
                    *s = q.iter().zip(key).map(|(a, k)| a * k).sum();
                }
                softmax_rows(&mut scores, len, scale);
                out.fill(0.0);
                for (&p, t) in scores.iter().zip(t0..t0 + len) {
                    let value = &qkv[t * ld + 2 * h + head * hd..][..hd];
                    out.iter_mut().zip(value).for_each(|(o, &v)| *o += p * v);
                }
            }
        }
        // The queries are spent: their buffer takes the attention block's output.
        let out = query;
        layer.attn_out.forward(n, ctx, out)?;
        self.residual_norm(out, rows, &layer.ln1_g, &layer.ln1_b);
        let ffn = &mut ffn[..n * d.intermediate];
        layer.up.forward_act(n, out, ffn, Some(d.act))?;
        layer.down.forward(n, ffn, rows)?;
        self.residual_norm(rows, out, &layer.ln2_g, &layer.ln2_b);
        Ok(rows)
    }
}
