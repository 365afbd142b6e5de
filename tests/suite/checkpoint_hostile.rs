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

/// A temporary directory for one test.
fn scratch(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("forma-hostile-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[derive(Module)]
struct Stack {
    layers: Vec<Linear<1, 1>>,
}

/// 4,000 empty tensors with 2,000-character names against a model missing
/// 2,000 keys: before, every pair was compared by edit distance (minutes)
/// and the message held every name (tens of megabytes). Now hints are
/// bounded in count, name length and work, computed only for a strict load,
/// and the message lists the first few of each kind.
#[test]
fn refusing_many_long_names_is_fast_and_the_message_bounded() {
    let mut header = String::from("{");
    for i in 0..4000 {
        let name = format!("{i:04}{}", "x".repeat(1996));
        header.push_str(&format!(
            r#""{name}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}},"#
        ));
    }
    header.pop();
    header.push('}');
    let bytes = file(&header, &[]);
    let dir = scratch("names");
    let path = dir.join("names.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let mut rng = Rng::seed_from(0);
    let mut m = Stack {
        layers: (0..1000).map(|_| Linear::new(&Cpu, &mut rng)).collect(),
    };
    let started = std::time::Instant::now();
    let err = m.load_safetensors(&path).unwrap_err();
    let lenient = m
        .load_safetensors_with(&path, forma::nn::LoadOptions { strict: false })
        .unwrap();
    let took = started.elapsed();
    std::fs::remove_dir_all(dir).unwrap();
    // Generous: the quadratic hints took over a minute.
    assert!(took.as_secs() < 10, "{took:?}");
    let msg = err.to_string();
    assert!(msg.len() < 64 << 10, "{} bytes", msg.len());
    assert!(msg.contains("and 3980 more unexpected keys"), "{msg:.300}");
    assert!(msg.contains("and 1980 more missing keys"), "{msg:.300}");
    assert!(
        msg.contains("… (2000 bytes)"),
        "long names are cut: {msg:.300}"
    );
    assert_eq!(lenient.unexpected_keys.len(), 4000);
    assert_eq!(lenient.missing_keys.len(), 2000);
}

/// Only the tensors that will be written are converted: a bool tensor
/// holding the byte 7 under a key the model lacks does not stop a lenient
/// load, and a strict one reports the key, not its bytes.
#[test]
fn tensors_the_model_does_not_have_are_never_converted() {
    let mut rng = Rng::seed_from(1);
    let fc = Linear::<3, 2>::new(&Cpu, &mut rng);
    let mut sd = fc.state_dict();
    sd.insert(
        "extra.ids",
        TensorData::from_vec(&[1i64, 2], vec![2]).unwrap(),
    );
    let good = to_bytes(&sd, &BTreeMap::new()).unwrap();
    // Append a bool tensor with a bad byte by hand: the writer cannot make one.
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + n]).unwrap().trim_end();
    let data = &good[8 + n..];
    let header = format!(
        r#"{},"extra.mask":{{"dtype":"BOOL","shape":[2],"data_offsets":[{},{}]}}}}"#,
        &header[..header.len() - 1],
        data.len(),
        data.len() + 2
    );
    let mut all = data.to_vec();
    all.extend([1, 7]);
    let bytes = file(&header, &all);
    let dir = scratch("lazy");
    let path = dir.join("lazy.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let mut other = Linear::<3, 2>::new(&Cpu, &mut Rng::seed_from(2));
    let report = other
        .load_safetensors_with(&path, forma::nn::LoadOptions { strict: false })
        .unwrap();
    assert_eq!(report.unexpected_keys, ["extra.ids", "extra.mask"]);
    assert_eq!(other.state_dict(), fc.state_dict());
    let err = other.load_safetensors(&path).unwrap_err().to_string();
    std::fs::remove_dir_all(dir).unwrap();
    assert!(err.contains("unexpected key: extra.mask"), "{err}");
    assert!(!err.contains("byte 7"), "{err}");
    // Reading the whole file still checks every tensor.
    rejected(&bytes, "holds the byte 7");
}

/// Every problem with one tensor names it, including the ones the
/// safetensors crate reported without a name.
#[test]
fn every_error_about_one_tensor_names_it() {
    // A 2 GiB claim on the middle tensor names it, not the next one.
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[536870912],"data_offsets":[4,2147483652]},"c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    rejected(
        &file(h, &[0; 12]),
        "tensor `b`'s data ends at byte 2147483652",
    );
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    rejected(&file(h, &[0; 12]), "tensors `a` and `b` overlap");
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    rejected(&file(h, &[0; 12]), "lie between tensor `a` and tensor `b`");
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    rejected(
        &file(h, &[0; 12]),
        "8 bytes no tensor owns follow the last tensor, `a`",
    );
    let h = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    rejected(
        &file(h, &[0; 8]),
        "tensor `w` is float32 of shape [3], 12 bytes, but its data_offsets span 8",
    );
    let h = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
    rejected(&file(h, &[0; 8]), "tensor `w` has the shape");
    let h = r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#;
    rejected(
        &file(h, &[0; 4]),
        "tensor `w` has a shape entry that is not a size: -1",
    );
    let h = r#"{"w":{"dtype":"F32","shape":[1]}}"#;
    rejected(&file(h, &[0; 4]), "tensor `w` has no data_offsets");
    let h = r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}"#;
    rejected(&file(h, &[0; 4]), "tensor `w` has dtype Q4");
    // A JSON error shows the text around it, not only a column.
    let h = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "v": oops}"#;
    rejected(&file(h, &[0; 4]), r#"near "#);
    rejected(&file(h, &[0; 4]), r#""v": oops"#);
}

/// A directory and a FIFO are refused by their type, before opening (a FIFO
/// opened for reading blocks until a writer comes).
#[test]
fn non_regular_files_are_refused_by_type() {
    let dir = scratch("types");
    let mut fc = Linear::<3, 2>::new(&Cpu, &mut Rng::seed_from(0));
    let err = fc.load_safetensors(&dir).unwrap_err().to_string();
    assert!(err.contains("is a directory"), "{err}");
    let fifo = dir.join("pipe.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        let (tx, rx) = std::sync::mpsc::channel();
        let p = fifo.clone();
        std::thread::spawn(move || {
            let mut fc = Linear::<3, 2>::new(&Cpu, &mut Rng::seed_from(0));
            tx.send(fc.load_safetensors(&p).map_err(|e| e.to_string()))
                .unwrap();
        });
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("loading a FIFO must not block");
        let err = got.unwrap_err();
        assert!(err.contains("is a FIFO"), "{err}");
        let err = forma::nn::state::load_file(&fifo).unwrap_err().to_string();
        assert!(err.contains("is a FIFO"), "{err}");
    } else {
        // No mkfifo here: the directory case above still ran.
        eprintln!("mkfifo is not available; the FIFO case did not run");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// A version string that does not parse is "not a version", not "newer".
#[test]
fn a_version_that_does_not_parse_is_not_a_version() {
    let h = r#"{"__metadata__":{"forma_format_version":"abc"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let err = from_bytes(&file(h, &[0; 4]), "bad.safetensors").unwrap_err();
    assert!(matches!(err, CheckpointError::Format { .. }), "{err:?}");
    assert!(err.to_string().contains("`abc` is not a version"), "{err}");
}

/// A mismatch reports the dtype as the file stores it: a U8 weight is
/// `uint8`, though it would be read as int64.
#[test]
fn dtypes_are_reported_as_stored() {
    let h = r#"{"bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"weight":{"dtype":"U8","shape":[2,3],"data_offsets":[8,14]}}"#;
    let dir = scratch("dtype");
    let path = dir.join("u8.safetensors");
    std::fs::write(&path, file(h, &[0; 14])).unwrap();
    let mut fc = Linear::<3, 2>::new(&Cpu, &mut Rng::seed_from(0));
    let err = fc.load_safetensors(&path).unwrap_err().to_string();
    std::fs::remove_dir_all(dir).unwrap();
    assert!(
        err.contains("weight: the checkpoint has [2, 3] uint8 but the model needs [2, 3] float32"),
        "{err}"
    );
}

/// A save removes the temporary files killed saves of the same file left
/// (their process is gone), and nothing else.
#[test]
fn saves_remove_stale_temporaries_of_their_own_file() {
    let dir = scratch("stale");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let me = std::process::id();
    let stale = dir.join(format!(".m.safetensors.tmp-{dead}-3"));
    let kept = [
        dir.join(format!(".m.safetensors.tmp-{me}-999")),
        dir.join(format!(".other.safetensors.tmp-{dead}-0")),
        dir.join(".m.safetensors.tmp-notes"),
    ];
    for p in kept.iter().chain([&stale]) {
        std::fs::write(p, b"partial").unwrap();
    }
    let fc = Linear::<3, 2>::new(&Cpu, &mut Rng::seed_from(0));
    fc.save_safetensors(dir.join("m.safetensors")).unwrap();
    assert!(!stale.exists(), "the dead process's temporary is removed");
    for p in &kept {
        assert!(p.exists(), "{} is kept", p.display());
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// Fields the format does not define are ignored, as the safetensors crate
/// (and so PyTorch's loader) ignores them.
#[test]
fn unknown_entry_fields_are_ignored() {
    let h = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"note":"x"}}"#;
    let ck = from_bytes(&file(h, &1.5f32.to_le_bytes()), "ok.safetensors").unwrap();
    assert_eq!(ck.tensors.get("w").unwrap().to_vec::<f32>(), [1.5]);
}
