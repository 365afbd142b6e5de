//! Every kernel source compiles with NVRTC. Needs only `libnvrtc` (no
//! driver, no GPU): `pip install nvidia-cuda-nvrtc` and its `lib` folder on
//! `LD_LIBRARY_PATH` is enough. Without the library the test says so and
//! checks nothing else.
#![cfg(feature = "cuda")]

#[test]
fn every_kernel_source_compiles_with_nvrtc() {
    if !forma_cuda::kernels::nvrtc_present() {
        println!("skipped: libnvrtc could not be loaded (put its folder on LD_LIBRARY_PATH)");
        return;
    }
    // The oldest architecture NVRTC 13 targets, and Hopper (the H100/H200).
    for arch in ["compute_75", "compute_90"] {
        let n = forma_cuda::kernels::compile_all(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        // copy + 49 casts + 9 float families for 4 dtypes.
        assert_eq!(n, 1 + 49 + 9 * 4, "{arch}");
        println!("{arch}: {n} modules compiled");
    }
}

#[test]
fn a_broken_source_is_an_error_with_the_log() {
    if !forma_cuda::kernels::nvrtc_present() {
        println!("skipped: libnvrtc could not be loaded");
        return;
    }
    let e = forma_cuda::kernels::compile_source(
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        "compute_75",
    )
    .unwrap_err();
    assert!(e.contains("undefined_thing"), "{e}");
}
