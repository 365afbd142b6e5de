//! Feeds arbitrary bytes to the IDX reader, as a file (plain, or gzip when
//! the bytes start with the gzip magic): it must return `Ok` or an error
//! value, never panic, abort or allocate without bound.
//!
//! `cargo +nightly fuzz run idx_read -- -max_total_time=600`
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::PathBuf;

fn scratch() -> PathBuf {
    std::env::temp_dir().join(format!("forma-fuzz-idx-{}", std::process::id()))
}

fuzz_target!(|data: &[u8]| {
    let path = scratch();
    std::fs::write(&path, data).expect("the scratch file is writable");
    // A cap as a caller that knows its data would give: the declared size
    // is refused past it before anything is allocated.
    match forma_nn::data::read_idx_limited(&path, 64 << 20) {
        Ok(arr) => {
            // Whatever loads must be self-consistent.
            let n: usize = arr.dims.iter().product();
            assert_eq!(arr.data.len(), n);
        }
        Err(e) => {
            // Every error names the file.
            assert!(e.to_string().contains(path.to_str().unwrap()), "{e}");
        }
    }
});
