//! LoRA in the scheduler: `--max-loras` (the distinct adapters of a step's batch) and the
//! factors a sequence takes as it is admitted (`--max-cpu-loras`, [`LoraRegistry::acquire`]).

use super::{Engine, Sequence};
use crate::error::{EngineError, Result};
use crate::lora::{Acquired, LoraRegistry};

/// The adapters of the running batch, by registration id, and the most it may hold.
pub(super) struct LoraSet {
    max: Option<usize>,
    ids: Vec<u64>,
}

impl LoraSet {
    /// The adapters the running sequences use, under `max` (`None`: no limit).
    pub(super) fn new(max: Option<usize>, running: &[Sequence]) -> Self {
        let mut set = LoraSet {
            max,
            ids: Vec::new(),
        };
        for seq in running {
            set.add(seq.lora_id());
        }
        set
    }

    /// Whether a sequence with adapter `id` may join: it has none, its adapter is in the
    /// batch already, or there is room for one more.
    pub(super) fn admits(&self, id: Option<u64>) -> bool {
        match (id, self.max) {
            (None, _) | (_, None) => true,
            (Some(n), Some(max)) => self.ids.contains(&n) || self.ids.len() < max,
        }
    }

    pub(super) fn add(&mut self, id: Option<u64>) {
        if let Some(n) = id {
            if !self.ids.contains(&n) {
                self.ids.push(n);
            }
        }
    }
}

impl Engine {
    /// Gives `seq` its adapter's factors as it joins the batch: `Ok(false)` when they cannot
    /// be had this step (it waits, as vLLM keeps such a request waiting), an error when its
    /// folder no longer reads as the adapter. With `--max-loras` at most `--max-cpu-loras`,
    /// a sequence the batch admits always finds room once no other read is under way.
    pub(super) fn take_lora_weights(&self, seq: &mut Sequence) -> Result<bool> {
        let (Some(lora), None) = (&seq.lora, &seq.weights) else {
            return Ok(true);
        };
        let registry: &LoraRegistry = self.cfg.lora.as_deref().ok_or_else(|| {
            EngineError::Internal(format!(
                "sequence with LoRA adapter '{}' on a decoder without adapters",
                lora.name
            ))
        })?;
        match registry.acquire(lora) {
            Acquired::Ready(w) => {
                seq.weights = Some(w);
                Ok(true)
            }
            Acquired::Busy => Ok(false),
            Acquired::Failed(e) => Err(e.into()),
        }
    }
}

/// The distinct adapter names of `seqs`, sorted and comma-joined (`vllm:lora_requests_info`'s
/// label values).
pub(super) fn joined_names<'a>(seqs: impl Iterator<Item = &'a Sequence>) -> String {
    let mut names: Vec<&str> = seqs.filter_map(Sequence::lora_name).collect();
    names.sort_unstable();
    names.dedup();
    names.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_batch_admits_only_its_own_adapters_and_the_base() {
        let mut set = LoraSet::new(Some(1), &[]);
        assert!(set.admits(Some(1)));
        set.add(Some(1));
        assert!(set.admits(Some(1)), "already in the batch");
        assert!(!set.admits(Some(2)), "one too many");
        assert!(set.admits(None), "the base always joins");
        let mut two = LoraSet::new(Some(2), &[]);
        two.add(Some(1));
        two.add(Some(1));
        assert!(two.admits(Some(2)), "a repeated adapter counts once");
        let open = LoraSet::new(None, &[]);
        assert!(open.admits(Some(9)));
    }
}
