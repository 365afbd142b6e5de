//! Loading a checkpoint into a module costs memory for the tensors it
//! writes, not for the file's other tensors: a 64 MiB U8 tensor under a key
//! the model lacks is never read, let alone widened to int64 (512 MiB).
//! (Its own test binary: it reads the process's peak resident memory.)

use forma::nn::layers::Linear;
use forma::nn::LoadOptions;
use forma::prelude::*;
use std::io::Write;

/// The process's peak resident set, in bytes (`VmHWM`).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb * 1024
}

#[test]
fn tensors_under_unknown_keys_cost_no_memory() {
    if !std::path::Path::new("/proc/self/status").exists() {
        eprintln!("no /proc here: the peak resident set cannot be read");
        return;
    }
    const BIG: usize = 64 << 20;
    let dir = std::env::temp_dir().join(format!("forma-ckpt-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.safetensors");
    // fc.bias (4 f32), fc.weight (16 f32), then the big U8 tensor, written
    // in 1 MiB pieces so that the test itself never holds it.
    let header = format!(
        r#"{{"bias":{{"dtype":"F32","shape":[4],"data_offsets":[0,16]}},"weight":{{"dtype":"F32","shape":[4,4],"data_offsets":[16,80]}},"unused.ids":{{"dtype":"U8","shape":[{BIG}],"data_offsets":[80,{}]}}}}"#,
        80 + BIG
    );
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header.as_bytes()).unwrap();
    for v in 0..20u32 {
        f.write_all(&(v as f32).to_le_bytes()).unwrap();
    }
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..BIG / chunk.len() {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    drop(chunk);

    let mut fc = Linear::<4, 4>::new(&Cpu, &mut Rng::seed_from(0));
    let before = peak_rss();
    let err = fc.load_safetensors(&path).unwrap_err().to_string();
    let report = fc
        .load_safetensors_with(&path, LoadOptions { strict: false })
        .unwrap();
    let grew = peak_rss().saturating_sub(before);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.contains("unexpected key: unused.ids"), "{err}");
    assert_eq!(report.unexpected_keys, ["unused.ids"]);
    assert_eq!(fc.weight.to_vec()[5], 9.0, "the weights were written");
    // Before, the U8 tensor was copied and widened: 64 MiB + 512 MiB.
    assert!(grew < 16 << 20, "the peak grew by {} MiB", grew >> 20);
}
