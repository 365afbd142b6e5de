//! Feeds arbitrary bytes to the checkpoint reader: it must return `Ok` or an
//! error value, never panic, abort or allocate without bound.
//!
//! `cargo +nightly fuzz run safetensors_load -- -max_total_time=300`
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ck) = forma_nn::state::file::from_bytes(data, "fuzz.safetensors") {
        // Whatever loads must be self-consistent.
        for (_, t) in ck.tensors.iter() {
            assert_eq!(t.bytes().len(), t.numel() * forma_core::tensor::dtype_size(t.dtype()));
        }
    }
});
