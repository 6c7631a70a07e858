//! What a model's weights take where they are held, by stored type: logged once per model at
//! start-up, so a file whose quantisation mix is not what its name says shows it.

use std::collections::BTreeMap;
use std::fmt;

/// Bytes of weights a model holds, per stored type (as llama.cpp names them: `Q4_K`, `F32`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightSummary {
    bytes: BTreeMap<String, u64>,
    interleaved: u64,
    released: u64,
}

impl WeightSummary {
    /// Count `bytes` more of type `ty`.
    pub fn add(&mut self, ty: impl fmt::Display, bytes: u64) {
        *self.bytes.entry(ty.to_string()).or_default() += bytes;
    }

    /// Bytes of type `ty` (0 for a type the model does not hold).
    pub fn bytes_of(&self, ty: &str) -> u64 {
        self.bytes.get(ty).copied().unwrap_or(0)
    }

    /// Of the bytes held, how many the CPU kernels' interleaved layout holds (a copy made at
    /// load in place of the file's pages: the same size).
    pub fn set_interleaved(&mut self, bytes: u64) {
        self.interleaved = bytes;
    }

    /// See [`WeightSummary::set_interleaved`].
    pub fn interleaved(&self) -> u64 {
        self.interleaved
    }

    /// Of the weight files' bytes, how many the load released from the resident set (the
    /// file's pages of the matrices it copied): the memory bound counts the copy instead.
    pub fn set_released(&mut self, bytes: u64) {
        self.released = bytes;
    }

    /// See [`WeightSummary::set_released`].
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Every weight byte held.
    pub fn total(&self) -> u64 {
        self.bytes.values().sum()
    }

    /// (type, bytes), the largest share first.
    pub fn by_size(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.bytes.iter().map(|(t, &b)| (t.as_str(), b)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v
    }
}

/// `bytes` in the largest binary unit that keeps a leading digit (`512 B`, `8.1 MiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `Q5_0 36.0 MiB (52%), Q8_0 21.4 MiB (31%), ...`: each type's bytes and share of the total.
impl fmt::Display for WeightSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total().max(1) as f64;
        for (i, (ty, bytes)) in self.by_size().into_iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let share = 100.0 * bytes as f64 / total;
            write!(f, "{ty} {} ({share:.0}%)", human_bytes(bytes))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_listed_largest_first_with_their_share() {
        let mut s = WeightSummary::default();
        s.add("Q6_K", 3 << 20);
        s.add("Q4_K", 5 << 20);
        s.add("F32", 2048);
        s.add("Q4_K", 2 << 20);
        assert_eq!(s.total(), (10 << 20) + 2048);
        assert_eq!(s.bytes_of("Q4_K"), 7 << 20);
        assert_eq!(s.bytes_of("Q8_0"), 0);
        assert_eq!(
            s.to_string(),
            "Q4_K 7.0 MiB (70%), Q6_K 3.0 MiB (30%), F32 2.0 KiB (0%)"
        );
    }

    #[test]
    fn sizes_take_the_largest_unit_with_a_leading_digit() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(8_493_466), "8.1 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
