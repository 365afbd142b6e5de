//! The CUDA backend against the CPU backend, kernel trait by kernel trait.
//!
//! Each check runs the same kernel call on both devices from the same inputs
//! (strided, broadcast and transposed views included) and compares the CUDA
//! result with the CPU's: f32 within `F32_TOL` (elementwise) or
//! `F32_SUM_TOL`-like bounds (sums of products), f16 within two units in the
//! last place, bf16 likewise, bool/i64 results and copies/casts exactly.
//! Then a small MLP and a small CNN run forward and backward through the
//! autograd tape on both devices, and a training step is shown to reach an
//! allocator steady state (no driver allocation after the first steps).
//!
//! The suites `ops_*`, `grad_*` and `nn_*` (written with `device_tests!`)
//! also run on CUDA under the `cuda` feature, against the PyTorch fixtures.
//! Without a usable GPU every test here prints why it skipped and passes.
#![cfg(feature = "cuda")]

#[allow(unused_macros)] // `device_tests!` is not used here
mod common;

use common::{close, Tol, BF16_TOL, EXACT, F16_TOL, F32_TOL};
use forma::core::device::{Backend, Device};
use forma::core::ops::binary::{self as bin, BinaryKernel, BinaryOp};
use forma::core::ops::cmp::{CmpKernel, CmpOp};
use forma::core::ops::conv::{Conv2dParams, ConvKernel};
use forma::core::ops::index::IndexKernel;
use forma::core::ops::matmul::MatmulKernel;
use forma::core::ops::pool::{Pool2dParams, PoolKernel};
use forma::core::ops::reduce::{ArgReduceOp, ReduceKernel, ReduceOp};
use forma::core::ops::softmax::SoftmaxKernel;
use forma::core::ops::unary::{self as un, UnaryKernel, UnaryOp};
use forma::core::{Dtype, Float, Layout};
use forma::cuda::Cuda;
use forma::prelude::*;
use forma::Cpu;

/// Sums of many products in f32 (matmul, conv, reductions): the order differs.
const F32_ACC: Tol = Tol {
    rtol: 1e-4,
    atol: 1e-4,
};
/// f16 sums of products: inputs rounded to f16, f32 accumulation in another order.
const F16_ACC: Tol = Tol {
    rtol: 1e-2,
    atol: 1e-2,
};
/// bf16 sums of products.
const BF16_ACC: Tol = Tol {
    rtol: 4e-2,
    atol: 4e-2,
};

fn gpu() -> Option<Cuda> {
    common::cuda_device()
}

/// SplitMix64 values in `[lo, hi)`.
fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            lo + (hi - lo) * ((z >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

fn up<E: Dtype, D: Backend>(d: &D, v: &[f64]) -> D::Storage<E> {
    d.upload(v.iter().map(|&x| E::from_f64(x)).collect())
        .unwrap()
}

fn down<E: Dtype, D: Backend>(d: &D, s: &D::Storage<E>, dims: &[usize]) -> Vec<E> {
    d.to_vec(s, &Layout::contiguous(dims)).unwrap()
}

/// Compares, panicking with the check's name.
fn check<E: Dtype>(what: &str, cuda: &[E], cpu: &[E], tol: Tol) {
    if let Err(e) = close(cuda, cpu, tol) {
        panic!("{what} ({}): {e}", E::DTYPE);
    }
}

/// A `[6, 7]` view of 42 values laid out transposed (not contiguous).
fn transposed() -> Layout {
    Layout::contiguous(&[7, 6]).swap(0, 1)
}

fn unary_case<E: Float, Op: UnaryOp + std::fmt::Debug>(g: &Cuda, op: Op, tol: Tol)
where
    Cuda: Device<E>,
{
    let x = values(42, 1, -3.0, 3.0);
    let l = transposed();
    let (xc, xg) = (up::<E, _>(&Cpu, &x), up::<E, _>(g, &x));
    let yc = Cpu.unary(op, &xc, &l).unwrap();
    let yg = g.unary(op, &xg, &l).unwrap();
    let name = format!("{op:?}");
    check(
        &name,
        &down(g, &yg, &[6, 7]),
        &down(&Cpu, &yc, &[6, 7]),
        tol,
    );
    let gr = values(42, 2, -1.0, 1.0);
    let (gc, gg) = (up::<E, _>(&Cpu, &gr), up::<E, _>(g, &gr));
    let ly = Layout::contiguous(&[6, 7]);
    let dc = Cpu.unary_backward(op, &xc, &l, &yc, &ly, &gc, &ly).unwrap();
    let dg = g.unary_backward(op, &xg, &l, &yg, &ly, &gg, &ly).unwrap();
    check(
        &format!("{name} backward"),
        &down(g, &dg, &[6, 7]),
        &down(&Cpu, &dc, &[6, 7]),
        tol,
    );
}

fn unary_all<E: Float>(g: &Cuda, tol: Tol)
where
    Cuda: Device<E>,
{
    unary_case::<E, _>(g, un::Neg {}, tol);
    unary_case::<E, _>(g, un::Exp {}, tol);
    unary_case::<E, _>(g, un::Log {}, tol);
    unary_case::<E, _>(g, un::Log1p {}, tol);
    unary_case::<E, _>(g, un::Sqrt {}, tol);
    unary_case::<E, _>(g, un::Rsqrt {}, tol);
    unary_case::<E, _>(g, un::Recip {}, tol);
    unary_case::<E, _>(g, un::Square {}, tol);
    unary_case::<E, _>(g, un::Abs {}, tol);
    unary_case::<E, _>(g, un::Sin {}, tol);
    unary_case::<E, _>(g, un::Cos {}, tol);
    unary_case::<E, _>(g, un::Tanh {}, tol);
    unary_case::<E, _>(g, un::Sigmoid {}, tol);
    unary_case::<E, _>(g, un::Relu {}, tol);
    unary_case::<E, _>(g, un::Gelu {}, tol);
    unary_case::<E, _>(g, un::GeluTanh {}, tol);
    unary_case::<E, _>(g, un::Silu {}, tol);
    unary_case::<E, _>(
        g,
        un::LeakyRelu {
            negative_slope: 0.1,
        },
        tol,
    );
    unary_case::<E, _>(g, un::PowScalar { exponent: 2.5 }, tol);
    unary_case::<E, _>(g, un::AddScalar { value: 0.75 }, tol);
    unary_case::<E, _>(g, un::MulScalar { value: -1.5 }, tol);
    unary_case::<E, _>(g, un::DivScalar { value: 3.0 }, tol);
    unary_case::<E, _>(
        g,
        un::Clamp {
            min: -0.5,
            max: 1.25,
        },
        tol,
    );
    // An op with no CUDA row runs on the host and still gives the CPU's values.
    unary_case::<E, _>(g, Cube, tol);
}

/// A user-defined row (not in the CUDA table).
#[derive(Clone, Copy, Debug)]
struct Cube;

impl UnaryOp for Cube {
    const NAME: &'static str = "cube";
    fn f<R: forma::core::dtype::Real>(&self, x: R) -> R {
        x * x * x
    }
    fn df<R: forma::core::dtype::Real>(&self, x: R, _y: R) -> R {
        R::c(3.0) * x * x
    }
}

#[test]
fn unary_rows_match_the_cpu() {
    let Some(g) = gpu() else { return };
    unary_all::<f32>(&g, F32_TOL);
    unary_all::<f16>(&g, F16_TOL);
    unary_all::<bf16>(&g, BF16_TOL);
    unary_all::<f64>(
        &g,
        Tol {
            rtol: 1e-12,
            atol: 1e-12,
        },
    );
}

fn binary_case<E: Float, Op: BinaryOp + std::fmt::Debug>(g: &Cuda, op: Op, tol: Tol)
where
    Cuda: Device<E>,
{
    // a: [4, 1, 5] broadcast to [4, 3, 5]; b: [3, 5] transposed storage, broadcast.
    let (a, b) = (values(20, 3, -2.0, 2.0), values(15, 4, 0.1, 2.0));
    let out = [4, 3, 5];
    let la = Layout::contiguous(&[4, 1, 5]).broadcast_to(&out);
    let lb = Layout::contiguous(&[5, 3]).swap(0, 1).broadcast_to(&out);
    let (ac, ag) = (up::<E, _>(&Cpu, &a), up::<E, _>(g, &a));
    let (bc, bg) = (up::<E, _>(&Cpu, &b), up::<E, _>(g, &b));
    let name = format!("{op:?}");
    let yc = Cpu.binary(op, &ac, &la, &bc, &lb).unwrap();
    let yg = g.binary(op, &ag, &la, &bg, &lb).unwrap();
    check(&name, &down(g, &yg, &out), &down(&Cpu, &yc, &out), tol);
    let gr = values(60, 5, -1.0, 1.0);
    let lg = Layout::contiguous(&out);
    let (gc, gg) = (up::<E, _>(&Cpu, &gr), up::<E, _>(g, &gr));
    let (dac, dbc) = Cpu
        .binary_backward(op, &ac, &la, &bc, &lb, &gc, &lg)
        .unwrap();
    let (dag, dbg) = g.binary_backward(op, &ag, &la, &bg, &lb, &gg, &lg).unwrap();
    check(
        &format!("{name} da"),
        &down(g, &dag, &out),
        &down(&Cpu, &dac, &out),
        tol,
    );
    check(
        &format!("{name} db"),
        &down(g, &dbg, &out),
        &down(&Cpu, &dbc, &out),
        tol,
    );
}

fn binary_all<E: Float>(g: &Cuda, tol: Tol)
where
    Cuda: Device<E>,
{
    binary_case::<E, _>(g, bin::Add, tol);
    binary_case::<E, _>(g, bin::Sub, tol);
    binary_case::<E, _>(g, bin::Mul, tol);
    binary_case::<E, _>(g, bin::Div, tol);
    binary_case::<E, _>(g, bin::Pow, tol);
    binary_case::<E, _>(g, bin::Maximum, tol);
    binary_case::<E, _>(g, bin::Minimum, tol);
}

#[test]
fn binary_rows_broadcast_like_the_cpu() {
    let Some(g) = gpu() else { return };
    binary_all::<f32>(&g, F32_TOL);
    binary_all::<f16>(&g, F16_TOL);
    binary_all::<bf16>(&g, BF16_TOL);
}

#[test]
fn comparisons_and_where() {
    let Some(g) = gpu() else { return };
    // Rounded values make ties; a NaN compares unequal to everything.
    let mut a: Vec<f64> = values(12, 6, -2.0, 2.0).iter().map(|v| v.round()).collect();
    a[3] = f64::NAN;
    let b: Vec<f64> = values(4, 7, -2.0, 2.0).iter().map(|v| v.round()).collect();
    let out = [3, 4];
    let la = Layout::contiguous(&[3, 4]);
    let lb = Layout::contiguous(&[4]).broadcast_to(&out);
    let (ac, ag) = (up::<f32, _>(&Cpu, &a), up::<f32, _>(&g, &a));
    let (bc, bg) = (up::<f32, _>(&Cpu, &b), up::<f32, _>(&g, &b));
    for op in [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ] {
        let mc = CmpKernel::<f32>::cmp(&Cpu, op, &ac, &la, &bc, &lb).unwrap();
        let mg = CmpKernel::<f32>::cmp(&g, op, &ag, &la, &bg, &lb).unwrap();
        let (vc, vg) = (down(&Cpu, &mc, &out), down(&g, &mg, &out));
        assert_eq!(vg, vc, "{op:?}");
        let wc = Cpu.where_cond(&mc, &la, &ac, &la, &bc, &lb).unwrap();
        let wg = g.where_cond(&mg, &la, &ag, &la, &bg, &lb).unwrap();
        check(
            &format!("where {op:?}"),
            &down(&g, &wg, &out),
            &down(&Cpu, &wc, &out),
            EXACT,
        );
    }
}

fn reduce_all<E: Float>(g: &Cuda, tol: Tol)
where
    Cuda: Device<E>,
{
    // A [3, 4, 300] view, permuted so no axis is dense; lanes longer than a block.
    let x = values(3600, 8, -2.0, 2.0);
    let l = Layout::contiguous(&[300, 3, 4]).permute(&[1, 2, 0]);
    let (xc, xg) = (up::<E, _>(&Cpu, &x), up::<E, _>(g, &x));
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::LogSumExp,
        ReduceOp::Var { ddof: 1 },
        ReduceOp::Var { ddof: 0 },
    ];
    for axis in 0..3 {
        let mut dims = l.dims.to_vec();
        dims.remove(axis);
        for op in ops {
            let rc = Cpu.reduce(op, &xc, &l, axis).unwrap();
            let rg = g.reduce(op, &xg, &l, axis).unwrap();
            check(
                &format!("{op:?} axis {axis}"),
                &down(g, &rg, &dims),
                &down(&Cpu, &rc, &dims),
                tol,
            );
        }
        for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
            let rc = Cpu.arg_reduce(op, &xc, &l, axis).unwrap();
            let rg = g.arg_reduce(op, &xg, &l, axis).unwrap();
            assert_eq!(
                down(g, &rg, &dims),
                down(&Cpu, &rc, &dims),
                "{op:?} axis {axis}"
            );
        }
    }
    // Products of values near 1 stay finite.
    let p = values(60, 9, 0.8, 1.2);
    let lp = Layout::contiguous(&[6, 10]);
    let (pc, pg) = (up::<E, _>(&Cpu, &p), up::<E, _>(g, &p));
    let rc = Cpu.reduce(ReduceOp::Prod, &pc, &lp, 1).unwrap();
    let rg = g.reduce(ReduceOp::Prod, &pg, &lp, 1).unwrap();
    check("prod", &down(g, &rg, &[6]), &down(&Cpu, &rc, &[6]), tol);
    // Ties and NaN: argmax takes the first maximum, a NaN wins; max propagates NaN.
    let t = [1.0, 3.0, 3.0, 2.0, f64::NAN, 5.0, 5.0, f64::NAN, 0.0];
    let lt = Layout::contiguous(&[3, 3]);
    let (tc, tg) = (up::<E, _>(&Cpu, &t), up::<E, _>(g, &t));
    for op in [ArgReduceOp::ArgMax, ArgReduceOp::ArgMin] {
        let rc = Cpu.arg_reduce(op, &tc, &lt, 1).unwrap();
        let rg = g.arg_reduce(op, &tg, &lt, 1).unwrap();
        assert_eq!(down(g, &rg, &[3]), down(&Cpu, &rc, &[3]), "{op:?} ties/NaN");
    }
    let rg = g.reduce(ReduceOp::Max, &tg, &lt, 1).unwrap();
    let rc = Cpu.reduce(ReduceOp::Max, &tc, &lt, 1).unwrap();
    check(
        "max NaN",
        &down(g, &rg, &[3]),
        &down(&Cpu, &rc, &[3]),
        EXACT,
    );
    // An empty axis: max is an error on both.
    let le = Layout::contiguous(&[2, 0]);
    let e = up::<E, _>(g, &[]);
    assert!(g.reduce(ReduceOp::Max, &e, &le, 1).is_err());
    let s = g.reduce(ReduceOp::Sum, &e, &le, 1).unwrap();
    assert_eq!(down(g, &s, &[2]), vec![E::from_f64(0.0); 2]);
}

#[test]
fn reductions_match_the_cpu() {
    let Some(g) = gpu() else { return };
    reduce_all::<f32>(&g, F32_ACC);
    reduce_all::<f16>(&g, F16_TOL);
    reduce_all::<bf16>(&g, BF16_TOL);
}

#[test]
fn softmax_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut x = values(3 * 4 * 50, 10, -5.0, 5.0);
    // One lane all -inf (NaN on both, as in PyTorch), one with a +inf.
    x[..50].fill(f64::NEG_INFINITY);
    x[60] = f64::INFINITY;
    let l = Layout::contiguous(&[3, 4, 50]);
    let (xc, xg) = (up::<f32, _>(&Cpu, &x), up::<f32, _>(&g, &x));
    for axis in 0..3 {
        for log in [false, true] {
            let yc = Cpu.softmax(&xc, &l, axis, log).unwrap();
            let yg = g.softmax(&xg, &l, axis, log).unwrap();
            let what = format!("softmax axis {axis} log {log}");
            check(
                &what,
                &down(&g, &yg, &[3, 4, 50]),
                &down(&Cpu, &yc, &[3, 4, 50]),
                F32_TOL,
            );
        }
    }
    let lt = l.swap(0, 2);
    let yc = Cpu.softmax(&xc, &lt, 1, false).unwrap();
    let yg = g.softmax(&xg, &lt, 1, false).unwrap();
    check(
        "softmax strided",
        &down(&g, &yg, &[50, 4, 3]),
        &down(&Cpu, &yc, &[50, 4, 3]),
        F32_TOL,
    );
}

fn matmul_all<E: Float>(g: &Cuda, tol: Tol)
where
    Cuda: Device<E>,
{
    let (m, k, n) = (17, 33, 9);
    let a = values(3 * m * k, 11, -1.0, 1.0);
    let b = values(3 * k * n, 12, -1.0, 1.0);
    let (ac, ag) = (up::<E, _>(&Cpu, &a), up::<E, _>(g, &a));
    let (bc, bg) = (up::<E, _>(&Cpu, &b), up::<E, _>(g, &b));
    let cases: Vec<(&str, Layout, Layout, Vec<usize>)> = vec![
        (
            "2-d",
            Layout::contiguous(&[m, k]),
            Layout::contiguous(&[k, n]),
            vec![m, n],
        ),
        (
            "batched",
            Layout::contiguous(&[3, m, k]),
            Layout::contiguous(&[3, k, n]),
            vec![3, m, n],
        ),
        (
            "transposed operands",
            Layout::contiguous(&[3, k, m]).swap(1, 2),
            Layout::contiguous(&[3, n, k]).swap(1, 2),
            vec![3, m, n],
        ),
        (
            "broadcast batch",
            Layout::contiguous(&[3, m, k]),
            Layout::contiguous(&[k, n]).broadcast_to(&[3, k, n]),
            vec![3, m, n],
        ),
        (
            "strided rows",
            Layout::contiguous(&[m, 2 * k]).slice_step(1, 0, k, 2),
            Layout::contiguous(&[k, n]),
            vec![m, n],
        ),
        (
            "mixed batch broadcast",
            Layout::contiguous(&[1, 3, m, k]).broadcast_to(&[2, 3, m, k]),
            Layout::contiguous(&[3, k, n]).broadcast_to(&[2, 3, k, n]),
            vec![2, 3, m, n],
        ),
    ];
    for (what, la, lb, out) in cases {
        let yc = Cpu.matmul(&ac, &la, &bc, &lb).unwrap();
        let yg = g.matmul(&ag, &la, &bg, &lb).unwrap();
        check(
            &format!("matmul {what}"),
            &down(g, &yg, &out),
            &down(&Cpu, &yc, &out),
            tol,
        );
    }
    // k = 0 gives zeros.
    let e = up::<E, _>(g, &[]);
    let z = g
        .matmul(
            &e,
            &Layout::contiguous(&[2, 0]),
            &e,
            &Layout::contiguous(&[0, 3]),
        )
        .unwrap();
    assert_eq!(down(g, &z, &[2, 3]), vec![E::from_f64(0.0); 6]);
}

#[test]
fn matmul_on_cublas_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    matmul_all::<f32>(&g, F32_ACC);
    matmul_all::<f64>(
        &g,
        Tol {
            rtol: 1e-12,
            atol: 1e-12,
        },
    );
    matmul_all::<f16>(&g, F16_ACC);
    matmul_all::<bf16>(&g, BF16_ACC);
}

#[test]
fn index_kernels_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let x = values(4 * 5 * 6, 13, -2.0, 2.0);
    let lx = Layout::contiguous(&[4, 6, 5]).swap(1, 2); // [4, 5, 6], strided
    let (xc, xg) = (up::<f32, _>(&Cpu, &x), up::<f32, _>(&g, &x));
    let ids: Vec<i64> = vec![3, 0, 0, 2, 4, 1];
    let (ic, ig) = (
        Cpu.upload(ids.clone()).unwrap(),
        g.upload(ids.clone()).unwrap(),
    );
    let li = Layout::contiguous(&[6]);
    for axis in 0..3 {
        let size = lx.dims[axis];
        let k = ids.iter().filter(|&&i| (i as usize) < size).count();
        let li = li.narrow(0, 0, k.min(6));
        if ids[..li.dims[0]].iter().any(|&i| i as usize >= size) {
            continue;
        }
        let mut dims = lx.dims.to_vec();
        dims[axis] = li.dims[0];
        let yc = Cpu.index_select(&xc, &lx, axis, &ic, &li).unwrap();
        let yg = g.index_select(&xg, &lx, axis, &ig, &li).unwrap();
        check(
            &format!("index_select {axis}"),
            &down(&g, &yg, &dims),
            &down(&Cpu, &yc, &dims),
            EXACT,
        );
    }
    // gather / scatter_add along axis 1 with an index of sizes [4, 3, 6].
    let gi: Vec<i64> = (0..72).map(|i| (i * 7 % 5) as i64).collect();
    let lgi = Layout::contiguous(&[4, 3, 6]);
    let (gic, gig) = (Cpu.upload(gi.clone()).unwrap(), g.upload(gi).unwrap());
    let yc = Cpu.gather(&xc, &lx, 1, &gic, &lgi).unwrap();
    let yg = g.gather(&xg, &lx, 1, &gig, &lgi).unwrap();
    check(
        "gather",
        &down(&g, &yg, &[4, 3, 6]),
        &down(&Cpu, &yc, &[4, 3, 6]),
        EXACT,
    );
    let src = values(72, 14, -1.0, 1.0);
    let (sc, sg) = (up::<f32, _>(&Cpu, &src), up::<f32, _>(&g, &src));
    let yc = Cpu.scatter_add(&xc, &lx, 1, &gic, &lgi, &sc, &lgi).unwrap();
    let yg = g.scatter_add(&xg, &lx, 1, &gig, &lgi, &sg, &lgi).unwrap();
    check(
        "scatter_add",
        &down(&g, &yg, &[4, 5, 6]),
        &down(&Cpu, &yc, &[4, 5, 6]),
        F32_TOL,
    );
    // Half-precision scatter_add (16-bit compare-and-swap adds).
    let (xh, sh) = (up::<f16, _>(&g, &x), up::<f16, _>(&g, &src));
    let (xhc, shc) = (up::<f16, _>(&Cpu, &x), up::<f16, _>(&Cpu, &src));
    let yg = g.scatter_add(&xh, &lx, 1, &gig, &lgi, &sh, &lgi).unwrap();
    let yc = Cpu
        .scatter_add(&xhc, &lx, 1, &gic, &lgi, &shc, &lgi)
        .unwrap();
    check(
        "scatter_add f16",
        &down(&g, &yg, &[4, 5, 6]),
        &down(&Cpu, &yc, &[4, 5, 6]),
        F16_ACC,
    );
    // A bad index is the same error on both devices.
    let bad: Vec<i64> = vec![0, 1, -1, 7];
    let lb = Layout::contiguous(&[4]);
    let (bc, bg) = (Cpu.upload(bad.clone()).unwrap(), g.upload(bad).unwrap());
    let ec = IndexKernel::<f32>::index_select(&Cpu, &xc, &lx, 0, &bc, &lb).unwrap_err();
    let eg = IndexKernel::<f32>::index_select(&g, &xg, &lx, 0, &bg, &lb).unwrap_err();
    assert_eq!(eg.to_string(), ec.to_string());
}

fn conv_case<E: Float>(g: &Cuda, p: Conv2dParams, xd: [usize; 4], wd: [usize; 4], tol: Tol)
where
    Cuda: Device<E>,
{
    let x = values(xd.iter().product(), 15, -1.0, 1.0);
    let w = values(wd.iter().product(), 16, -1.0, 1.0);
    let (lx, lw) = (Layout::contiguous(&xd), Layout::contiguous(&wd));
    let (xc, xg) = (up::<E, _>(&Cpu, &x), up::<E, _>(g, &x));
    let (wc, wg) = (up::<E, _>(&Cpu, &w), up::<E, _>(g, &w));
    let yc = Cpu.conv2d(&xc, &lx, &wc, &lw, &p).unwrap();
    let yg = g.conv2d(&xg, &lx, &wg, &lw, &p).unwrap();
    let oh = forma::core::shape::window::window_out(
        xd[2],
        wd[2],
        p.stride[0],
        p.padding[0],
        p.dilation[0],
    )
    .unwrap();
    let ow = forma::core::shape::window::window_out(
        xd[3],
        wd[3],
        p.stride[1],
        p.padding[1],
        p.dilation[1],
    )
    .unwrap();
    let od = [xd[0], wd[0], oh, ow];
    check(
        &format!("conv2d {p:?}"),
        &down(g, &yg, &od),
        &down(&Cpu, &yc, &od),
        tol,
    );
    let gr = values(od.iter().product(), 17, -1.0, 1.0);
    let lg = Layout::contiguous(&od);
    let (gc, gg) = (up::<E, _>(&Cpu, &gr), up::<E, _>(g, &gr));
    let both = [true, true];
    let (dxc, dwc) = Cpu
        .conv2d_backward(&xc, &lx, &wc, &lw, &gc, &lg, &p, both)
        .unwrap();
    let (dxg, dwg) = g
        .conv2d_backward(&xg, &lx, &wg, &lw, &gg, &lg, &p, both)
        .unwrap();
    let (dxc, dwc, dxg, dwg) = (dxc.unwrap(), dwc.unwrap(), dxg.unwrap(), dwg.unwrap());
    check(
        &format!("conv2d dx {p:?}"),
        &down(g, &dxg, &xd),
        &down(&Cpu, &dxc, &xd),
        tol,
    );
    check(
        &format!("conv2d dw {p:?}"),
        &down(g, &dwg, &wd),
        &down(&Cpu, &dwc, &wd),
        tol,
    );
}

#[test]
fn convolution_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let plain = Conv2dParams::default();
    let fancy = Conv2dParams {
        stride: [2, 1],
        padding: [1, 2],
        dilation: [1, 2],
        groups: 2,
    };
    conv_case::<f32>(&g, plain, [2, 3, 9, 8], [5, 3, 3, 3], F32_ACC);
    conv_case::<f32>(&g, fancy, [3, 4, 10, 9], [6, 2, 3, 2], F32_ACC);
    conv_case::<f16>(&g, fancy, [3, 4, 10, 9], [6, 2, 3, 2], F16_ACC);
    conv_case::<bf16>(&g, plain, [2, 3, 9, 8], [5, 3, 3, 3], BF16_ACC);
}

#[test]
fn pooling_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let d = [2, 3, 9, 8];
    let mut x = values(d.iter().product(), 18, -2.0, 2.0);
    x[10] = f64::NAN;
    let lx = Layout::contiguous(&[2, 3, 8, 9]).swap(2, 3); // strided input
    let (xc, xg) = (up::<f32, _>(&Cpu, &x), up::<f32, _>(&g, &x));
    for (kernel, stride, padding, dilation, ceil, incl) in [
        ([2, 2], [2, 2], [0, 0], [1, 1], false, true),
        ([3, 2], [2, 3], [1, 1], [1, 1], true, false),
        ([3, 3], [2, 2], [1, 0], [2, 1], true, true),
    ] {
        let p = Pool2dParams {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode: ceil,
            count_include_pad: incl,
        };
        let out = [0, 1].map(|i| {
            forma::core::shape::window::pool_window_out(
                d[2 + i],
                kernel[i],
                stride[i],
                padding[i],
                dilation[i],
                ceil,
            )
            .unwrap()
        });
        let od = [d[0], d[1], out[0], out[1]];
        let lg = Layout::contiguous(&od);
        let gr = values(od.iter().product(), 19, -1.0, 1.0);
        let (gc, gg) = (up::<f32, _>(&Cpu, &gr), up::<f32, _>(&g, &gr));
        let yc = Cpu.max_pool2d(&xc, &lx, &p, out).unwrap();
        let yg = g.max_pool2d(&xg, &lx, &p, out).unwrap();
        check(
            &format!("max_pool2d {p:?}"),
            &down(&g, &yg, &od),
            &down(&Cpu, &yc, &od),
            EXACT,
        );
        let dc = Cpu.max_pool2d_backward(&xc, &lx, &gc, &lg, &p).unwrap();
        let dg = g.max_pool2d_backward(&xg, &lx, &gg, &lg, &p).unwrap();
        check(
            &format!("max_pool2d backward {p:?}"),
            &down(&g, &dg, &d),
            &down(&Cpu, &dc, &d),
            F32_TOL,
        );
        if dilation == [1, 1] {
            let yc = Cpu.avg_pool2d(&xc, &lx, &p, out).unwrap();
            let yg = g.avg_pool2d(&xg, &lx, &p, out).unwrap();
            check(
                &format!("avg_pool2d {p:?}"),
                &down(&g, &yg, &od),
                &down(&Cpu, &yc, &od),
                F32_TOL,
            );
            let dc = PoolKernel::<f32>::avg_pool2d_backward(&Cpu, &lx, &gc, &lg, &p).unwrap();
            let dg = PoolKernel::<f32>::avg_pool2d_backward(&g, &lx, &gg, &lg, &p).unwrap();
            check(
                &format!("avg_pool2d backward {p:?}"),
                &down(&g, &dg, &d),
                &down(&Cpu, &dc, &d),
                F32_TOL,
            );
        }
    }
}

fn cast_case<E: Dtype, F: Dtype>(g: &Cuda, x: &[E]) {
    let l = Layout::contiguous(&[x.len() / 2, 2]).swap(0, 1);
    let (sc, sg) = (
        Cpu.upload(x.to_vec()).unwrap(),
        g.upload(x.to_vec()).unwrap(),
    );
    let yc = Cpu.cast::<E, F>(&sc, &l).unwrap();
    let yg = g.cast::<E, F>(&sg, &l).unwrap();
    let dims = [2, x.len() / 2];
    let (vc, vg) = (down(&Cpu, &yc, &dims), down(g, &yg, &dims));
    check(
        &format!("cast {} -> {}", E::DTYPE, F::DTYPE),
        &vg,
        &vc,
        EXACT,
    );
}

fn cast_from<E: Dtype>(g: &Cuda, x: &[E]) {
    cast_case::<E, f32>(g, x);
    cast_case::<E, f64>(g, x);
    cast_case::<E, f16>(g, x);
    cast_case::<E, bf16>(g, x);
    cast_case::<E, i64>(g, x);
    cast_case::<E, u32>(g, x);
    cast_case::<E, bool>(g, x);
}

#[test]
fn copies_fills_and_casts_are_exact() {
    let Some(g) = gpu() else { return };
    let special = [
        0.0,
        -0.0,
        1.0 / 3.0,
        -2.7,
        65519.0,
        65520.0,
        1e-8,
        f64::NAN,
        f64::INFINITY,
        -1e30,
        4e9,
        3.999_999_9,
        0.500_000_000_000_1,
        -0.5,
        1.0 + f64::EPSILON,
        2.0f64.powi(60),
    ];
    cast_from::<f64>(&g, &special);
    cast_from::<f32>(&g, &special.map(|v| v as f32));
    cast_from::<f16>(&g, &special.map(f16::from_f64));
    cast_from::<bf16>(&g, &special.map(bf16::from_f64));
    cast_from::<i64>(
        &g,
        &[
            0,
            1,
            -1,
            7,
            i64::MAX,
            i64::MIN,
            1 << 53,
            (1 << 53) + 1,
            5_000_000_000,
            -3,
            2,
            9,
        ],
    );
    cast_from::<u32>(&g, &[0, 1, u32::MAX, 7, 1 << 31, 65505, 3, 4]);
    cast_from::<bool>(&g, &[true, false, false, true]);
    // copy_strided into a strided destination, and full.
    let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let (xc, xg) = (Cpu.upload(x.clone()).unwrap(), g.upload(x).unwrap());
    let (mut dc, mut dg) = (Cpu.full(24, -1.0f32).unwrap(), g.full(24, -1.0f32).unwrap());
    let ls = Layout::contiguous(&[4, 3]).swap(0, 1);
    let ld = Layout::contiguous(&[4, 6])
        .slice_step(1, 1, 3, 2)
        .swap(0, 1);
    Cpu.copy_strided(&xc, &ls, &mut dc, &ld).unwrap();
    g.copy_strided(&xg, &ls, &mut dg, &ld).unwrap();
    assert_eq!(down(&g, &dg, &[24]), down(&Cpu, &dc, &[24]));
    assert_eq!(
        down(&g, &g.full(5, bf16::from_f64(1.5)).unwrap(), &[5]),
        vec![bf16::from_f64(1.5); 5]
    );
    assert_eq!(down(&g, &g.full(3, true).unwrap(), &[3]), vec![true; 3]);
}

// ------------------------------------------------------------ models

/// A 2-layer MLP's loss and gradients `[loss, dW1, db1, dW2]` on `dev`.
fn mlp<D: Device<f32>>(dev: &D) -> Vec<Vec<f32>> {
    let t = |n: usize, seed: u64, s: f64| -> Vec<f32> {
        values(n, seed, -s, s)
            .into_iter()
            .map(|v| v as f32)
            .collect()
    };
    let x: Tensor<(C<8>, C<16>), f32, D> =
        Tensor::from_vec_on(t(128, 20, 1.0), (C, C), dev).unwrap();
    let w1: Tensor<(C<16>, C<32>), f32, D> = Tensor::from_vec_on(t(512, 21, 0.25), (C, C), dev)
        .unwrap()
        .requires_grad();
    let b1: Tensor<(C<32>,), f32, D> = Tensor::from_vec_on(t(32, 22, 0.1), (C,), dev)
        .unwrap()
        .requires_grad();
    let w2: Tensor<(C<32>, C<4>), f32, D> = Tensor::from_vec_on(t(128, 23, 0.25), (C, C), dev)
        .unwrap()
        .requires_grad();
    let h = (x.matmul(&w1) + &b1).relu();
    let logits = h.matmul(&w2);
    let loss = logits.log_softmax::<1>().mean_all().neg() + logits.square().mean_all();
    loss.backward();
    vec![
        loss.to_vec(),
        w1.grad().unwrap().to_vec(),
        b1.grad().unwrap().to_vec(),
        w2.grad().unwrap().to_vec(),
    ]
}

/// A conv -> relu -> max-pool -> avg-pool CNN's loss and gradients.
fn cnn<D: Device<f32>>(dev: &D) -> Vec<Vec<f32>> {
    let t = |n: usize, seed: u64, s: f64| -> Vec<f32> {
        values(n, seed, -s, s)
            .into_iter()
            .map(|v| v as f32)
            .collect()
    };
    let x: Tensor<(C<2>, C<3>, C<12>, C<12>), f32, D> =
        Tensor::from_vec_on(t(864, 30, 1.0), (C, C, C, C), dev)
            .unwrap()
            .requires_grad();
    let w: Tensor<(C<4>, C<3>, C<3>, C<3>), f32, D> =
        Tensor::from_vec_on(t(108, 31, 0.3), (C, C, C, C), dev)
            .unwrap()
            .requires_grad();
    let p = Conv2dParams {
        padding: [1, 1],
        ..Default::default()
    };
    let y = x.conv2d(&w, p).relu().max_pool2d(Pool2dParams::new([2, 2]));
    let z = y.avg_pool2d(Pool2dParams::new([3, 3]));
    let loss = z.softmax::<1>().square().sum_all() + y.mean_all();
    loss.backward();
    vec![
        loss.to_vec(),
        x.grad().unwrap().to_vec(),
        w.grad().unwrap().to_vec(),
    ]
}

#[test]
fn mlp_forward_and_backward_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let (rc, rg) = (mlp(&Cpu), mlp(&g));
    for (i, (a, b)) in rg.iter().zip(&rc).enumerate() {
        check(&format!("mlp output {i}"), a, b, F32_ACC);
    }
}

#[test]
fn cnn_forward_and_backward_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let (rc, rg) = (cnn(&Cpu), cnn(&g));
    for (i, (a, b)) in rg.iter().zip(&rc).enumerate() {
        check(&format!("cnn output {i}"), a, b, F32_ACC);
    }
}

#[test]
fn training_steps_reach_an_allocator_steady_state() {
    let Some(g) = gpu() else { return };
    mlp(&g);
    mlp(&g);
    let (after_two, _) = g.memory_stats();
    for _ in 0..3 {
        mlp(&g);
    }
    let (after_five, cached) = g.memory_stats();
    assert_eq!(
        after_five, after_two,
        "steady-state steps called the driver for memory"
    );
    assert!(cached > 0);
}

#[test]
fn tensors_move_between_devices() {
    let Some(g) = gpu() else { return };
    let x: Tensor<(C<2>, C<3>), f32> =
        Tensor::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C)).unwrap();
    let xg = x.to_device(&g);
    assert_eq!(xg.device().name(), "cuda:0");
    let y = xg.t().contiguous().to_device(&Cpu);
    assert_eq!(y.to_vec(), vec![1., 4., 2., 5., 3., 6.]);
    let z: Tensor<(C<2>, C<2>), bf16, Cuda> = Tensor::zeros_on((C, C), &g);
    assert_eq!(z.to_vec(), vec![bf16::from_f64(0.0); 4]);
}
