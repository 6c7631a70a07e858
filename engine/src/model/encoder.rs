//! The contract between encoder model code (BERT, XLM-R, ...) and the pooling front door: what
//! an input is, what a model's head gives back, and what the front door applies on top of it
//! per request (normalisation, a classifier's sigmoid or softmax).

use crate::error::Result;

/// How an encoder turns token states into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    Mean,
    Cls,
    LastToken,
}

impl Pooling {
    /// One input's vector from its token states (`rows`: one row of width `h` per token, at
    /// least one).
    pub fn pool(self, rows: &[f32], h: usize) -> Vec<f32> {
        let len = rows.len() / h;
        match self {
            Pooling::Cls => rows[..h].to_vec(),
            Pooling::LastToken => rows[(len - 1) * h..len * h].to_vec(),
            Pooling::Mean => {
                let mut sum = vec![0.0f32; h];
                for row in rows.chunks_exact(h) {
                    sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x);
                }
                let inv = 1.0 / len as f32;
                sum.iter_mut().for_each(|s| *s *= inv);
                sum
            }
        }
    }
}

/// What a classification head's logits go through when a request leaves `use_activation` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassActivation {
    /// Raw logits (a regression head, or sentence-transformers' Identity).
    Identity,
    /// Each logit on its own (one label, or multi-label classification).
    Sigmoid,
    /// Over all labels.
    Softmax,
}

impl ClassActivation {
    /// Sigmoid for fewer than two labels, else softmax: transformers' rule for a
    /// single-label problem, and what vLLM applies unless the checkpoint says otherwise.
    pub fn by_label_count(labels: usize) -> Self {
        if labels < 2 {
            ClassActivation::Sigmoid
        } else {
            ClassActivation::Softmax
        }
    }

    pub fn apply(self, logits: &mut [f32]) {
        match self {
            ClassActivation::Identity => {}
            ClassActivation::Sigmoid => logits
                .iter_mut()
                .for_each(|x| *x = (1.0 / (1.0 + (-f64::from(*x)).exp())) as f32),
            ClassActivation::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f64> = logits.iter().map(|&x| f64::from(x - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for (x, e) in logits.iter_mut().zip(exps) {
                    *x = (e / sum) as f32;
                }
            }
        }
    }
}

/// A sequence-classification head's labels and activations.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassifierInfo {
    /// `id2label` in id order: one name per logit.
    pub labels: Vec<String>,
    /// For the classify task: from `problem_type` (regression: none; multi-label: sigmoid;
    /// otherwise by the label count).
    pub classify: ClassActivation,
    /// For the score task (a cross-encoder): sentence-transformers' recorded activation,
    /// otherwise by the label count.
    pub score: ClassActivation,
}

/// What an encoder's head produces.
#[derive(Debug, Clone, PartialEq)]
pub enum EncoderHead {
    /// A sentence vector (pooled token states).
    Embed,
    /// One logit per label, from a classification head over the first token.
    Classify(ClassifierInfo),
}

/// Shape facts about an encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderInfo {
    pub hidden_size: usize,
    /// Longest input in tokens, special tokens included (sentence-transformers'
    /// `max_seq_length` where the checkpoint has one).
    pub max_seq_len: usize,
    pub pooling: Pooling,
    /// L2-normalise the pooled vector by default (a Normalize module in modules.json).
    pub normalize: bool,
    pub head: EncoderHead,
}

/// One tokenised encoder input: token ids and, for a pair encoded as one sequence, each
/// token's segment (token type id); `None` is segment 0 throughout.
#[derive(Debug, Clone, Copy)]
pub struct EncoderInput<'a> {
    pub ids: &'a [u32],
    pub type_ids: Option<&'a [u32]>,
}

/// A BERT-family encoder with its head.
pub trait EmbeddingModel: Send + Sync {
    fn info(&self) -> &EncoderInfo;

    /// Host bytes one batch of up to `tokens` tokens may hold beyond the weights, on
    /// `threads` threads (a term of the deployment's memory bound). This default counts eight
    /// hidden-wide rows per token and each thread's scores over the longest input.
    fn step_host_bytes(&self, tokens: usize, threads: usize) -> u64 {
        let i = self.info();
        let floats = tokens * 8 * i.hidden_size + threads * i.max_seq_len * i.max_seq_len;
        (floats as u64).saturating_mul(4)
    }

    /// Runs a batch of tokenised inputs (special tokens included, each no longer than
    /// `max_seq_len`) through the encoder and its head: per input, the pooled vector before
    /// any normalisation (an embedding head) or the logits (a classification head). An input's
    /// result does not depend on the batch it ran in.
    fn forward(&self, batch: &[EncoderInput<'_>]) -> Result<Vec<Vec<f32>>>;

    /// Single-segment inputs as `/v1/embeddings` answers by default: [`Self::forward`], then
    /// L2-normalised where the model normalises.
    fn embed(&self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let inputs: Vec<EncoderInput<'_>> = batch
            .iter()
            .map(|ids| EncoderInput {
                ids,
                type_ids: None,
            })
            .collect();
        let mut out = self.forward(&inputs)?;
        let info = self.info();
        if info.head == EncoderHead::Embed && info.normalize {
            out.iter_mut().for_each(|v| l2_normalize(v));
        }
        Ok(out)
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

/// An encoder checkpoint loaded with everything needed to serve it.
pub struct LoadedEncoder {
    pub model: Box<dyn EmbeddingModel>,
    /// Padding and truncation off: the front door fits inputs to the model itself.
    pub tokenizer: tokenizers::Tokenizer,
    pub architecture: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations() {
        let mut x = [0.0f32, 2.0];
        ClassActivation::Sigmoid.apply(&mut x);
        assert!((x[0] - 0.5).abs() < 1e-7 && (x[1] - 0.880_797).abs() < 1e-6);
        let mut y = [1.0f32, 1.0, 1000.0];
        ClassActivation::Softmax.apply(&mut y);
        assert!((y.iter().sum::<f32>() - 1.0).abs() < 1e-6 && y[2] > 0.999);
        let mut z = [-3.5f32];
        ClassActivation::Identity.apply(&mut z);
        assert_eq!(z, [-3.5]);
        assert_eq!(ClassActivation::by_label_count(1), ClassActivation::Sigmoid);
        assert_eq!(ClassActivation::by_label_count(3), ClassActivation::Softmax);
    }

    #[test]
    fn normalise() {
        let mut v = [3.0f32, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0f32; 2];
        l2_normalize(&mut zero);
        assert_eq!(zero, [0.0; 2]);
    }
}
