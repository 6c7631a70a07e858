//! How a batch is cut into chunks that run side by side, one forward pass each.

/// Most tokens run through the layers at once; larger batches are split (by sequence).
pub(super) const CHUNK_TOKENS: usize = 2048;
/// Fewest tokens per chunk worth a forward pass of its own on one thread.
const MIN_CHUNK_TOKENS: usize = 96;

/// Splits sequences (lengths sorted longest first) into consecutive chunks of at most
/// [`CHUNK_TOKENS`] tokens each (a single longer sequence is a chunk of its own). When the
/// batch is big enough, it makes at least one chunk per thread (a multiple of `threads`), so
/// that each thread runs whole forward passes of its own, and it cuts where the running token
/// count comes closest to an even share.
pub(super) fn plan_chunks(lens: &[usize], threads: usize) -> Vec<std::ops::Range<usize>> {
    if lens.is_empty() {
        return Vec::new();
    }
    let total: usize = lens.iter().sum();
    let parallel = threads.min(total / MIN_CHUNK_TOKENS).min(lens.len()).max(1);
    let count = total
        .div_ceil(CHUNK_TOKENS)
        .max(1)
        .next_multiple_of(parallel)
        .min(lens.len());
    let mut chunks = Vec::with_capacity(count);
    let (mut start, mut done, mut in_chunk) = (0, 0, 0);
    for (i, &len) in lens.iter().enumerate() {
        if i > start {
            // The running total at which the current chunk would end with an even share.
            let goal = total * (chunks.len() + 1) / count;
            let before = goal.abs_diff(done);
            let after = goal.abs_diff(done + len);
            if in_chunk + len > CHUNK_TOKENS || (before < after && chunks.len() + 1 < count) {
                chunks.push(start..i);
                start = i;
                in_chunk = 0;
            }
        }
        done += len;
        in_chunk += len;
    }
    chunks.push(start..lens.len());
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(lens: &[usize], chunks: &[std::ops::Range<usize>]) -> Vec<usize> {
        chunks
            .iter()
            .map(|r| lens[r.clone()].iter().sum())
            .collect()
    }

    #[test]
    fn chunks_cover_every_sequence_once_in_order() {
        for (lens, threads) in [
            (vec![256; 64], 2),
            (vec![15; 32], 2),
            (vec![15; 32], 8),
            (vec![300, 200, 100, 5, 5, 5, 1], 3),
            (vec![7], 4),
            ((1..200).rev().collect::<Vec<_>>(), 2),
        ] {
            let chunks = plan_chunks(&lens, threads);
            let mut next = 0;
            for r in &chunks {
                assert_eq!(r.start, next, "{lens:?}");
                assert!(r.end > r.start, "{lens:?}");
                next = r.end;
            }
            assert_eq!(next, lens.len());
            for (r, t) in chunks.iter().zip(tokens(&lens, &chunks)) {
                assert!(t <= CHUNK_TOKENS || r.len() == 1, "{lens:?}: {t} tokens");
            }
        }
        assert!(plan_chunks(&[], 2).is_empty());
    }

    #[test]
    fn big_batches_give_each_thread_an_even_share() {
        // The long benchmark batch: 32 sequences of about 204 tokens -> 4 chunks on 2 threads.
        let lens = vec![204; 32];
        let chunks = plan_chunks(&lens, 2);
        assert_eq!(tokens(&lens, &chunks), vec![1632; 4]);
        // 32 short sentences: one chunk per thread, even.
        let lens = vec![15; 32];
        assert_eq!(tokens(&lens, &plan_chunks(&lens, 2)), vec![240, 240]);
        // Sorted, uneven lengths: shares within one sequence of even.
        let lens: Vec<usize> = (10..90).rev().collect();
        let chunks = plan_chunks(&lens, 4);
        assert_eq!(chunks.len(), 4);
        let even = lens.iter().sum::<usize>() / 4;
        for t in tokens(&lens, &chunks) {
            assert!(t.abs_diff(even) <= 90, "{t} vs {even}");
        }
    }

    #[test]
    fn small_batches_stay_one_chunk() {
        // Too few tokens to split: one chunk, parallel inside the layers instead.
        assert_eq!(plan_chunks(&[40, 30, 20], 2), vec![0..3]);
        assert_eq!(plan_chunks(&[256], 8), vec![0..1]);
        // A chunk never passes CHUNK_TOKENS, whatever the thread count.
        let lens = vec![256; 64];
        let chunks = plan_chunks(&lens, 1);
        assert_eq!(chunks.len(), 8);
        assert!(tokens(&lens, &chunks).iter().all(|&t| t == 2048));
    }
}
