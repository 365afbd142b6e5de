//! `Display`/`Debug` read like PyTorch's print: values with four decimals,
//! aligned, nested by rows, summarised with `...` past 1000 elements, then
//! shape, dtype and device.

use forma::prelude::*;

#[test]
fn a_matrix_prints_like_pytorch() {
    let x =
        Tensor::<(C<2>, C<3>)>::from_vec(vec![1.0, -2.5, 3.0, 0.25, 5.0, -6.0], (C, C)).unwrap();
    let want = "tensor([[ 1.0000, -2.5000,  3.0000],\n        [ 0.2500,  5.0000, -6.0000]], shape=[2, 3], dtype=float32, device=cpu)";
    assert_eq!(x.to_string(), want);
    assert_eq!(format!("{x:?}"), want);
}

#[test]
fn scalars_integers_bools_and_special_values() {
    let s = Tensor::<(), f64>::full(0.5);
    assert_eq!(
        s.to_string(),
        "tensor(0.5000, shape=[], dtype=float64, device=cpu)"
    );
    let i = Tensor::<(C<3>,), i64>::from_vec(vec![1, -20, 300], (C,)).unwrap();
    assert_eq!(
        i.to_string(),
        "tensor([  1, -20, 300], shape=[3], dtype=int64, device=cpu)"
    );
    let b = Tensor::<(C<2>,), bool>::from_vec(vec![true, false], (C,)).unwrap();
    assert_eq!(
        b.to_string(),
        "tensor([ True, False], shape=[2], dtype=bool, device=cpu)"
    );
    let f = Tensor::<(C<3>,)>::from_vec(vec![f32::NAN, f32::INFINITY, -1.5], (C,)).unwrap();
    assert_eq!(
        f.to_string(),
        "tensor([    nan,     inf, -1.5000], shape=[3], dtype=float32, device=cpu)"
    );
    // Integer-valued floats drop their decimals, as in PyTorch: `tensor([nan, inf, -1.])`.
    let g = Tensor::<(C<3>,)>::from_vec(vec![f32::NAN, f32::INFINITY, -1.0], (C,)).unwrap();
    assert_eq!(
        g.to_string(),
        "tensor([nan, inf, -1.], shape=[3], dtype=float32, device=cpu)"
    );
    // Magnitudes 1000x apart switch to scientific notation.
    let h = Tensor::<(C<2>,)>::from_vec(vec![0.001, 12.5], (C,)).unwrap();
    assert_eq!(
        h.to_string(),
        "tensor([1.0000e-03, 1.2500e+01], shape=[2], dtype=float32, device=cpu)"
    );
}

#[test]
fn large_tensors_are_summarised() {
    let x = Tensor::<(Dyn,)>::arange(0.0, 2000.0, 1.0).unwrap();
    let s = x.to_string();
    assert!(
        s.starts_with("tensor([   0.,    1.,    2., ..., 1997., 1998., 1999.]"),
        "{s}"
    );
    assert!(
        s.ends_with("shape=[2000], dtype=float32, device=cpu)"),
        "{s}"
    );
}
