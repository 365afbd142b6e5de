//! A catalogue of malformed and hostile safetensors files: each must give an
//! error value that names the file and the problem, never a panic, a huge
//! allocation, or a half-loaded model.

use forma::nn::layers::Linear;
use forma::nn::state::file::{from_bytes, to_bytes};
use forma::nn::{CheckpointError, StateDict};
use forma::prelude::*;
use forma::TensorData;
use std::collections::BTreeMap;

/// A file from a raw header and data section.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn good() -> Vec<u8> {
    let mut sd = StateDict::new();
    sd.insert(
        "w",
        TensorData::from_vec(&[1.0f32, 2.0, 3.0, 4.0], vec![2, 2]).unwrap(),
    );
    to_bytes(&sd, &BTreeMap::new()).unwrap()
}

/// Asserts the bytes are rejected with a message naming the file and containing `what`.
fn rejected(bytes: &[u8], what: &str) {
    let err = from_bytes(bytes, "bad.safetensors").expect_err("a malformed file must be rejected");
    let msg = err.to_string();
    assert!(
        msg.starts_with("bad.safetensors: "),
        "the error names the file: {msg}"
    );
    assert!(msg.contains(what), "expected `{what}` in: {msg}");
}

#[test]
fn a_valid_file_loads() {
    let ck = from_bytes(&good(), "good.safetensors").unwrap();
    assert_eq!(
        ck.tensors.get("w").unwrap().to_vec::<f32>(),
        [1.0, 2.0, 3.0, 4.0]
    );
}

#[test]
fn empty_and_tiny_files() {
    rejected(&[], "fewer than the 8-byte header length");
    rejected(&[1, 0, 0], "fewer than the 8-byte header length");
}

#[test]
fn truncated_data() {
    let g = good();
    rejected(&g[..g.len() - 3], "");
    let err = from_bytes(&g[..g.len() - 3], "bad.safetensors").unwrap_err();
    assert!(matches!(err, CheckpointError::Format { .. }));
}

#[test]
fn header_length_past_the_end() {
    let mut g = good();
    g[..8].copy_from_slice(&10_000u64.to_le_bytes());
    rejected(&g, "the header claims 10000 bytes");
}

#[test]
fn a_huge_declared_header_is_not_allocated() {
    let mut g = good();
    g[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    rejected(&g, "the header claims");
    g[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    rejected(&g, "the header claims");
}

#[test]
fn invalid_json_and_utf8() {
    rejected(&file("{not json", &[]), "JSON");
    rejected(&file("[1, 2]", &[]), "");
    let mut bad = file("{\"a\":  }", &[]);
    bad[10] = 0xff;
    rejected(&bad, "");
    let mut b = (4u64).to_le_bytes().to_vec();
    b.extend_from_slice(&[0xff, 0xfe, 0xfd, 0xfc]);
    rejected(&b, "not UTF-8");
}

#[test]
fn out_of_range_offsets() {
    let h = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,64]}}"#;
    rejected(&file(h, &[0; 8]), "");
}

#[test]
fn overlapping_offsets() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    rejected(&file(h, &[0; 12]), "");
}

#[test]
fn a_gap_between_tensors() {
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    rejected(&file(h, &[0; 12]), "");
}

#[test]
fn shape_and_dtype_disagree_with_the_byte_span() {
    // 3 f32 values need 12 bytes; the span says 8.
    let h = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    rejected(&file(h, &[0; 8]), "");
    // A shape whose element count overflows.
    let h = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
    rejected(&file(h, &[0; 8]), "");
}

#[test]
fn duplicate_keys() {
    let h = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    rejected(&file(h, &[0; 4]), "the key `w` appears twice");
}

#[test]
fn unknown_and_unsupported_dtypes() {
    let h = r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}"#;
    rejected(&file(h, &[0; 4]), "");
    let h = r#"{"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}}"#;
    let err = from_bytes(&file(h, &[0; 4]), "bad.safetensors").unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnsupportedDtype { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("tensor `w`"));
}

#[test]
fn a_bool_tensor_holding_other_bytes() {
    let h = r#"{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}"#;
    rejected(&file(h, &[1, 7]), "holds the byte 7");
}

#[test]
fn a_newer_format_version() {
    let h = r#"{"__metadata__":{"forma_format_version":"99"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let err = from_bytes(&file(h, &[0; 4]), "bad.safetensors").unwrap_err();
    assert!(matches!(err, CheckpointError::Version { .. }), "{err}");
}

#[test]
fn narrow_integers_widen_to_i64() {
    let h = r#"{"ids":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut data = (-3i32).to_le_bytes().to_vec();
    data.extend_from_slice(&5i32.to_le_bytes());
    let ck = from_bytes(&file(h, &data), "ok.safetensors").unwrap();
    assert_eq!(ck.tensors.get("ids").unwrap().to_vec::<i64>(), [-3, 5]);
}

#[test]
fn a_failed_load_leaves_the_model_unchanged() {
    let dir = std::env::temp_dir().join(format!("forma-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("wrong.safetensors");
    // Right keys, one wrong shape: nothing may be written.
    let mut sd = StateDict::new();
    sd.insert(
        "weight",
        TensorData::from_vec(&[9.0f32; 6], vec![2, 3]).unwrap(),
    );
    sd.insert("bias", TensorData::from_vec(&[9.0f32; 3], vec![3]).unwrap());
    forma::nn::state::save_file(&sd, &path, &BTreeMap::new()).unwrap();
    let mut fc = Linear::<3, 2>::new(&Cpu, &mut Rng::seed_from(0));
    let before = fc.state_dict();
    let err = fc.load_safetensors(&path).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("wrong.safetensors") && msg.contains("bias"),
        "{msg}"
    );
    assert_eq!(fc.state_dict(), before);
    // A corrupted file: the same.
    std::fs::write(&path, b"\x05\x00\x00\x00\x00\x00\x00\x00{\"a\"").unwrap();
    assert!(fc.load_safetensors(&path).is_err());
    assert_eq!(fc.state_dict(), before);
    // A missing file names the path.
    let err = fc
        .load_safetensors(dir.join("absent.safetensors"))
        .unwrap_err();
    assert!(err.to_string().contains("absent.safetensors"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
