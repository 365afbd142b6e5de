//! Shared helpers of the `ops_*` suites:
//!
//! - [`Fixture`]: loads the PyTorch golden values that `tools/gen_fixtures.py`
//!   writes to `tools/fixtures/<family>.safetensors` (keys `<case>.in0`,
//!   `<case>.out`, ...; see the script's docstring for the conventions);
//! - [`assert_close`] / [`close`]: tolerance comparison where NaN equals NaN and
//!   infinities must match exactly, reporting the first mismatching index;
//! - [`Checks`]: runs many comparisons and reports every failing one at the end;
//! - [`device_tests!`]: writes a numeric test once, generic over the device,
//!   and instantiates it per device.
#![allow(dead_code)] // every test binary uses a different subset

use forma::core::device::{Backend, Device};
use forma::core::{Dtype, Result, Shape, Tensor};
use half::{bf16, f16};
use safetensors::{Dtype as StDtype, SafeTensors};
use std::collections::HashMap;

// ------------------------------------------------------------------ devices

/// What a device needs for the numeric suites: every kernel family for each
/// float dtype.
pub trait TestDevice: Device<f32> + Device<f64> + Device<f16> + Device<bf16> {}
impl<D: Device<f32> + Device<f64> + Device<f16> + Device<bf16>> TestDevice for D {}

/// Writes a numeric test once and instantiates it for each device.
///
/// ```ignore
/// device_tests! {
///     /// Doc comments and attributes go on every variant.
///     fn add_same_shape<D>(dev) {
///         let a: Tensor<(C<3>,), f32, D> = Tensor::from_vec_on(vec![1., 2., 3.], (C,), dev).unwrap();
///         assert_eq!((&a + &a).to_vec(), vec![2., 4., 6.]);
///     }
/// }
/// ```
///
/// expands to a module `add_same_shape` holding the generic body
/// `fn run<D: TestDevice>(dev: &D)` and one `#[test]` per device:
/// `add_same_shape::cpu` always. Tests build every tensor on `dev` (the
/// `*_on` constructors, [`Fixture::tensor`]), so the same body runs anywhere.
///
/// With the `cuda` feature each test also gets `<name>::cuda`, which runs the
/// same body on `forma::cuda::Cuda::new(0)` when a GPU is usable and
/// otherwise prints why it skipped (and passes): `cargo test --features cuda`
/// on a GPU machine runs every suite on both devices.
macro_rules! device_tests {
    ($(
        $(#[$meta:meta])*
        fn $name:ident<$D:ident>($dev:ident) $body:block
    )*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[allow(unused_variables)]
            pub(super) fn run<$D: $crate::common::TestDevice>($dev: &$D) $body

            $(#[$meta])*
            #[test]
            fn cpu() {
                run(&forma::Cpu);
            }

            $(#[$meta])*
            #[cfg(feature = "cuda")]
            #[test]
            fn cuda() {
                match $crate::common::cuda_device() {
                    Some(dev) => run(&dev),
                    None => eprintln!("skipped {}::cuda: no usable GPU", module_path!()),
                }
            }
        }
    )*};
}

/// The CUDA device the `cuda` variants run on, or `None` (printing why) when
/// none can be opened here.
#[cfg(feature = "cuda")]
pub fn cuda_device() -> Option<forma::cuda::Cuda> {
    match forma::cuda::Cuda::new(0) {
        Ok(dev) => Some(dev),
        Err(e) => {
            eprintln!("no usable GPU: {e}");
            None
        }
    }
}
#[allow(unused_imports)]
pub(crate) use device_tests;

// ------------------------------------------------------------------ tolerances

/// A tolerance: `|actual - expected| <= atol + rtol * |expected|` (as in
/// `torch.allclose`), with NaN equal to NaN and infinities equal only to the
/// same infinity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tol {
    /// Relative part.
    pub rtol: f64,
    /// Absolute part.
    pub atol: f64,
}

/// f32 elementwise results.
pub const F32_TOL: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-6,
};
/// f32 sums of products (matmul, conv): accumulation order differs from PyTorch's.
pub const F32_SUM_TOL: Tol = Tol {
    rtol: 1e-5,
    atol: 1e-5,
};
/// f64 results.
pub const F64_TOL: Tol = Tol {
    rtol: 1e-12,
    atol: 1e-12,
};
/// f16 results: two units in the last place (2^-9 relative).
pub const F16_TOL: Tol = Tol {
    rtol: 2e-3,
    atol: 1e-4,
};
/// bf16 results: two units in the last place (2^-6 relative).
pub const BF16_TOL: Tol = Tol {
    rtol: 1.6e-2,
    atol: 1e-3,
};
/// Bit-for-bit values (integers, masks, copies, casts).
pub const EXACT: Tol = Tol {
    rtol: 0.0,
    atol: 0.0,
};

/// Whether one value is close to another under `tol`.
pub fn value_close(a: f64, e: f64, tol: Tol) -> bool {
    if a.is_nan() || e.is_nan() {
        return a.is_nan() && e.is_nan();
    }
    if a.is_infinite() || e.is_infinite() {
        return a == e;
    }
    (a - e).abs() <= tol.atol + tol.rtol * e.abs()
}

/// Compares two sequences; on failure, a message naming the first mismatching
/// index, the values there and how many elements differ.
pub fn close<T: Dtype>(actual: &[T], expected: &[T], tol: Tol) -> std::result::Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "length {} differs from the expected {}",
            actual.len(),
            expected.len()
        ));
    }
    let bad: Vec<usize> = (0..actual.len())
        .filter(|&i| !value_close(actual[i].to_f64(), expected[i].to_f64(), tol))
        .collect();
    match bad.first() {
        None => Ok(()),
        Some(&i) => Err(format!(
            "{} of {} elements differ (rtol {:e}, atol {:e}); first at index {i}: \
             actual {} vs expected {} (as f64: {:?} vs {:?})\n  actual:   {}\n  expected: {}",
            bad.len(),
            actual.len(),
            tol.rtol,
            tol.atol,
            actual[i],
            expected[i],
            actual[i].to_f64(),
            expected[i].to_f64(),
            preview(actual),
            preview(expected),
        )),
    }
}

fn preview<T: Dtype>(v: &[T]) -> String {
    const N: usize = 12;
    let items: Vec<String> = v.iter().take(N).map(|x| format!("{x}")).collect();
    let more = if v.len() > N { ", ..." } else { "" };
    format!("[{}{more}]", items.join(", "))
}

/// The normwise relative error `max |a - e| / max |e|`, in f64.
///
/// # Panics
/// When the lengths differ.
#[track_caller]
pub fn normwise_error(actual: &[f32], expected: &[f32]) -> f64 {
    assert_eq!(actual.len(), expected.len(), "normwise_error: lengths");
    let diff = actual
        .iter()
        .zip(expected)
        .map(|(&a, &e)| (f64::from(a) - f64::from(e)).abs())
        .fold(0.0, f64::max);
    let scale = expected
        .iter()
        .map(|&e| f64::from(e).abs())
        .fold(0.0, f64::max);
    diff / scale
}

/// Asserts that `actual` matches `expected` elementwise within `rtol`/`atol`
/// (NaN equals NaN; infinities must be equal); reports the first mismatch.
#[track_caller]
pub fn assert_close<T: Dtype>(actual: &[T], expected: &[T], rtol: f64, atol: f64) {
    if let Err(msg) = close(actual, expected, Tol { rtol, atol }) {
        panic!("assert_close failed: {msg}");
    }
}

// ------------------------------------------------------------------ fixtures

/// Element types stored in fixtures.
pub trait FixtureElem: Dtype {
    /// The safetensors tag.
    const ST: StDtype;
    /// Decodes one little-endian element.
    fn from_le(b: &[u8]) -> Self;
}

macro_rules! fixture_elem {
    ($t:ty, $st:ident, |$b:ident| $e:expr) => {
        impl FixtureElem for $t {
            const ST: StDtype = StDtype::$st;
            fn from_le($b: &[u8]) -> Self {
                $e
            }
        }
    };
}

fixture_elem!(f32, F32, |b| f32::from_le_bytes(b.try_into().unwrap()));
fixture_elem!(f64, F64, |b| f64::from_le_bytes(b.try_into().unwrap()));
fixture_elem!(f16, F16, |b| f16::from_le_bytes(b.try_into().unwrap()));
fixture_elem!(bf16, BF16, |b| bf16::from_le_bytes(b.try_into().unwrap()));
fixture_elem!(i64, I64, |b| i64::from_le_bytes(b.try_into().unwrap()));
fixture_elem!(bool, BOOL, |b| b[0] != 0);

/// A stored tensor: row-major values and the shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Array<T> {
    /// Values in row-major order.
    pub data: Vec<T>,
    /// Sizes.
    pub shape: Vec<usize>,
}

/// One fixture file, `tools/fixtures/<family>.safetensors`.
#[derive(Debug)]
pub struct Fixture {
    family: String,
    bytes: Vec<u8>,
}

impl Fixture {
    /// Reads `tools/fixtures/<family>.safetensors` under the repository root,
    /// or under `$FORMA_ROOT` when set (test binaries run on another machine,
    /// see `tools/gpu-check.sh`).
    ///
    /// # Panics
    /// When the file is missing (run `python3 tools/gen_fixtures.py`) or unreadable.
    pub fn load(family: &str) -> Self {
        let root =
            std::env::var("FORMA_ROOT").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
        let path = format!("{root}/tools/fixtures/{family}.safetensors");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!("cannot read {path} ({e}); run `python3 tools/gen_fixtures.py` from the repository root")
        });
        SafeTensors::deserialize(&bytes)
            .unwrap_or_else(|e| panic!("{path} is not a valid safetensors file: {e:?}"));
        Fixture {
            family: family.to_string(),
            bytes,
        }
    }

    fn st(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("validated in load")
    }

    /// The file's metadata (`torch` version, `generator`).
    pub fn metadata(&self) -> HashMap<String, String> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes).expect("validated in load");
        meta.metadata().clone().unwrap_or_default()
    }

    /// Every key, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.st().names().iter().map(|s| s.to_string()).collect();
        k.sort();
        k
    }

    /// Whether `key` is stored.
    pub fn has(&self, key: &str) -> bool {
        self.st().tensor(key).is_ok()
    }

    /// The values and shape stored under `key`.
    ///
    /// # Panics
    /// When the key is missing or holds another dtype.
    #[track_caller]
    pub fn array<T: FixtureElem>(&self, key: &str) -> Array<T> {
        let st = self.st();
        let view = st
            .tensor(key)
            .unwrap_or_else(|_| panic!("fixture {}: no key `{key}`", self.family));
        assert_eq!(
            view.dtype(),
            T::ST,
            "fixture {}: `{key}` holds {:?}, the test reads {:?}",
            self.family,
            view.dtype(),
            T::ST
        );
        let size = view.dtype().bitsize() / 8;
        let data = view.data().chunks_exact(size).map(T::from_le).collect();
        Array {
            data,
            shape: view.shape().to_vec(),
        }
    }

    /// `(values, shape)` of an f32 entry.
    #[track_caller]
    pub fn f32(&self, key: &str) -> (Vec<f32>, Vec<usize>) {
        let a = self.array::<f32>(key);
        (a.data, a.shape)
    }

    /// `(values, shape)` of an f64 entry.
    #[track_caller]
    pub fn f64(&self, key: &str) -> (Vec<f64>, Vec<usize>) {
        let a = self.array::<f64>(key);
        (a.data, a.shape)
    }

    /// `(values, shape)` of an i64 entry.
    #[track_caller]
    pub fn i64(&self, key: &str) -> (Vec<i64>, Vec<usize>) {
        let a = self.array::<i64>(key);
        (a.data, a.shape)
    }

    /// The entry as a tensor of shape type `S` on `dev`; the stored sizes
    /// must fit `S` (its static dims, its rank).
    #[track_caller]
    pub fn tensor<S: Shape, E: FixtureElem, D: Backend>(
        &self,
        key: &str,
        dev: &D,
    ) -> Tensor<S, E, D> {
        let a = self.array::<E>(key);
        let shape = S::from_dims(&a.shape).unwrap_or_else(|| {
            panic!(
                "fixture {}: `{key}` has shape {:?}, which does not fit the test's shape {}",
                self.family,
                a.shape,
                S::describe()
            )
        });
        Tensor::from_vec_on(a.data, shape, dev).expect("the data fills the shape")
    }

    /// Compares a tensor (sizes and values) with the entry `key`.
    pub fn compare<S: Shape, E: FixtureElem, D: Backend>(
        &self,
        actual: &Tensor<S, E, D>,
        key: &str,
        tol: Tol,
    ) -> std::result::Result<(), String> {
        let want = self.array::<E>(key);
        let dims = actual.dims().to_vec();
        if dims != want.shape {
            return Err(format!(
                "shape {:?} differs from PyTorch's {:?}",
                dims, want.shape
            ));
        }
        close(&actual.to_vec(), &want.data, tol)
    }

    /// Asserts that a tensor matches the entry `key` (sizes and values).
    #[track_caller]
    pub fn check<S: Shape, E: FixtureElem, D: Backend>(
        &self,
        actual: &Tensor<S, E, D>,
        key: &str,
        tol: Tol,
    ) {
        if let Err(msg) = self.compare(actual, key, tol) {
            panic!("{}/{key}: {msg}", self.family);
        }
    }
}

/// Collects the outcome of many comparisons against one fixture file and
/// reports every failure at once in [`Checks::finish`].
#[derive(Debug)]
pub struct Checks<'a> {
    fx: &'a Fixture,
    failures: Vec<String>,
    passed: usize,
}

impl<'a> Checks<'a> {
    /// A collector over `fx`.
    pub fn new(fx: &'a Fixture) -> Self {
        Checks {
            fx,
            failures: Vec::new(),
            passed: 0,
        }
    }

    /// Compares `actual` with the entry `key`.
    pub fn close<S: Shape, E: FixtureElem, D: Backend>(
        &mut self,
        actual: &Tensor<S, E, D>,
        key: &str,
        tol: Tol,
    ) {
        match self.fx.compare(actual, key, tol) {
            Ok(()) => self.passed += 1,
            Err(msg) => self.failures.push(format!("{key}: {msg}")),
        }
    }

    /// Like [`Checks::close`] for an op that may fail.
    pub fn close_ok<S: Shape, E: FixtureElem, D: Backend>(
        &mut self,
        actual: Result<Tensor<S, E, D>>,
        key: &str,
        tol: Tol,
    ) {
        match actual {
            Ok(t) => self.close(&t, key, tol),
            Err(e) => self.failures.push(format!("{key}: the op failed: {e}")),
        }
    }

    /// How many comparisons ran (passed or failed).
    pub fn count(&self) -> usize {
        self.passed + self.failures.len()
    }

    /// Records a failure found by other means.
    pub fn fail(&mut self, msg: impl Into<String>) {
        self.failures.push(msg.into());
    }

    /// Panics listing every failed comparison.
    #[track_caller]
    pub fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{} of {} comparisons with {} failed:\n- {}",
                self.failures.len(),
                self.failures.len() + self.passed,
                self.fx.family,
                self.failures.join("\n- ")
            );
        }
        assert!(self.passed > 0, "no comparison ran");
    }
}

/// Asserts that a fixture file records the PyTorch version and generator.
#[track_caller]
pub fn assert_provenance(fx: &Fixture) {
    let meta = fx.metadata();
    assert_eq!(
        meta.get("generator").map(String::as_str),
        Some("tools/gen_fixtures.py")
    );
    assert!(
        meta.get("torch").is_some_and(|v| v.starts_with('2')),
        "missing torch version: {meta:?}"
    );
}
