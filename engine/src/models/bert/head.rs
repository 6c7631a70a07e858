//! What runs on the encoder's last token states: pooling into a sentence vector, or a
//! sequence-classification head over the first token.
//!
//! Both classification heads in use have the same shape: a hidden-to-hidden dense layer and
//! tanh on the first token ([CLS] / `<s>`), then a linear layer to the labels. BERT calls the
//! first layer its pooler (`bert.pooler.dense`) and the second `classifier`; RoBERTa and XLM-R
//! keep both in `classifier` (`dense`, `out_proj`). Dropout is off at inference.

use super::dense::Dense;
use super::picked::Picked;
use super::Reader;
use crate::error::Result;
use crate::model::Pooling;

pub(super) enum Head {
    /// Sentence vectors; normalisation is the caller's (it depends on the request).
    Pool(Pooling),
    Classifier {
        dense: Dense,
        out: Dense,
        labels: usize,
    },
}

/// Where a classification head's tensors are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassifierLayout {
    /// `{prefix}pooler.dense`, then `classifier`.
    Bert,
    /// `classifier.dense`, then `classifier.out_proj`.
    Roberta,
}

impl Head {
    /// The one token of each sequence the head reads, where it reads only one.
    pub(super) fn picked(&self) -> Option<Picked> {
        match self {
            Head::Classifier { .. } | Head::Pool(Pooling::Cls) => Some(Picked::First),
            Head::Pool(Pooling::LastToken) => Some(Picked::Last),
            Head::Pool(Pooling::Mean) => None,
        }
    }

    /// Reads a classification head of `labels` outputs. `encoder` reads the encoder's own
    /// tensors (with its prefix), `root` the checkpoint's top level.
    pub(super) fn classifier(
        layout: ClassifierLayout,
        encoder: &Reader<'_>,
        root: &Reader<'_>,
        hidden: usize,
        labels: usize,
    ) -> Result<Self> {
        let (dense_reader, dense_name, out_name) = match layout {
            ClassifierLayout::Bert => (encoder, "pooler.dense", "classifier"),
            ClassifierLayout::Roberta => (root, "classifier.dense", "classifier.out_proj"),
        };
        let dense_w = dense_reader.get(&format!("{dense_name}.weight"), &[hidden, hidden])?;
        let dense_b = dense_reader.get(&format!("{dense_name}.bias"), &[hidden])?;
        let out_w = root.get(&format!("{out_name}.weight"), &[labels, hidden])?;
        let out_b = root.get(&format!("{out_name}.bias"), &[labels])?;
        Ok(Head::Classifier {
            dense: Dense::new(&dense_w, dense_b, hidden, hidden),
            out: Dense::new(&out_w, out_b, labels, hidden),
            labels,
        })
    }

    /// One result per sequence: `x` holds the chunk's token states (`hidden` wide), `spans`
    /// each sequence's first row and length.
    pub(super) fn apply(
        &self,
        x: &[f32],
        spans: &[(usize, usize)],
        hidden: usize,
    ) -> Result<Vec<Vec<f32>>> {
        match self {
            Head::Pool(pooling) => Ok(spans
                .iter()
                .map(|&(t0, len)| pooling.pool(&x[t0 * hidden..(t0 + len) * hidden], hidden))
                .collect()),
            Head::Classifier { dense, out, labels } => {
                let n = spans.len();
                let mut first = Vec::with_capacity(n * hidden);
                for &(t0, _) in spans {
                    first.extend_from_slice(&x[t0 * hidden..(t0 + 1) * hidden]);
                }
                let mut mid = vec![0.0f32; n * hidden];
                dense.forward(n, &first, &mut mid)?;
                mid.iter_mut().for_each(|v| *v = v.tanh());
                let mut logits = vec![0.0f32; n * labels];
                out.forward(n, &mid, &mut logits)?;
                Ok(logits.chunks_exact(*labels).map(<[f32]>::to_vec).collect())
            }
        }
    }
}
