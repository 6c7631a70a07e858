//! The GGUF reader on hand-made files: parsing, every truncation, corrupt lengths, tensor
//! types.

use super::*;

fn push_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// A tiny GGUF with one metadata entry and one 2x32 F32 tensor.
fn tiny_gguf() -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(GGUF_MAGIC);
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    push_str(&mut b, "general.architecture");
    b.extend_from_slice(&8u32.to_le_bytes());
    push_str(&mut b, "llama");
    push_str(&mut b, "list");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&5u32.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&7i32.to_le_bytes());
    b.extend_from_slice(&(-1i32).to_le_bytes());
    push_str(&mut b, "w");
    b.extend_from_slice(&2u32.to_le_bytes());
    b.extend_from_slice(&32u64.to_le_bytes());
    b.extend_from_slice(&2u64.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    while b.len() % 32 != 0 {
        b.push(0);
    }
    for i in 0..64 {
        b.extend_from_slice(&(i as f32).to_le_bytes());
    }
    b
}

fn parse_bytes(bytes: &[u8]) -> Result<GgufFile> {
    GgufFile::from_bytes("mem", bytes)
}

#[test]
fn parses_tiny_file() {
    let g = parse_bytes(&tiny_gguf()).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), Some("llama"));
    let list = g.get_array("list").unwrap().unwrap();
    assert_eq!(list, &[MetaValue::I32(7), MetaValue::I32(-1)]);
    let t = g.tensor("w").unwrap();
    assert_eq!(t.dims, vec![32, 2]);
    let data = g.tensor_data(t);
    assert_eq!(data.len(), 256);
    assert_eq!(f32::from_le_bytes(data[4..8].try_into().unwrap()), 1.0);
}

#[test]
fn every_truncation_is_a_load_error() {
    let full = tiny_gguf();
    for cut in 0..full.len() {
        match parse_bytes(&full[..cut]) {
            Err(EngineError::Load { .. }) => {}
            other => panic!("cut at {cut}: expected a load error, got {other:?}"),
        }
    }
}

/// [`tiny_gguf`] with its tensor `w` (2 rows) given type `ty` and row length `cols`, and
/// `data` as its bytes.
fn gguf_with_tensor(ty: u32, cols: u64, data: &[u8]) -> Vec<u8> {
    let mut b = tiny_gguf();
    let info = b
        .windows(9)
        .position(|w| w == b"\x01\0\0\0\0\0\0\0w")
        .expect("tensor info")
        + 9;
    // n_dims, dims[0], dims[1], type, offset
    b[info + 4..info + 12].copy_from_slice(&cols.to_le_bytes());
    b[info + 20..info + 24].copy_from_slice(&ty.to_le_bytes());
    let data_start = b.len() - 256;
    b.truncate(data_start);
    b.extend_from_slice(data);
    b
}

#[test]
fn computable_types_match_ggml_block_layouts() {
    let mut mapped = Vec::new();
    for id in 0..64 {
        let t = GgmlType(id);
        if let Some(dtype) = t.dtype() {
            let (block, bytes) = t.block_layout().expect("a mapped type has a layout");
            assert_eq!(block, dtype.block_elems() as u64, "{t}");
            assert_eq!(bytes, dtype.block_bytes() as u64, "{t}");
            assert_eq!(t.name(), dtype.name());
            mapped.push(dtype);
        }
    }
    // Every kernel type is reachable from some GGUF type id.
    for dtype in DType::ALL {
        assert!(mapped.contains(&dtype), "{dtype} has no GGUF type id");
    }
    let names = GgmlType::supported_names();
    for want in ["Q4_K", "Q6_K", "IQ4_XS", "Q5_0", "BF16"] {
        assert!(names.contains(want), "{names}");
    }
}

#[test]
fn k_quant_tensors_parse_and_are_checked() {
    // Q4_K (id 12): 2 rows of 256 weights, 144 bytes each.
    let g = parse_bytes(&gguf_with_tensor(12, 256, &[0u8; 288])).unwrap();
    let t = g.tensor("w").unwrap();
    assert_eq!(t.ggml_type.dtype(), Some(DType::Q4_K));
    assert_eq!(g.tensor_data(t).len(), 288);
    // A row that is not a whole number of super-blocks.
    let e = parse_bytes(&gguf_with_tensor(12, 128, &[0u8; 288])).unwrap_err();
    assert!(e.to_string().contains("block size 256"), "{e}");
    // Data past the end of the file.
    let e = parse_bytes(&gguf_with_tensor(14, 512, &[0u8; 300])).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
}

#[test]
fn unknown_and_uncomputable_types_are_named() {
    let e = parse_bytes(&gguf_with_tensor(99, 32, &[0u8; 256])).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("'w'") && msg.contains("unknown GGML type 99"),
        "{msg}"
    );
    // IQ2_XXS (id 16) has a known layout but no kernel: the file parses, and the type
    // maps to no compute type (the model loader refuses it by name).
    let g = parse_bytes(&gguf_with_tensor(16, 256, &[0u8; 132])).unwrap();
    let t = g.tensor("w").unwrap();
    assert_eq!(t.ggml_type.name(), "IQ2_XXS");
    assert_eq!(t.ggml_type.dtype(), None);
}

#[test]
fn corrupt_lengths_are_load_errors() {
    let mut b = tiny_gguf();
    // The first key's length field: absurdly large.
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(parse_bytes(&b), Err(EngineError::Load { .. })));
    let mut b = tiny_gguf();
    b[0] = b'X';
    assert!(matches!(parse_bytes(&b), Err(EngineError::Load { .. })));
}
