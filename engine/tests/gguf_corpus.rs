//! The GGUF fuzz target's seed corpus (`fuzz/seeds/gguf_load`, from
//! `scripts/make_gguf_corpus.py`) through the target's own entry point,
//! [`engine::load::gguf_decoder_from_bytes`]: the valid file loads and each broken one is a load
//! error that says what is wrong, with no panic and no allocation sized by what the file
//! claims rather than by what it holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

/// Records the largest single allocation the current thread asks for while armed.
struct LargestAlloc;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the allocator also serves thread start-up and tear-down, when the
    // thread-locals may be gone.
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

// SAFETY: every call is forwarded to `System` unchanged; the bookkeeping allocates nothing.
unsafe impl GlobalAlloc for LargestAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// The largest allocation `f` makes on this thread, with its result.
fn largest_alloc_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    (out, LARGEST.with(Cell::get))
}

/// What loading each corpus file must say (every fragment, in the error's text).
const EXPECTED: &[(&str, &[&str])] = &[
    ("empty.gguf", &["magic needs 4 bytes"]),
    ("bad-magic.gguf", &["not a GGUF file"]),
    ("version-1.gguf", &["unsupported GGUF version 1"]),
    ("truncated-header.gguf", &["truncated", "tensor count"]),
    ("truncated-metadata.gguf", &["truncated"]),
    ("truncated-tensor-infos.gguf", &["truncated", "tensor"]),
    (
        "truncated-data.gguf",
        &["past the end", "'blk.0.ffn_down.weight'"],
    ),
    ("tensor-count-absurd.gguf", &["claims", "tensors"]),
    (
        "metadata-count-absurd.gguf",
        &["claims", "metadata entries"],
    ),
    ("string-length-absurd.gguf", &["metadata key #0", "claims"]),
    (
        "array-length-absurd.gguf",
        &["tokenizer.ggml.tokens", "claims"],
    ),
    (
        "array-length-past-end.gguf",
        &["tokenizer.ggml.tokens", "claims"],
    ),
    (
        "metadata-count-past-end.gguf",
        &["claims", "metadata entries"],
    ),
    ("tensor-count-past-end.gguf", &["claims", "tensors"]),
    ("array-nested-deep.gguf", &["'deep'", "nested too deeply"]),
    (
        "value-type-unknown.gguf",
        &["'general.name'", "unknown metadata value type 13"],
    ),
    (
        "bool-invalid.gguf",
        &["add_bos_token", "invalid bool byte 2"],
    ),
    ("key-not-utf8.gguf", &["metadata key #1", "UTF-8"]),
    ("value-not-utf8.gguf", &["'general.name'", "UTF-8"]),
    ("alignment-zero.gguf", &["general.alignment"]),
    ("alignment-not-power-of-two.gguf", &["general.alignment"]),
    ("alignment-absurd.gguf", &["past the end"]),
    (
        "offset-past-end.gguf",
        &["'blk.0.ffn_down.weight'", "past the end"],
    ),
    (
        "offset-overflow.gguf",
        &["'blk.0.ffn_down.weight'", "past the end"],
    ),
    (
        "offset-misaligned.gguf",
        &["'blk.0.attn_q.weight'", "not aligned"],
    ),
    ("dims-overflow.gguf", &["'huge'", "overflow"]),
    ("dims-count-zero.gguf", &["'none'", "dimension count 0"]),
    ("dims-count-five.gguf", &["'five'", "dimension count 5"]),
    ("dims-zero.gguf", &["'blk.0.attn_q.weight'", "[32, 0]"]),
    (
        "row-not-block-multiple.gguf",
        &["'odd_row'", "block size 32"],
    ),
    (
        "size-mismatch.gguf",
        &["'blk.0.attn_q.weight'", "expected [32, 32]"],
    ),
    (
        "type-unknown.gguf",
        &["'blk.0.attn_q.weight'", "unknown GGML type 99"],
    ),
    (
        "type-without-kernel.gguf",
        &["'blk.0.attn_q.weight'", "Q8_1", "not supported"],
    ),
    (
        "norm-quantised.gguf",
        &["'blk.0.attn_norm.weight'", "F32, F16 or BF16"],
    ),
    (
        "duplicate-tensor.gguf",
        &["duplicate tensor 'output_norm.weight'"],
    ),
    (
        "missing-tensor.gguf",
        &["missing tensor 'blk.0.ffn_down.weight'"],
    ),
    ("embedding-one-dim.gguf", &["'token_embd.weight'", "2-D"]),
    (
        "architecture-unknown.gguf",
        &["unsupported architecture 'gptj'"],
    ),
    (
        "architecture-not-string.gguf",
        &["'general.architecture' is not a string"],
    ),
    (
        "hidden-missing.gguf",
        &["missing metadata 'llama.embedding_length'"],
    ),
    ("block-count-absurd.gguf", &["block_count"]),
    ("head-count-zero.gguf", &["non-zero"]),
    ("head-count-absurd.gguf", &["head_count"]),
    ("key-length-absurd.gguf", &["key_length"]),
    (
        "kv-heads-not-divisor.gguf",
        &["not a multiple of 3 KV heads"],
    ),
    ("rope-dimension-odd.gguf", &["invalid rope dimension 15"]),
    ("rope-base-negative.gguf", &["rope.freq_base"]),
    ("rope-base-nan.gguf", &["rope.freq_base"]),
    ("norm-eps-negative.gguf", &["layer_norm_rms_epsilon"]),
    ("context-length-zero.gguf", &["context_length"]),
    (
        "tokenizer-model-unknown.gguf",
        &["unsupported tokenizer.ggml.model 'wordpiece'"],
    ),
    (
        "tokens-missing.gguf",
        &["missing metadata 'tokenizer.ggml.tokens'"],
    ),
    (
        "tokens-not-strings.gguf",
        &["'tokenizer.ggml.tokens'[0] is not a string"],
    ),
    (
        "token-type-count-mismatch.gguf",
        &["token_type has 3 entries for 16 tokens"],
    ),
    (
        "bos-out-of-vocab.gguf",
        &["bos_token_id", "outside the vocabulary"],
    ),
    ("merge-not-pair.gguf", &["merges[0] 'ab' is not a pair"]),
    (
        "vocab-larger-than-embedding.gguf",
        &["18 tokens", "16 rows"],
    ),
];

/// No allocation while loading may exceed this many times the file's size (plus a constant
/// for fixed costs such as the tokenizer's regexes): what the file holds bounds what the
/// loader allocates, whatever its counts and lengths claim.
const ALLOC_PER_FILE_BYTE: usize = 4;
const ALLOC_FIXED: usize = 64 << 10;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/gguf_load");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_loads_or_says_what_is_wrong() {
    let files = corpus();
    for (name, _) in EXPECTED {
        assert!(
            files.iter().any(|(f, _)| f == name),
            "{name} is not in the corpus"
        );
    }
    let mut failures = Vec::new();
    for (name, bytes) in &files {
        let load = || engine::load::gguf_decoder_from_bytes(name, bytes);
        let (loaded, largest) = largest_alloc_of(|| std::panic::catch_unwind(load));
        let Ok(loaded) = loaded else {
            failures.push(format!("{name}: panicked"));
            continue;
        };
        let bound = ALLOC_PER_FILE_BYTE * bytes.len() + ALLOC_FIXED;
        if largest > bound {
            failures.push(format!(
                "{name}: an allocation of {largest} bytes for a file of {}",
                bytes.len()
            ));
        }
        let want = EXPECTED.iter().find(|(f, _)| f == name).map(|(_, w)| *w);
        match (loaded, want) {
            (Ok(_), None) => {}
            (Ok(_), Some(w)) => failures.push(format!("{name}: loaded, expected an error {w:?}")),
            // Files the fuzzer adds after a fix need only fail cleanly.
            (Err(e), None) if name != "valid.gguf" => {
                assert!(e.to_string().contains(name.as_str()), "{e}")
            }
            (Err(e), None) => failures.push(format!("{name}: {e}")),
            (Err(e), Some(w)) => {
                let msg = e.to_string();
                if !msg.contains(name.as_str()) || !w.iter().all(|f| msg.contains(f)) {
                    failures.push(format!("{name}: expected {w:?} in: {msg}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The valid seed loads, its tokenizer stays inside the embedding table, and the model says
/// what it holds: each matrix at its stored size (rows × blocks × block bytes of its type) and
/// the norms as f32.
#[test]
fn the_valid_seed_loads_and_counts_its_weights() {
    let (_, bytes) = corpus()
        .into_iter()
        .find(|(f, _)| f == "valid.gguf")
        .unwrap();
    let loaded = engine::load::gguf_decoder_from_bytes("valid.gguf", &bytes).unwrap();
    let info = loaded.model.info();
    assert_eq!(info.vocab_size, 16);
    assert_eq!(info.n_layers, 1);
    let ids = loaded.tokenizer.encode("ab a", false).unwrap();
    assert!(!ids.get_ids().is_empty());
    assert!(ids
        .get_ids()
        .iter()
        .all(|&id| (id as usize) < info.vocab_size));

    let held = loaded.model.weight_summary();
    let expected = [
        // token_embd (16 rows), attn_q and ffn_up (32 rows each): one 34-byte block a row.
        ("Q8_0", 34 * (16 + 32 + 32)),
        ("F16", 16 * 32 * 2),
        ("Q5_0", 16 * 22),
        ("Q4_0", 32 * 18),
        ("Q4_1", 32 * 20),
        ("IQ4_NL", 32 * 18),
        // output_norm, attn_norm, ffn_norm.
        ("F32", 3 * 32 * 4),
    ];
    for (ty, bytes) in expected {
        assert_eq!(held.bytes_of(ty), bytes, "{ty}");
    }
    assert_eq!(held.total(), expected.iter().map(|e| e.1).sum::<u64>());
    assert!(
        held.to_string()
            .starts_with("Q8_0 2.7 KiB (43%), F16 1.0 KiB (16%), "),
        "{held}"
    );
}
