//! Constructors and casts against PyTorch (`tools/fixtures/create.safetensors`):
//! zeros/ones/full (and their `_like`/default-device forms), arange, linspace,
//! eye; `from_vec` and `arange` errors; seeded rand/randn (determinism and
//! moments: Forma's generator is not PyTorch's, so values are not compared);
//! dtype casts between f32, f64, f16, bf16, i64 and bool with PyTorch's
//! rounding (ties to even, overflow to Inf, subnormals, truncation toward
//! zero). Also checks every fixture file's provenance and the comparison
//! helpers themselves. Tolerances: constructors f32 rtol 1e-5 / atol 1e-6
//! (PyTorch computes linspace steps in f32), f64 1e-12, casts exact.

use crate::common;

use common::*;
use forma::core::{Error, Tensor};
use forma::{Cpu, Dyn, Rng, C};
use half::{bf16, f16};

type V<E, D> = Tensor<(Dyn,), E, D>;

device_tests! {
    fn fills_match_torch<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        let z: Tensor<(C<2>, C<3>), f32, D> = Tensor::zeros_on((C, C), dev);
        c.close(&z, "zeros.out", EXACT);
        c.close(&Tensor::<(C<2>, C<3>), f32, D>::ones_on((C, C), dev), "ones.out", EXACT);
        let f: Tensor<(C<2>, C<3>), f32, D> = Tensor::full_on((C, C), 2.5, dev);
        c.close(&f, "full.out", EXACT);
        c.close(&f.zeros_like(), "zeros.out", EXACT);
        c.close(&f.ones_like(), "ones.out", EXACT);
        c.close(&z.full_like(2.5), "full.out", EXACT);
        c.close(&Tensor::<(Dyn, C<3>), f32, D>::zeros_on((Dyn(0), C), dev), "zeros_empty.out", EXACT);
        c.close(&Tensor::<(C<2>, Dyn), f64, D>::full_on((C, Dyn(3)), 0.1, dev), "full64.out", EXACT);
        c.finish();
    }

    /// arange(start, end, step) for the fixture's argument lists.
    fn arange_matches_torch<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        for (case, start, end, step) in [
            ("a", 0.0, 5.0, 1.0),
            ("b", 1.0, 2.5, 0.5),
            ("c", -1.0, 1.0, 0.3),
            ("d", 10.0, 0.0, -3.0),
            ("e", 0.0, 0.0, 1.0),
            ("f", 0.0, 1.0, 0.1),
        ] {
            c.close_ok(V::<f32, D>::arange_on(start, end, step, dev), &format!("arange.{case}.out"), F32_TOL);
        }
        c.close_ok(V::<f64, D>::arange_on(0.0, 1.0, 0.1, dev), "arange.g64.out", F64_TOL);
        c.finish();
    }

    /// linspace(start, end, steps), including 1 and 0 steps.
    fn linspace_matches_torch<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        for (case, start, end, steps) in [
            ("a", 0.0, 1.0, 5),
            ("b", -1.0, 1.0, 7),
            ("c", 0.0, 1.0, 1),
            ("d", 2.0, 3.0, 0),
            ("e", 0.0, 10.0, 4),
            ("f", 3.0, -2.0, 11),
        ] {
            c.close(&V::<f32, D>::linspace_on(start, end, steps, dev), &format!("linspace.{case}.out"), F32_TOL);
        }
        c.close(&V::<f64, D>::linspace_on(0.0, 1.0, 7, dev), "linspace.g64.out", F64_TOL);
        c.finish();
    }

    fn eye_matches_torch<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        c.close(&Tensor::<(C<3>, C<4>), f32, D>::eye_on((C, C), dev), "eye.3x4.out", EXACT);
        c.close(&Tensor::<(Dyn, Dyn), f32, D>::eye_on((Dyn(4), Dyn(2)), dev), "eye.4x2.out", EXACT);
        c.close(&Tensor::<(C<3>, C<3>), f64, D>::eye_on((C, C), dev), "eye.3x3_64.out", EXACT);
        c.finish();
    }

    /// Accessors: item, dims/size/rank/numel, dtype, all_finite, to_device.
    fn accessors<D>(dev) {
        let fx = Fixture::load("create");
        let x: Tensor<(C<2>, C<3>), f32, D> = Tensor::full_on((C, C), 2.5, dev);
        assert_eq!((x.dims().to_vec(), x.size(1), x.rank(), x.numel()), (vec![2, 3], 3, 2, 6));
        assert_eq!(x.dtype().torch_name(), "float32");
        assert_eq!(x.to_dtype::<bf16>().dtype().torch_name(), "bfloat16");
        let s: Tensor<(), f32, D> = x.narrow::<0>(1, 1).narrow::<1>(2, 1).flatten_all().try_reshape().unwrap();
        assert_eq!(s.item(), 2.5);
        assert!(x.all_finite());
        let v: V<f32, D> = fx.tensor("cast.f32.in0", dev);
        assert!(!v.all_finite());
        let host = v.to_device(&Cpu);
        assert_close(&host.to_vec(), &v.to_vec(), 0.0, 0.0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| x.item()));
        assert!(r.is_err(), "item of 6 elements must panic");
    }

    fn from_vec_length_errors<D>(dev) {
        let err = Tensor::<(C<2>, C<3>), f32, D>::from_vec_on(vec![0.0; 5], (C, C), dev).unwrap_err();
        assert_eq!(err, Error::DataLength { op: "from_vec", len: 5, numel: 6, shape: "[2, 3]".into() });
        assert_eq!(err.to_string(), "from_vec: 5 values cannot fill a shape of 6 elements [2, 3]");
        assert!(Tensor::<(Dyn,), f32, D>::from_vec_on(vec![1.0], (Dyn(2),), dev).is_err());
        let ok = Tensor::<(C<2>, C<3>), f32, D>::from_vec_on((0..6).map(|v| v as f32).collect(), (C, C), dev).unwrap();
        assert_eq!(ok.to_vec(), vec![0., 1., 2., 3., 4., 5.]);
        let empty = Tensor::<(Dyn, C<3>), f32, D>::from_vec_on(vec![], (Dyn(0), C), dev).unwrap();
        assert_eq!(empty.numel(), 0);
    }

    fn arange_errors<D>(dev) {
        for (start, end, step) in [(0.0, 1.0, 0.0), (0.0, 1.0, -1.0), (1.0, 0.0, 1.0), (0.0, f64::INFINITY, 1.0), (f64::NAN, 1.0, 1.0)] {
            match V::<f32, D>::arange_on(start, end, step, dev) {
                Err(Error::InvalidArgument { op, .. }) => assert_eq!(op, "arange"),
                other => panic!("arange({start}, {end}, {step}): expected an error, got {:?}", other.map(|t| t.to_vec())),
            }
        }
    }

    /// A seed determines the stream: the same seed repeats, another differs.
    fn rand_is_deterministic_per_seed<D>(dev) {
        let draw = |seed: u64| -> (Vec<f32>, Vec<f32>) {
            let mut rng = Rng::seed_from(seed);
            let u: Tensor<(C<4>, C<8>), f32, D> = Tensor::uniform_on((C, C), 0.0, 1.0, &mut rng, dev);
            let n: Tensor<(C<4>, C<8>), f32, D> = Tensor::normal_on((C, C), 0.0, 1.0, &mut rng, dev);
            (u.to_vec(), n.to_vec())
        };
        assert_eq!(draw(42), draw(42));
        let (a, b) = (draw(42), draw(43));
        assert_ne!(a.0, b.0);
        assert_ne!(a.1, b.1);
        // uniform and normal draws continue one stream
        assert_ne!(a.0, a.1);
        let mut rng = Rng::seed_from(42);
        let u: Tensor<(C<4>, C<8>), f64, D> = Tensor::uniform_on((C, C), -2.0, 3.0, &mut rng, dev);
        assert!(u.to_vec().iter().all(|&v| (-2.0..3.0).contains(&v)));
    }

    /// Moments of 20 000 draws: uniform [0,1) mean 1/2 and variance 1/12,
    /// normal(mean 2, std 3); all finite and uniform values inside the range.
    fn rand_moments<D>(dev) {
        let mut rng = Rng::seed_from(7);
        let u: Tensor<(C<100>, C<200>), f64, D> = Tensor::uniform_on((C, C), 0.0, 1.0, &mut rng, dev);
        let v = u.to_vec();
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        let (m, var) = moments(&v);
        assert!((m - 0.5).abs() < 0.01, "uniform mean {m}");
        assert!((var - 1.0 / 12.0).abs() < 0.005, "uniform variance {var}");
        let n: Tensor<(C<100>, C<200>), f64, D> = Tensor::normal_on((C, C), 2.0, 3.0, &mut rng, dev);
        let v = n.to_vec();
        assert!(v.iter().all(|x| x.is_finite()));
        let (m, var) = moments(&v);
        assert!((m - 2.0).abs() < 0.06, "normal mean {m}");
        assert!((var.sqrt() - 3.0).abs() < 0.06, "normal std {}", var.sqrt());
    }

    /// f32 -> f16/bf16/f64: round to nearest even, overflow to Inf,
    /// subnormals, NaN/Inf kept; and back to f32.
    fn cast_f32_to_half_and_back<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        let x: V<f32, D> = fx.tensor("cast.f32.in0", dev);
        let h: V<f16, D> = x.to_dtype::<f16>();
        c.close(&h, "cast.f32_f16.out", EXACT);
        let b: V<bf16, D> = x.to_dtype::<bf16>();
        c.close(&b, "cast.f32_bf16.out", EXACT);
        c.close(&x.to_dtype::<f64>(), "cast.f32_f64.out", EXACT);
        c.close(&h.to_dtype::<f32>(), "cast.f16_f32.out", EXACT);
        c.close(&b.to_dtype::<f32>(), "cast.bf16_f32.out", EXACT);
        // from a transposed view: the same values in the view's order
        let m: Tensor<(C<4>, C<6>), f32, D> = x.try_reshape().unwrap();
        let want: Vec<f16> = m.t().to_vec().iter().map(|&v| f16::from_f32(v)).collect();
        assert_close(&m.t().to_dtype::<f16>().to_vec(), &want, 0.0, 0.0);
        c.finish();
    }

    /// f32 -> i64 truncates toward zero; f32 -> bool is `!= 0` (NaN is true);
    /// i64 and bool -> float.
    fn cast_integers_and_bool<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        let x: V<f32, D> = fx.tensor("cast.f32_finite.in0", dev);
        c.close(&x.clamp(-1e9, 1e9).to_dtype::<i64>(), "cast.f32_i64.out", EXACT);
        let x: V<f32, D> = fx.tensor("cast.f32.in0", dev);
        c.close(&x.to_dtype::<bool>(), "cast.f32_bool.out", EXACT);
        let m: V<bool, D> = fx.tensor("cast.bool.in0", dev);
        c.close(&m.to_dtype::<f32>(), "cast.bool_f32.out", EXACT);
        let i: V<i64, D> = fx.tensor("cast.i64.in0", dev);
        c.close(&i.to_dtype::<f64>(), "cast.i64_f64.out", EXACT);
        c.close(&i.to_dtype::<f32>(), "cast.i64_f32.out", EXACT);
        c.finish();
    }

    /// f64 -> f32/f16/bf16. PyTorch converts f64 to the half types through
    /// f32, so a value just above a half-type tie (within f32 precision)
    /// rounds to the even neighbour.
    fn cast_f64_to_narrower<D>(dev) {
        let fx = Fixture::load("create");
        let mut c = Checks::new(&fx);
        let x: V<f64, D> = fx.tensor("cast.f64.in0", dev);
        c.close(&x.to_dtype::<f32>(), "cast.f64_f32.out", EXACT);
        c.close(&x.to_dtype::<f16>(), "cast.f64_f16.out", EXACT);
        c.close(&x.to_dtype::<bf16>(), "cast.f64_bf16.out", EXACT);
        c.finish();
    }
}

fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

/// The default-device constructors (no device argument) on the CPU.
#[test]
fn default_device_constructors() {
    let fx = Fixture::load("create");
    fx.check(
        &Tensor::<(C<2>, C<3>), f32, Cpu>::zeros(),
        "zeros.out",
        EXACT,
    );
    fx.check(&Tensor::<(C<2>, C<3>), f32, Cpu>::ones(), "ones.out", EXACT);
    fx.check(
        &Tensor::<(C<2>, C<3>), f32, Cpu>::full(2.5),
        "full.out",
        EXACT,
    );
    fx.check(
        &Tensor::<(Dyn, C<3>), f32, Cpu>::zeros_with((Dyn(0), C)),
        "zeros_empty.out",
        EXACT,
    );
    fx.check(
        &Tensor::<(C<2>, Dyn), f32, Cpu>::ones_with((C, Dyn(3))),
        "ones.out",
        EXACT,
    );
    fx.check(
        &Tensor::<(C<2>, C<3>), f32, Cpu>::full_with((C, C), 2.5),
        "full.out",
        EXACT,
    );
    fx.check(
        &V::<f32, Cpu>::arange(0.0, 5.0, 1.0).unwrap(),
        "arange.a.out",
        F32_TOL,
    );
    fx.check(
        &V::<f32, Cpu>::linspace(0.0, 1.0, 5),
        "linspace.a.out",
        F32_TOL,
    );
    fx.check(
        &Tensor::<(C<3>, C<4>), f32, Cpu>::eye((C, C)),
        "eye.3x4.out",
        EXACT,
    );
    fx.check(
        &Tensor::<(C<2>, C<3>), f32, Cpu>::from_slice(&[0.0; 6], (C, C)).unwrap(),
        "zeros.out",
        EXACT,
    );
    let mut a = Rng::seed_from(3);
    let mut b = Rng::seed_from(3);
    assert_eq!(
        Tensor::<(C<16>,), f32, Cpu>::rand((C,), &mut a).to_vec(),
        Tensor::<(C<16>,), f32, Cpu>::rand((C,), &mut b).to_vec()
    );
    assert_eq!(
        Tensor::<(C<16>,), f32, Cpu>::randn((C,), &mut a).to_vec(),
        Tensor::<(C<16>,), f32, Cpu>::randn((C,), &mut b).to_vec()
    );
}

/// Every fixture file names the PyTorch version and the generator.
#[test]
fn fixtures_record_provenance() {
    for family in [
        "unary", "binary", "cmp", "reduce", "softmax", "matmul", "index", "shape", "conv", "pool",
        "create",
    ] {
        let fx = Fixture::load(family);
        assert_provenance(&fx);
        assert!(!fx.keys().is_empty(), "{family} is empty");
    }
}

/// The comparison helpers: NaN equals NaN, infinities must match, the first
/// mismatching index is reported, sizes must agree.
#[test]
fn comparison_helpers() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    assert!(close(
        &[nan, inf, -inf, 1.0],
        &[nan, inf, -inf, 1.0 + 1e-7],
        F32_TOL
    )
    .is_ok());
    let err = close(&[1.0, 2.0, inf], &[1.0, 2.1, -inf], F32_TOL).unwrap_err();
    assert!(
        err.contains("first at index 1") && err.contains("2 of 3"),
        "{err}"
    );
    assert!(close(&[nan], &[1.0f32], F32_TOL).is_err());
    assert!(close(&[1.0f32], &[nan], F32_TOL).is_err());
    assert!(close(&[1e30f32], &[inf], F32_TOL).is_err());
    assert!(close(&[1.0f32], &[1.0, 2.0], F32_TOL).is_err());
    assert!(close(&[1.0f64 + 1e-13], &[1.0], F64_TOL).is_ok());
    assert!(close(&[1.0f64 + 1e-11], &[1.0], F64_TOL).is_err());
    assert!(close(&[3i64], &[3i64], EXACT).is_ok() && close(&[3i64], &[4], EXACT).is_err());
    assert!(close(&[true, false], &[true, true], EXACT).is_err());
    assert_close(&[1.0f32, nan], &[1.0, nan], 0.0, 0.0);
    let r = std::panic::catch_unwind(|| assert_close(&[1.0f32], &[1.5], 0.1, 0.1));
    assert!(r.is_err());
    // a fixture's shape is part of the comparison
    let fx = Fixture::load("create");
    let wrong: Tensor<(C<3>, C<2>), f32, Cpu> = Tensor::zeros();
    assert!(fx
        .compare(&wrong, "zeros.out", EXACT)
        .unwrap_err()
        .contains("shape"));
    let a = fx.array::<f32>("zeros.out");
    assert_eq!((a.data, a.shape), (vec![0.0; 6], vec![2, 3]));
    let (d, s) = fx.i64("cast.i64.in0");
    assert_eq!((d[2], s), (7, vec![6]));
}
