//! The tape's semantics, PyTorch's: leaves accumulate until zeroed, no-grad
//! records nothing, detach cuts, non-leaf gradients only on request, the graph
//! is freed by backward, anomaly mode names the first bad op.

use forma::core::tape::{no_grad, set_anomaly_detection};
use forma::prelude::*;

fn leaf(v: Vec<f64>) -> Tensor<(C<3>,), f64> {
    Tensor::from_vec(v, (C,)).unwrap().requires_grad()
}

#[test]
fn gradients_accumulate_until_zeroed() {
    let x = leaf(vec![1.0, 2.0, 3.0]);
    let y = (&x * &x).sum_all(); // dy/dx = 2x
    y.backward();
    assert_eq!(x.grad().unwrap().to_vec(), vec![2.0, 4.0, 6.0]);
    (&x * &x).sum_all().backward();
    assert_eq!(x.grad().unwrap().to_vec(), vec![4.0, 8.0, 12.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
    x.sum_all().backward();
    assert_eq!(x.grad().unwrap().to_vec(), vec![1.0, 1.0, 1.0]);
}

#[test]
fn a_tensor_used_twice_gets_both_contributions() {
    let x = leaf(vec![1.0, -2.0, 0.5]);
    let y = (&x.exp() + &x.mul_scalar(3.0)).sum_all();
    y.backward();
    let want: Vec<f64> = [1.0f64, -2.0, 0.5].iter().map(|v| v.exp() + 3.0).collect();
    assert_eq!(x.grad().unwrap().to_vec(), want);
}

#[test]
fn clones_share_the_leaf() {
    let w = leaf(vec![1.0, 1.0, 1.0]);
    let used_in_forward = w.clone();
    used_in_forward.mul_scalar(2.0).sum_all().backward();
    assert_eq!(w.grad().unwrap().to_vec(), vec![2.0, 2.0, 2.0]);
}

#[test]
fn no_grad_records_nothing_and_detach_cuts() {
    let x = leaf(vec![1.0, 2.0, 3.0]);
    {
        let _g = no_grad();
        let y = x.exp();
        assert!(!y.needs_grad());
    }
    assert!(x.exp().needs_grad());
    let d = x.detach();
    assert!(!d.needs_grad());
    assert!(d.shares_storage(&x));
    let err = d.sum_all().try_backward().unwrap_err();
    assert!(
        err.to_string().contains("does not require a gradient"),
        "{err}"
    );
}

#[test]
fn non_leaf_gradients_only_when_retained() {
    let x = leaf(vec![1.0, 2.0, 3.0]);
    let h = x.mul_scalar(2.0);
    let k = x.mul_scalar(3.0);
    k.retain_grad();
    (&h + &k).sum_all().backward();
    assert!(h.grad().is_none());
    assert_eq!(k.grad().unwrap().to_vec(), vec![1.0, 1.0, 1.0]);
    assert!(!h.is_leaf() && x.is_leaf());
}

#[test]
fn the_graph_is_freed_by_backward_unless_retained() {
    let x = leaf(vec![1.0, 2.0, 3.0]);
    let y = x.exp().sum_all();
    y.backward();
    let err = y.try_backward().unwrap_err();
    assert!(err.to_string().contains("already freed"), "{err}");

    let z = x.sin().sum_all();
    x.zero_grad();
    z.backward_retain().unwrap();
    z.backward_retain().unwrap();
    let want: Vec<f64> = [1.0f64, 2.0, 3.0].iter().map(|v| 2.0 * v.cos()).collect();
    assert_eq!(x.grad().unwrap().to_vec(), want);
}

#[test]
fn backward_with_an_upstream_gradient() {
    let x = Tensor::<(C<2>, C<2>), f64>::from_vec(vec![1.0, 2.0, 3.0, 4.0], (C, C))
        .unwrap()
        .requires_grad();
    let y = x.square();
    let g = Tensor::<(C<2>, C<2>), f64>::from_vec(vec![1.0, 0.0, 0.5, 2.0], (C, C)).unwrap();
    y.try_backward_with(&g).unwrap();
    assert_eq!(x.grad().unwrap().to_vec(), vec![2.0, 0.0, 3.0, 16.0]);
}

#[test]
fn broadcasting_gradients_sum_over_stretched_dims() {
    let a = Tensor::<(C<2>, C<3>), f64>::ones().requires_grad();
    let b = Tensor::<(C<3>,), f64>::from_vec(vec![1.0, 2.0, 3.0], (C,))
        .unwrap()
        .requires_grad();
    (&a * &b).sum_all().backward();
    assert_eq!(b.grad().unwrap().to_vec(), vec![2.0, 2.0, 2.0]);
    assert_eq!(
        a.grad().unwrap().to_vec(),
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    );
}

#[test]
fn views_pass_gradients_back() {
    let x = Tensor::<(C<2>, C<3>), f64>::from_vec(vec![1., 2., 3., 4., 5., 6.], (C, C))
        .unwrap()
        .requires_grad();
    let w = Tensor::<(C<2>, C<3>), f64>::from_vec(vec![1., 10., 100., 1000., 1e4, 1e5], (C, C))
        .unwrap();
    // transpose, narrow and reshape, then a weighted sum.
    let t: Tensor<(C<3>, C<2>), f64> = x.t();
    let n = t.narrow::<0>(1, 2); // rows 1..3 of the transpose = columns 1..3 of x
    let r: Tensor<(Dyn,), f64> = n.flatten_all();
    let wt: Tensor<(C<3>, C<2>), f64> = w.t();
    let wr: Tensor<(Dyn,), f64> = wt.narrow::<0>(1, 2).flatten_all();
    (&r * &wr).sum_all().backward();
    assert_eq!(
        x.grad().unwrap().to_vec(),
        vec![0., 10., 100., 0., 1e4, 1e5]
    );
}

#[test]
fn anomaly_mode_names_the_first_bad_op() {
    set_anomaly_detection(true);
    let x = leaf(vec![1.0, -1.0, 2.0]);
    let y = x.log().exp().sum_all(); // log(-1) is the first NaN
    let err = y.try_backward().unwrap_err();
    set_anomaly_detection(false);
    assert!(err.to_string().contains("`log`"), "{err}");
}

#[test]
fn anomaly_mode_names_a_backward_that_overflows() {
    set_anomaly_detection(true);
    let x = leaf(vec![0.0, 1.0, 4.0]);
    let y = x.sqrt().sum_all(); // finite forward, but d sqrt / dx at 0 is inf
    let err = y.try_backward().unwrap_err();
    set_anomaly_detection(false);
    assert!(err.to_string().contains("the backward of `sqrt`"), "{err}");
}
