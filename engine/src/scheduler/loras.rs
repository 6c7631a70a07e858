//! `--max-loras` in the scheduler: the distinct adapters of a step's batch.

use super::Sequence;

/// The adapters of the running batch, and the most it may hold.
pub(super) struct LoraSet {
    max: Option<usize>,
    names: Vec<String>,
}

impl LoraSet {
    /// The adapters the running sequences use, under `max` (`None`: no limit).
    pub(super) fn new(max: Option<usize>, running: &[Sequence]) -> Self {
        let mut set = LoraSet {
            max,
            names: Vec::new(),
        };
        for seq in running {
            set.add(seq.lora_name());
        }
        set
    }

    /// Whether a sequence with adapter `name` may join: it has none, its adapter is in the
    /// batch already, or there is room for one more.
    pub(super) fn admits(&self, name: Option<&str>) -> bool {
        match (name, self.max) {
            (None, _) | (_, None) => true,
            (Some(n), Some(max)) => {
                self.names.iter().any(|have| have == n) || self.names.len() < max
            }
        }
    }

    pub(super) fn add(&mut self, name: Option<&str>) {
        if let Some(n) = name {
            if !self.names.iter().any(|have| have == n) {
                self.names.push(n.to_string());
            }
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
        assert!(set.admits(Some("a")));
        set.add(Some("a"));
        assert!(set.admits(Some("a")), "already in the batch");
        assert!(!set.admits(Some("b")), "one too many");
        assert!(set.admits(None), "the base always joins");
        let mut two = LoraSet::new(Some(2), &[]);
        two.add(Some("a"));
        two.add(Some("a"));
        assert!(two.admits(Some("b")), "a repeated name counts once");
        let open = LoraSet::new(None, &[]);
        assert!(open.admits(Some("z")));
    }
}
