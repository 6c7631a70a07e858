//! Qwen2-VL: the Qwen2 decoder with M-RoPE (`rope_scaling.mrope_section`) and the vision
//! tower of [`crate::models::qwen2_vl`].

use super::qwen::QWEN_RULES;
use super::{Build, Family};
use crate::models::media::MediaEncoders;

pub static QWEN2_VL: Family = Family {
    name: "Qwen2-VL",
    hf_architectures: &["Qwen2VLForConditionalGeneration"],
    gguf_architectures: &[],
    build: Build::Decoder {
        rules: &QWEN_RULES,
        media: Some(MediaEncoders::qwen2_vl),
    },
};
