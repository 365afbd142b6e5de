//! Fused expressions (`forma::fused`) against the same ops composed.
//!
//! The composed ops are checked against PyTorch in the `ops_*` and `grad_*`
//! suites; a fused expression must give the same bits in f32 and f64 (each op
//! rounds to the element type either way), forward and backward, for dense,
//! broadcast (row) and strided inputs, across parallel chunks and block
//! tails. In f16 it must give the f32 result rounded once. `try_composed`
//! (the path of a backend without a fused kernel) must agree too.

use forma::core::tape::{gradcheck, GradcheckOptions};
use forma::prelude::*;
use forma::{try_composed, try_fused};

fn randn<S: Shape, E: Float>(shape: S, seed: u64) -> Tensor<S, E> {
    let mut rng = Rng::seed_from(seed);
    Tensor::<S, f64>::randn(shape, &mut rng).to_dtype::<E>()
}

fn bits<S: Shape>(t: &Tensor<S>) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

fn grad_bits<S: Shape>(t: &Tensor<S>) -> Vec<u32> {
    bits(&t.grad().expect("the input got a gradient"))
}

/// `gelu(x * w + b)` fused and composed, over `[rows, 300]` with `w` and `b`
/// broadcast along the rows: equal outputs and equal gradients of all three.
fn gelu_affine_matches(rows: usize) {
    let x = randn::<_, f32>((Dyn(rows), C::<300>), 1).requires_grad();
    let w = randn::<_, f32>((C::<300>,), 2).requires_grad();
    let b = randn::<_, f32>((C::<300>,), 3).requires_grad();
    let g = randn::<_, f32>((Dyn(rows), C::<300>), 4);

    let fused = forma::fused((&x, &w, &b), |(x, w, b)| (x * w + b).gelu());
    fused.try_backward_with(&g).unwrap();
    let (fx, fw, fb) = (grad_bits(&x), grad_bits(&w), grad_bits(&b));
    x.zero_grad();
    w.zero_grad();
    b.zero_grad();

    let composed = (&(&x * &w) + &b).gelu();
    composed.try_backward_with(&g).unwrap();
    assert_eq!(bits(&fused), bits(&composed), "forward, {rows} rows");
    assert_eq!(fx, grad_bits(&x), "x gradient, {rows} rows");
    assert_eq!(fw, grad_bits(&w), "w gradient, {rows} rows");
    assert_eq!(fb, grad_bits(&b), "b gradient, {rows} rows");
}

#[test]
fn broadcast_rows_match_the_composed_ops() {
    // One row (shorter than a block), a few, and enough for parallel chunks
    // (the CPU splits outputs above 2^15 elements).
    for rows in [1, 3, 250] {
        gelu_affine_matches(rows);
    }
}

#[test]
fn dense_and_strided_inputs_match_the_composed_ops() {
    // Dense: 70_001 elements, so parallel chunks and a tail after whole blocks.
    let x = randn::<_, f32>((Dyn(70_001),), 5).requires_grad();
    let y = randn::<_, f32>((Dyn(70_001),), 6).requires_grad();
    let fused = forma::fused((&x, &y), |(x, y)| (x * 0.5 - y).tanh() * y + 1.0);
    let composed = &(&(&x * 0.5) - &y).tanh() * &y + 1.0;
    assert_eq!(bits(&fused), bits(&composed));
    fused.sum_all().backward();
    let (gx, gy) = (grad_bits(&x), grad_bits(&y));
    x.zero_grad();
    y.zero_grad();
    composed.sum_all().backward();
    assert_eq!(gx, grad_bits(&x));
    assert_eq!(gy, grad_bits(&y));

    // Strided: a transposed view (no unit-stride rows).
    let a = randn::<_, f32>((C::<37>, C::<29>), 7).requires_grad();
    let at = a.t();
    let c = randn::<_, f32>((C::<29>, C::<37>), 8);
    let fused = forma::fused((&at, &c), |(a, c)| a.sigmoid() * c);
    assert_eq!(bits(&fused), bits(&(&at.sigmoid() * &c)));
    fused.sum_all().backward();
    let ga = grad_bits(&a);
    a.zero_grad();
    let at = a.t();
    (&at.sigmoid() * &c).sum_all().backward();
    assert_eq!(ga, grad_bits(&a));
}

#[test]
fn every_kind_of_node_matches_the_composed_ops() {
    let x = randn::<_, f64>((C::<4>, C::<50>), 9);
    let y = randn::<_, f64>((C::<4>, One), 10).abs() + 0.5;
    let z = randn::<_, f64>((C::<50>,), 11);
    let w = randn::<_, f64>((C::<4>, C::<50>), 12);
    let fused = forma::fused((&x, &y, &z, &w), |(x, y, z, w)| {
        let u = (2.0 * x - 1.0) / 3.0 + (1.0 - z).leaky_relu(0.2);
        let v = y.pow(z.clamp(-1.0, 1.0)).maximum(w.exp()) - w.minimum(x);
        (u * v).silu() + (y * 0.5).log1p().neg() + y.sqrt().recip() + x.pow_scalar(2.0) / y
    });
    let u = &(&(&(&x * 2.0) - 1.0) / 3.0) + &z.neg().add_scalar(1.0).leaky_relu(0.2);
    let v = &y.pow(&z.clamp(-1.0, 1.0)).maximum(&w.exp()) - &w.minimum(&x);
    let composed = &(&(&(&u * &v).silu() + &(&y * 0.5).log1p().neg()) + &y.sqrt().recip())
        + &(&x.pow_scalar(2.0) / &y);
    let (f, c) = (fused.to_vec(), composed.to_vec());
    assert_eq!(
        f.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        c.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn gradients_pass_gradcheck() {
    let opts = GradcheckOptions {
        eps: 1e-6,
        atol: 1e-7,
        rtol: 1e-6,
    };
    let x = randn::<_, f64>((C::<3>, C::<5>), 13);
    let w = randn::<_, f64>((C::<5>,), 14);
    // Each input in turn is the checked one; `x` is read twice.
    let f = |x: &Tensor<(C<3>, C<5>), f64>| {
        forma::fused((x, &w), |(x, w)| {
            (x * w + x.sin()).gelu_tanh() / (w.square() + 1.0)
        })
        .sum_all()
    };
    gradcheck(&x, f, opts).unwrap();
    let g = |w: &Tensor<(C<5>,), f64>| {
        forma::fused((&x, w), |(x, w)| {
            (x * w + x.sin()).gelu_tanh() / (w.square() + 1.0)
        })
        .sum_all()
    };
    gradcheck(&w, g, opts).unwrap();
}

#[test]
fn the_composed_path_gives_the_same_numbers() {
    let x = randn::<_, f32>((C::<8>, C::<40>), 15).requires_grad();
    let w = randn::<_, f32>((C::<40>,), 16).requires_grad();
    let f = |(x, w): (
        forma::core::ops::fused::Arg<0>,
        forma::core::ops::fused::Arg<1>,
    )| { (x * w).gelu() * x };
    let fused = try_fused((&x, &w), f).unwrap();
    let composed = try_composed((&x, &w), f).unwrap();
    assert_eq!(bits(&fused), bits(&composed));
    fused.sum_all().backward();
    let (gx, gw) = (grad_bits(&x), grad_bits(&w));
    x.zero_grad();
    w.zero_grad();
    composed.sum_all().backward();
    assert_eq!(gw, grad_bits(&w));
    // `x` is read twice: its two shares are summed in another order, so
    // agreement is to rounding.
    let gc = x.grad().unwrap().to_vec();
    for (a, b) in gx.iter().map(|v| f32::from_bits(*v)).zip(gc) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn half_precision_rounds_once() {
    let x = randn::<_, f16>((Dyn(1000),), 17);
    let w = randn::<_, f16>((Dyn(1000),), 18);
    let fused = forma::fused((&x, &w), |(x, w)| (x * w + 0.1).gelu());
    // The same expression in f32 on the widened inputs, rounded at the end.
    let (x32, w32) = (x.to_dtype::<f32>(), w.to_dtype::<f32>());
    let once = forma::fused((&x32, &w32), |(x, w)| (x * w + 0.1).gelu()).to_dtype::<f16>();
    assert_eq!(fused.to_vec(), once.to_vec());
    // Eager rounding after every op differs somewhere; both stay close.
    let eager = try_composed((&x, &w), |(x, w)| (x * w + 0.1).gelu()).unwrap();
    let (a, b) = (fused.to_vec(), eager.to_vec());
    assert!(a != b, "f16 rounding after each op should show somewhere");
    for (a, b) in a.iter().zip(&b) {
        let (a, b) = (a.to_f32(), b.to_f32());
        assert!((a - b).abs() <= 4e-3 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn an_unread_input_gets_a_zero_gradient() {
    let x = randn::<_, f32>((C::<3>,), 19).requires_grad();
    let y = randn::<_, f32>((C::<3>,), 20).requires_grad();
    let out = forma::fused((&x, &y), |(x, _)| x.exp());
    out.sum_all().backward();
    assert_eq!(y.grad().unwrap().to_vec(), [0.0; 3]);
    assert_eq!(x.grad().unwrap().to_vec(), out.to_vec());
}

#[test]
fn dyn_sizes_that_do_not_broadcast_are_errors() {
    let x = Tensor::<(Dyn,)>::zeros_with((Dyn(3),));
    let y = Tensor::<(Dyn,)>::zeros_with((Dyn(4),));
    let err = try_fused((&x, &y), |(x, y)| x + y).unwrap_err().to_string();
    assert!(err.contains("fused") && err.contains("[4]"), "{err}");
}
