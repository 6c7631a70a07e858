//! Paged KV block allocation with prefix caching.
//!
//! The KV cache is split into fixed-size blocks. A sequence owns a block table (a list of block
//! ids); blocks are reference counted so that sequences sharing a prompt prefix share the blocks
//! that hold it. A block whose every slot has been computed can be *registered* under its
//! content hash; when its last user frees it, it stays in the cache (free but reusable) until an
//! allocation needs the space, at which point the least recently freed cached block is evicted.
//!
//! Block hashes chain: `hash(parent hash, block token ids, extra keys)`, where the extra keys are
//! tagged by source in this order (CONTRACT section 7): `("lora", name, path)`, then
//! `("mm", media hash, offset)` for each media item overlapping the block (offset relative to the
//! block start, negative when the item began in an earlier block), then `("cache_salt", salt)` on
//! the first block only. Everything is fed to SHA-256 in a length-prefixed encoding, so no two
//! different key lists encode to the same bytes.

use std::collections::{BTreeMap, HashMap, VecDeque};

use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};

/// Index of a block in the KV cache.
pub type BlockId = u32;

/// The content hash of a full block (SHA-256 over the parent hash, tokens and extra keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

/// One extra key mixed into a block hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtraKey {
    Lora { name: String, path: String },
    Media { hash: String, offset: i64 },
    CacheSalt(String),
}

/// A media item placed in a sequence's token stream (for `("mm", ...)` keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaSpan {
    /// Content hash of the item (as the preprocessor computes it).
    pub hash: String,
    /// Position of the item's first placeholder token in the sequence.
    pub start: usize,
    /// Number of placeholder tokens the item occupies.
    pub len: usize,
}

/// What, besides the tokens, distinguishes cached blocks of one sequence from another's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HashContext {
    /// `(name, path)` of the LoRA adapter the sequence runs with.
    pub lora: Option<(String, String)>,
    pub media: Vec<MediaSpan>,
    pub cache_salt: Option<String>,
}

impl HashContext {
    /// The extra keys of block number `index` (covering positions
    /// `index * block_size .. (index + 1) * block_size`), in contract order.
    pub fn extra_keys(&self, index: usize, block_size: usize) -> Vec<ExtraKey> {
        let mut keys = Vec::new();
        if let Some((name, path)) = &self.lora {
            keys.push(ExtraKey::Lora {
                name: name.clone(),
                path: path.clone(),
            });
        }
        let block_start = index * block_size;
        let block_end = block_start + block_size;
        for item in &self.media {
            let item_end = item.start + item.len;
            if item.len > 0 && item.start < block_end && item_end > block_start {
                keys.push(ExtraKey::Media {
                    hash: item.hash.clone(),
                    offset: item.start as i64 - block_start as i64,
                });
            }
        }
        if index == 0 {
            if let Some(salt) = &self.cache_salt {
                keys.push(ExtraKey::CacheSalt(salt.clone()));
            }
        }
        keys
    }
}

fn put_bytes(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// Hash one block. `parent` is the previous block's hash (`None` for the first block).
pub fn block_hash(parent: Option<&BlockHash>, tokens: &[u32], extra: &[ExtraKey]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(b"kvblock/v1");
    match parent {
        Some(p) => {
            h.update([1u8]);
            h.update(p.0);
        }
        None => h.update([0u8]),
    }
    h.update((tokens.len() as u64).to_le_bytes());
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.update((extra.len() as u64).to_le_bytes());
    for key in extra {
        match key {
            ExtraKey::Lora { name, path } => {
                put_bytes(&mut h, b"lora");
                put_bytes(&mut h, name.as_bytes());
                put_bytes(&mut h, path.as_bytes());
            }
            ExtraKey::Media { hash, offset } => {
                put_bytes(&mut h, b"mm");
                put_bytes(&mut h, hash.as_bytes());
                h.update(offset.to_le_bytes());
            }
            ExtraKey::CacheSalt(salt) => {
                put_bytes(&mut h, b"cache_salt");
                put_bytes(&mut h, salt.as_bytes());
            }
        }
    }
    BlockHash(h.finalize().into())
}

/// Extend `hashes` (the chain of a sequence's full blocks so far) to cover every full block of
/// `tokens`.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    ctx: &HashContext,
) {
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let chunk = &tokens[i * block_size..(i + 1) * block_size];
        let extra = ctx.extra_keys(i, block_size);
        let h = block_hash(hashes.last(), chunk, &extra);
        hashes.push(h);
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    ref_count: u32,
    /// Set once the block is registered in the prefix cache.
    hash: Option<BlockHash>,
    /// Eviction order key while the block sits free in the cache.
    evict_tick: u64,
}

/// Counts for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockStats {
    pub num_blocks: usize,
    /// Blocks referenced by at least one sequence.
    pub used: usize,
    /// Blocks free and holding nothing reusable.
    pub free_uncached: usize,
    /// Blocks free but still holding a cached prefix (evictable).
    pub free_cached: usize,
}

/// Allocator of KV cache blocks with reference counts and a prefix cache.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    blocks: Vec<Block>,
    /// Free blocks with no cached content, reused first.
    free: VecDeque<BlockId>,
    /// Free blocks with cached content, by eviction tick (oldest first).
    evictable: BTreeMap<u64, BlockId>,
    /// Registered hashes.
    cached: HashMap<BlockHash, BlockId>,
    tick: u64,
    caching: bool,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, enable_prefix_caching: bool) -> Result<Self> {
        if block_size == 0 || num_blocks == 0 {
            return Err(EngineError::Internal(format!(
                "KV cache needs at least one block of at least one slot (got {num_blocks} blocks of {block_size})"
            )));
        }
        if u32::try_from(num_blocks).is_err() {
            return Err(EngineError::Internal(format!(
                "too many KV blocks: {num_blocks}"
            )));
        }
        Ok(BlockManager {
            block_size,
            blocks: vec![Block::default(); num_blocks],
            free: (0..num_blocks as u32).collect(),
            evictable: BTreeMap::new(),
            cached: HashMap::new(),
            tick: 0,
            caching: enable_prefix_caching,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn caching_enabled(&self) -> bool {
        self.caching
    }

    /// Blocks an allocation can obtain now (uncached free plus evictable cached).
    pub fn num_free(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    pub fn num_used(&self) -> usize {
        self.blocks.len() - self.num_free()
    }

    /// Fraction of blocks in use by sequences, 0..1.
    pub fn usage(&self) -> f64 {
        self.num_used() as f64 / self.blocks.len() as f64
    }

    pub fn stats(&self) -> BlockStats {
        BlockStats {
            num_blocks: self.blocks.len(),
            used: self.num_used(),
            free_uncached: self.free.len(),
            free_cached: self.evictable.len(),
        }
    }

    /// Blocks needed to hold `tokens` slots.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    pub fn ref_count(&self, block: BlockId) -> u32 {
        self.blocks.get(block as usize).map_or(0, |b| b.ref_count)
    }

    /// Number of leading hashes of `hashes` present in the cache (no references taken).
    pub fn cached_prefix_len(&self, hashes: &[BlockHash]) -> usize {
        if !self.caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Take a reference on the cached blocks holding the longest cached prefix of `hashes`,
    /// returning their ids in order.
    pub fn acquire_cached(&mut self, hashes: &[BlockHash]) -> Vec<BlockId> {
        let mut out = Vec::new();
        if !self.caching {
            return out;
        }
        for h in hashes {
            let Some(&id) = self.cached.get(h) else { break };
            let block = &mut self.blocks[id as usize];
            if block.ref_count == 0 {
                self.evictable.remove(&block.evict_tick);
            }
            block.ref_count += 1;
            out.push(id);
        }
        out
    }

    /// Allocate one block (reference count 1). Evicts the least recently freed cached block when
    /// no uncached block is free. `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = match self.free.pop_front() {
            Some(id) => id,
            None => {
                let (_, id) = self.evictable.pop_first()?;
                let block = &mut self.blocks[id as usize];
                if let Some(h) = block.hash.take() {
                    if self.cached.get(&h) == Some(&id) {
                        self.cached.remove(&h);
                    }
                }
                id
            }
        };
        let block = &mut self.blocks[id as usize];
        debug_assert_eq!(block.ref_count, 0);
        block.ref_count = 1;
        block.hash = None;
        Some(id)
    }

    /// Allocate `n` blocks or none.
    pub fn allocate_n(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if self.num_free() < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.allocate()?);
        }
        Some(out)
    }

    /// Record that `block` (fully computed) holds the content with hash `hash`. If another block
    /// already holds that content, the cache keeps the existing one and this block stays private.
    pub fn register(&mut self, block: BlockId, hash: BlockHash) {
        if !self.caching {
            return;
        }
        let Some(b) = self.blocks.get(block as usize) else {
            return;
        };
        if b.hash.is_some() || b.ref_count == 0 {
            return;
        }
        if self.cached.contains_key(&hash) {
            return;
        }
        self.cached.insert(hash, block);
        self.blocks[block as usize].hash = Some(hash);
    }

    /// Drop one reference on `block`.
    pub fn free(&mut self, block: BlockId) {
        let Some(b) = self.blocks.get_mut(block as usize) else {
            return;
        };
        if b.ref_count == 0 {
            tracing::error!(block, "double free of a KV block");
            return;
        }
        b.ref_count -= 1;
        if b.ref_count > 0 {
            return;
        }
        if b.hash.is_some() {
            self.tick += 1;
            b.evict_tick = self.tick;
            self.evictable.insert(self.tick, block);
        } else {
            self.free.push_back(block);
        }
    }

    /// Free a sequence's block table. Blocks are released tail first, so that when the cache
    /// must evict, a prefix's later blocks go before its earlier ones.
    pub fn free_table(&mut self, table: &[BlockId]) {
        for &b in table.iter().rev() {
            self.free(b);
        }
    }

    /// Check the allocator's bookkeeping (for tests).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut seen = vec![false; self.blocks.len()];
        for &id in self.free.iter().chain(self.evictable.values()) {
            let i = id as usize;
            if seen[i] {
                return Err(format!("block {id} is on a free list twice"));
            }
            seen[i] = true;
            if self.blocks[i].ref_count != 0 {
                return Err(format!(
                    "free block {id} has ref count {}",
                    self.blocks[i].ref_count
                ));
            }
        }
        for &id in &self.free {
            if self.blocks[id as usize].hash.is_some() {
                return Err(format!("uncached free block {id} has a hash"));
            }
        }
        for (tick, &id) in &self.evictable {
            let b = &self.blocks[id as usize];
            if b.evict_tick != *tick || b.hash.is_none() {
                return Err(format!("evictable block {id} is inconsistent"));
            }
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.ref_count == 0 && !seen[i] {
                return Err(format!("block {i} is unreferenced but not free"));
            }
            if let Some(h) = b.hash {
                if self.cached.get(&h) != Some(&(i as u32)) {
                    return Err(format!("block {i} has a hash the cache does not map to it"));
                }
            }
        }
        for (h, &id) in &self.cached {
            if self.blocks[id as usize].hash != Some(*h) {
                return Err(format!(
                    "cache maps a hash to block {id} which holds another"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const BS: usize = 4;

    fn hashes(tokens: &[u32], ctx: &HashContext) -> Vec<BlockHash> {
        let mut h = Vec::new();
        extend_block_hashes(&mut h, tokens, BS, ctx);
        h
    }

    fn salted(salt: &str) -> HashContext {
        HashContext {
            cache_salt: Some(salt.to_string()),
            ..Default::default()
        }
    }

    fn lora(name: &str, path: &str) -> HashContext {
        HashContext {
            lora: Some((name.to_string(), path.to_string())),
            ..Default::default()
        }
    }

    #[test]
    fn salt_equal_to_lora_name_does_not_collide() {
        let tokens = [1, 2, 3, 4];
        let a = block_hash(None, &tokens, &[ExtraKey::CacheSalt("x".into())]);
        let b = block_hash(
            None,
            &tokens,
            &[ExtraKey::Lora {
                name: "x".into(),
                path: String::new(),
            }],
        );
        assert_ne!(a, b);
        // Same through the context path.
        assert_ne!(
            hashes(&tokens, &salted("x")),
            hashes(&tokens, &lora("x", ""))
        );
        // Field boundaries are unambiguous.
        let c = block_hash(
            None,
            &tokens,
            &[ExtraKey::Lora {
                name: "ab".into(),
                path: "c".into(),
            }],
        );
        let d = block_hash(
            None,
            &tokens,
            &[ExtraKey::Lora {
                name: "a".into(),
                path: "bc".into(),
            }],
        );
        assert_ne!(c, d);
    }

    #[test]
    fn lora_path_change_gives_new_hashes() {
        let tokens: Vec<u32> = (0..8).collect();
        let old = hashes(&tokens, &lora("ad", "/a/v1"));
        let new = hashes(&tokens, &lora("ad", "/a/v2"));
        assert_eq!(old.len(), 2);
        assert_ne!(old[0], new[0]);
        assert_ne!(old[1], new[1]);
        let mut bm = BlockManager::new(8, BS, true).unwrap();
        let blocks = bm.allocate_n(2).unwrap();
        for (b, h) in blocks.iter().zip(&old) {
            bm.register(*b, *h);
        }
        bm.free_table(&blocks);
        assert_eq!(bm.cached_prefix_len(&old), 2);
        assert_eq!(bm.cached_prefix_len(&new), 0);
        assert!(bm.acquire_cached(&new).is_empty());
    }

    #[test]
    fn media_offsets_including_negative() {
        let ctx = HashContext {
            media: vec![MediaSpan {
                hash: "img".into(),
                start: 2,
                len: 7,
            }],
            ..Default::default()
        };
        // Item covers positions 2..9: blocks 0 (offset 2), 1 (offset -2), 2 (offset -6).
        assert_eq!(
            ctx.extra_keys(0, BS),
            vec![ExtraKey::Media {
                hash: "img".into(),
                offset: 2
            }]
        );
        assert_eq!(
            ctx.extra_keys(1, BS),
            vec![ExtraKey::Media {
                hash: "img".into(),
                offset: -2
            }]
        );
        assert_eq!(
            ctx.extra_keys(2, BS),
            vec![ExtraKey::Media {
                hash: "img".into(),
                offset: -6
            }]
        );
        assert!(ctx.extra_keys(3, BS).is_empty());
        // Same tokens, item at a different place: different hashes from the first block.
        let moved = HashContext {
            media: vec![MediaSpan {
                hash: "img".into(),
                start: 3,
                len: 7,
            }],
            ..Default::default()
        };
        let tokens: Vec<u32> = (0..12).collect();
        let a = hashes(&tokens, &ctx);
        let b = hashes(&tokens, &moved);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        // A different image at the same place also changes the hashes.
        let other = HashContext {
            media: vec![MediaSpan {
                hash: "img2".into(),
                start: 2,
                len: 7,
            }],
            ..Default::default()
        };
        assert_ne!(hashes(&tokens, &other)[1], a[1]);
    }

    #[test]
    fn keys_come_in_contract_order() {
        let ctx = HashContext {
            lora: Some(("l".into(), "/p".into())),
            media: vec![MediaSpan {
                hash: "m".into(),
                start: 0,
                len: 1,
            }],
            cache_salt: Some("s".into()),
        };
        let keys = ctx.extra_keys(0, BS);
        assert!(matches!(keys[0], ExtraKey::Lora { .. }));
        assert!(matches!(keys[1], ExtraKey::Media { .. }));
        assert!(matches!(keys[2], ExtraKey::CacheSalt(_)));
    }

    #[test]
    fn salt_only_on_first_block() {
        let ctx = salted("tenant");
        assert_eq!(
            ctx.extra_keys(0, BS),
            vec![ExtraKey::CacheSalt("tenant".into())]
        );
        assert!(ctx.extra_keys(1, BS).is_empty());
        assert!(ctx.extra_keys(5, BS).is_empty());
        // The salt still reaches later blocks through the parent chain.
        let tokens: Vec<u32> = (0..8).collect();
        let a = hashes(&tokens, &salted("a"));
        let b = hashes(&tokens, &salted("b"));
        assert_ne!(a[1], b[1]);
        // Block 1's hash is exactly hash(parent, tokens, no extra keys).
        assert_eq!(a[1], block_hash(Some(&a[0]), &tokens[4..8], &[]));
    }

    #[test]
    fn same_prefix_reuses_blocks_and_different_salt_does_not() {
        let mut bm = BlockManager::new(8, BS, true).unwrap();
        let tokens: Vec<u32> = (10..22).collect();
        let h = hashes(&tokens, &salted("a"));
        let table = bm.allocate_n(3).unwrap();
        for (b, hh) in table.iter().zip(&h) {
            bm.register(*b, *hh);
        }
        // A second sequence with the same prompt shares the blocks while the first runs.
        let shared = bm.acquire_cached(&h);
        assert_eq!(shared, table);
        assert!(table.iter().all(|&b| bm.ref_count(b) == 2));
        bm.free_table(&shared);
        bm.free_table(&table);
        assert_eq!(bm.num_used(), 0);
        assert_eq!(bm.stats().free_cached, 3);
        // Reuse after free.
        assert_eq!(bm.acquire_cached(&h), table);
        bm.free_table(&table);
        // A longer prompt with the same prefix hits the shared part only.
        let longer: Vec<u32> = (10..30).collect();
        assert_eq!(bm.cached_prefix_len(&hashes(&longer, &salted("a"))), 3);
        // Different salt: nothing.
        assert_eq!(bm.cached_prefix_len(&hashes(&tokens, &salted("b"))), 0);
        // No salt: nothing either.
        assert_eq!(
            bm.cached_prefix_len(&hashes(&tokens, &HashContext::default())),
            0
        );
        // A different first token changes every later hash.
        let mut changed = tokens.clone();
        changed[0] = 99;
        assert_eq!(bm.cached_prefix_len(&hashes(&changed, &salted("a"))), 0);
        bm.check_invariants().unwrap();
    }

    #[test]
    fn caching_disabled_never_hits() {
        let mut bm = BlockManager::new(4, BS, false).unwrap();
        let h = hashes(&[1, 2, 3, 4], &HashContext::default());
        let b = bm.allocate().unwrap();
        bm.register(b, h[0]);
        bm.free(b);
        assert_eq!(bm.cached_prefix_len(&h), 0);
        assert!(bm.acquire_cached(&h).is_empty());
        assert_eq!(bm.stats().free_uncached, 4);
        bm.check_invariants().unwrap();
    }

    #[test]
    fn alloc_free_refcount_invariants() {
        let mut bm = BlockManager::new(4, BS, true).unwrap();
        let all = bm.allocate_n(4).unwrap();
        assert_eq!(bm.num_free(), 0);
        assert!(bm.allocate().is_none());
        assert!(bm.allocate_n(1).is_none());
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4);
        bm.check_invariants().unwrap();
        bm.free(all[0]);
        assert_eq!(bm.num_free(), 1);
        // Double free is refused, not corrupting.
        bm.free(all[0]);
        assert_eq!(bm.num_free(), 1);
        bm.check_invariants().unwrap();
        let again = bm.allocate().unwrap();
        assert_eq!(again, all[0]);
        assert_eq!(bm.ref_count(again), 1);
        bm.free_table(&all);
        assert_eq!(bm.num_free(), 4);
        assert_eq!(bm.usage(), 0.0);
        bm.check_invariants().unwrap();
        assert!(BlockManager::new(0, BS, true).is_err());
        assert!(BlockManager::new(4, 0, true).is_err());
    }

    #[test]
    fn eviction_is_lru_and_prefers_uncached_blocks() {
        let mut bm = BlockManager::new(4, BS, true).unwrap();
        let a = hashes(&[1, 1, 1, 1, 2, 2, 2, 2], &HashContext::default());
        let b = hashes(&[3, 3, 3, 3], &HashContext::default());
        let ta = bm.allocate_n(2).unwrap();
        bm.register(ta[0], a[0]);
        bm.register(ta[1], a[1]);
        let tb = bm.allocate_n(1).unwrap();
        bm.register(tb[0], b[0]);
        bm.free_table(&ta);
        bm.free_table(&tb);
        // One uncached block is left and is used first.
        let x = bm.allocate().unwrap();
        assert_eq!(bm.cached_prefix_len(&a), 2);
        assert_eq!(bm.cached_prefix_len(&b), 1);
        // Next: the oldest freed cached block, which is the tail of `a` (freed tail first).
        let y = bm.allocate().unwrap();
        assert_eq!(y, ta[1]);
        assert_eq!(bm.cached_prefix_len(&a), 1);
        let z = bm.allocate().unwrap();
        assert_eq!(z, ta[0]);
        assert_eq!(bm.cached_prefix_len(&a), 0);
        assert_eq!(bm.cached_prefix_len(&b), 1);
        bm.check_invariants().unwrap();
        bm.free_table(&[x, y, z]);
        bm.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_registration_keeps_first_block() {
        let mut bm = BlockManager::new(4, BS, true).unwrap();
        let h = hashes(&[5, 5, 5, 5], &HashContext::default());
        let p = bm.allocate().unwrap();
        let q = bm.allocate().unwrap();
        bm.register(p, h[0]);
        bm.register(q, h[0]);
        bm.free(q);
        assert_eq!(bm.stats().free_uncached, 3);
        bm.free(p);
        assert_eq!(bm.stats().free_cached, 1);
        assert_eq!(bm.acquire_cached(&h), vec![p]);
        bm.check_invariants().unwrap();
    }
}
