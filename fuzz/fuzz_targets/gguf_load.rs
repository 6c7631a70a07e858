//! A GGUF decoder from arbitrary bytes, through the path `gateway serve` takes for a file
//! (header, metadata, tensor table, tokenizer, model): no panic, and a model that loads has an
//! embedding row for every id its tokenizer gives. Seeds: `seeds/gguf_load`, from
//! `scripts/make_gguf_corpus.py`; `engine/tests/gguf_corpus.rs` runs them in every test run.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(loaded) = engine::load::gguf_decoder_from_bytes("fuzz.gguf", data) else {
        return;
    };
    let vocab = loaded.model.info().vocab_size;
    if let Ok(enc) = loaded.tokenizer.encode("Hello, ab a 12!", true) {
        assert!(enc.get_ids().iter().all(|&id| (id as usize) < vocab));
        let _ = loaded.tokenizer.decode(enc.get_ids(), true);
    }
});
