//! Run-time compilation of the kernel sources with NVRTC, and the CUDA names
//! of Forma's dtypes. Compiling needs only `libnvrtc` (no driver, no GPU), so
//! [`compile_all`] checks every kernel source on any machine that has it.

use forma_core::DType;

/// Compiles one module's full source (prelude included) to PTX for `arch`
/// (`compute_XY`).
pub(crate) fn compile(src: &str, arch: &str, name: &str) -> Result<cudarc::nvrtc::Ptx, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(format!("{}.cu", name.replace('/', "_"))),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => {
            format!("NVRTC failed on {name}:\n{}", log.to_string_lossy())
        }
        other => format!("NVRTC failed on {name}: {other:?}"),
    })
}

/// The CUDA type that stores a dtype (see `common.cuh`).
pub(crate) fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half_t",
        DType::BF16 => "bhalf_t",
        DType::I64 => "long long",
        DType::U32 => "unsigned int",
        DType::Bool => "unsigned char",
    }
}

/// A short tag for module keys and kernel names.
pub(crate) fn tag(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::U32 => "u32",
        DType::Bool => "bool",
    }
}

/// The float dtypes every float kernel is built for.
pub const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Every dtype a storage can hold.
pub const ALL: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::U32,
    DType::Bool,
];

/// Every module source the backend can compile, as `(key, source without
/// the prelude)`: each op family for each dtype it is built for (the list
/// comes from the family modules themselves, in `ops/mod.rs`).
pub fn all_sources() -> Vec<(String, String)> {
    crate::ops::all_sources()
}

/// Compiles every module source for `arch` (`compute_XY`); the first
/// failure's log on error. Needs `libnvrtc`, not a driver or a GPU.
///
/// # Errors
/// The NVRTC log of the first source that does not compile.
pub fn compile_all(arch: &str) -> Result<usize, String> {
    let all = all_sources();
    for (key, src) in &all {
        compile(&format!("{}\n{src}", crate::device::COMMON), arch, key)?;
    }
    Ok(all.len())
}

/// Compiles one module source (the prelude is prepended) for `arch`.
///
/// # Errors
/// NVRTC's log when the source does not compile.
pub fn compile_source(src: &str, arch: &str) -> Result<(), String> {
    compile(&format!("{}\n{src}", crate::device::COMMON), arch, "user").map(|_| ())
}

/// Whether `libnvrtc` can be loaded here.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The module source of a float family for dtype `d`: `T` is the storage
/// type and `A` its accumulation type, then the family's kernels.
pub(crate) fn float_module(d: DType, body: &str) -> String {
    format!("typedef {} T;\ntypedef AccOf<T>::type A;\n{body}", ctype(d))
}
