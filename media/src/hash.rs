//! Content hashes of media, for prefix caching (`("mm", hash, offset)` keys) and uuid caching.

use sha2::{Digest, Sha256};

/// SHA-256 over a media item's bytes and the processing options that shape its tensor.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// Hashes `parts` in order, each prefixed by its length so that part boundaries count.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> ContentHash {
        let mut h = Sha256::new();
        for part in parts {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        ContentHash(h.finalize().into())
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContentHash({})", &self.to_hex()[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_count() {
        let a = ContentHash::of_parts([b"ab".as_slice(), b"c".as_slice()]);
        let b = ContentHash::of_parts([b"a".as_slice(), b"bc".as_slice()]);
        assert_ne!(a, b);
        assert_eq!(
            a,
            ContentHash::of_parts([b"ab".as_slice(), b"c".as_slice()])
        );
        assert_eq!(a.to_hex().len(), 64);
    }
}
