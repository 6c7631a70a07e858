//! Qwen2-Audio: the Qwen2 decoder and the Whisper-shaped audio tower of
//! [`crate::models::qwen2_audio`].

use super::qwen::QWEN_RULES;
use super::{Build, Family};
use crate::models::media::MediaEncoders;

pub static QWEN2_AUDIO: Family = Family {
    name: "Qwen2-Audio",
    hf_architectures: &["Qwen2AudioForConditionalGeneration"],
    gguf_architectures: &[],
    build: Build::Decoder {
        rules: &QWEN_RULES,
        media: Some(MediaEncoders::qwen2_audio),
    },
};
