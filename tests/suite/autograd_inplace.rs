//! In-place writes and the tape, as in PyTorch: every storage has a version
//! counter that each in-place write moves on; a backward whose op saved a
//! tensor that was written since refuses to run and names the op, the
//! tensor and both versions. Writes to tensors no backward reads, and
//! writes after backward (an optimizer's step), are fine. Long graphs build,
//! backpropagate and drop without recursion.

use crate::common::*;
use forma::core::tape::no_grad;
use forma::core::Error;
use forma::nn::layers::Linear;
use forma::nn::optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use forma::prelude::*;

fn modified(err: &Error, op: &str, expected: u64, actual: u64) {
    match err {
        Error::ModifiedInPlace {
            op: o,
            expected: e,
            actual: a,
            ..
        } => {
            assert_eq!((*o, *e, *a), (op, expected, actual), "{err}");
        }
        other => panic!("expected an in-place modification error, got: {other}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&format!("backward of `{op}`")), "{msg}");
    assert!(msg.contains("modified by an in-place operation"), "{msg}");
}

device_tests! {
    /// `assign` on a tensor `mul` saved: the backward refuses, naming `mul`.
    fn assign_to_a_saved_input_is_refused<D>(dev) {
        let x: Tensor<(C<3>,), f32, D> =
            Tensor::from_vec_on(vec![1., 2., 3.], (C,), dev).unwrap().requires_grad();
        let w: Tensor<(C<3>,), f32, D> = Tensor::from_vec_on(vec![4., 5., 6.], (C,), dev).unwrap();
        let y = (&x * &w).sum_all();
        assert_eq!(w.version(), 0);
        w.assign(&Tensor::from_vec_on(vec![0., 0., 0.], (C,), dev).unwrap());
        assert_eq!(w.version(), 1);
        let err = y.try_backward().unwrap_err();
        modified(&err, "mul", 0, 1);
        assert!(err.to_string().contains("[3] float32"), "{err}");
        assert!(x.grad().is_none(), "nothing accumulated");
    }

    /// `fill` on the output `exp` saved (its backward reads y = exp(x)).
    fn fill_of_a_saved_output_is_refused<D>(dev) {
        let x: Tensor<(C<2>,), f64, D> =
            Tensor::from_vec_on(vec![0.5, -1.0], (C,), dev).unwrap().requires_grad();
        let y = x.exp();
        let loss = y.sum_all();
        y.fill(0.0);
        modified(&loss.try_backward().unwrap_err(), "exp", 0, 1);
    }

    /// A write through a view moves the counter its base shares.
    fn views_share_the_counter<D>(dev) {
        let x: Tensor<(C<2>, C<3>), f32, D> = Tensor::zeros_on((C, C), dev).requires_grad();
        let t = x.transpose::<0, 1>();
        let y = (&x * &x).sum_all();
        t.fill(1.0);
        assert_eq!((x.version(), t.version()), (1, 1));
        modified(&y.try_backward().unwrap_err(), "mul", 0, 1);
    }

    /// An optimizer step between forward and backward rewrites the weight the
    /// product saved for the input's gradient.
    fn an_optimizer_step_before_backward_is_refused<D>(dev) {
        let mut rng = Rng::seed_from(1);
        let model = Linear::<3, 2, f32, D>::new(dev, &mut rng);
        let x: Tensor<(Dyn, C<3>), f32, D> =
            Tensor::from_vec_on(vec![1., 2., 3., 4., 5., 6.], (Dyn(2), C), dev).unwrap().requires_grad();
        model.forward(x.clone()).square().sum_all().backward();
        let mut opt = Sgd::<f32, D>::new(SgdOptions::default().lr(0.1));
        let loss = model.forward(x.clone()).square().sum_all();
        opt.step(&model);
        let err = loss.try_backward().unwrap_err();
        assert!(matches!(err, Error::ModifiedInPlace { .. }), "{err}");
    }

    /// The legitimate loop: forward, backward, step, many times, with Adam
    /// (fused on the CPU), and a retained graph used again before any step.
    fn steps_after_backward_are_fine<D>(dev) {
        let mut rng = Rng::seed_from(2);
        let model = Linear::<3, 1, f32, D>::new(dev, &mut rng);
        let x: Tensor<(Dyn, C<3>), f32, D> =
            Tensor::from_vec_on(vec![1., -2., 3., 0.5, 1., -1.], (Dyn(2), C), dev).unwrap();
        let mut opt = Adam::<f32, D>::new(AdamOptions::default().lr(0.01));
        let mut losses = vec![];
        for _ in 0..20 {
            opt.zero_grad(&model);
            let loss = model.forward(x.clone()).square().mean_all();
            loss.backward_retain().unwrap();
            loss.backward();
            losses.push(loss.item());
            opt.step(&model);
        }
        assert!(losses[19] < losses[0], "{losses:?}");
        assert_eq!(model.weight.version(), 20, "one in-place write per step");
    }

    /// A retained graph whose weight was stepped is refused the second time.
    fn a_retained_graph_after_a_step_is_refused<D>(dev) {
        let w: Tensor<(C<2>,), f32, D> =
            Tensor::from_vec_on(vec![1., 2.], (C,), dev).unwrap().requires_grad();
        let loss = (&w * &w).sum_all();
        loss.backward_retain().unwrap();
        {
            let _g = no_grad();
            w.assign(&(&w - &w.grad().unwrap().mul_scalar(0.1)));
        }
        modified(&loss.try_backward().unwrap_err(), "mul", 0, 1);
    }

    /// Writes that no backward reads: the input of a sum (whose gradient does
    /// not read it) and of a view, and a tensor outside the graph.
    fn writes_nobody_saved_are_fine<D>(dev) {
        let x: Tensor<(C<2>, C<2>), f32, D> =
            Tensor::from_vec_on(vec![1., 2., 3., 4.], (C, C), dev).unwrap().requires_grad();
        let h = x.mul_scalar(2.0);
        let loss = h.transpose::<0, 1>().sum_all();
        h.fill(7.0);
        let other: Tensor<(C<2>,), f32, D> = Tensor::zeros_on((C,), dev);
        other.fill(3.0);
        loss.backward();
        assert_eq!(x.grad().unwrap().to_vec(), [2.0; 4]);
    }

    /// `load_state_dict`'s writes count too: a loaded weight is not the one saved.
    fn assign_data_moves_the_counter<D>(dev) {
        let w: Tensor<(C<2>,), f32, D> =
            Tensor::from_vec_on(vec![1., 2.], (C,), dev).unwrap().requires_grad();
        let loss = (&w * &w).sum_all();
        w.try_assign_data(&forma::TensorData::from_vec(&[3.0f32, 4.0], vec![2]).unwrap()).unwrap();
        modified(&loss.try_backward().unwrap_err(), "mul", 0, 1);
        // `exp` saves only its output, so writing its input is fine, as in PyTorch.
        let loss = w.exp().sum_all();
        w.fill(0.0);
        loss.backward();
        assert_eq!(w.grad().unwrap().to_vec(), [3f32.exp(), 4f32.exp()]);
    }
}

/// Builds a chain of `n` recorded ops on a leaf.
fn chain(n: usize) -> (Tensor<(C<1>,), f32>, Tensor<(), f32>) {
    let x = Tensor::<(C<1>,), f32>::from_vec(vec![0.0], (C,))
        .unwrap()
        .requires_grad();
    let mut h = x.clone();
    for _ in 0..n {
        h = h.add_scalar(1.0);
    }
    (x, h.sum_all())
}

/// Runs `f` on a thread with a 2 MiB stack, the default of spawned threads.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .expect("the thread finished without overflowing its stack");
}

#[test]
fn a_million_op_chain_backwards_and_drops_on_a_small_stack() {
    on_small_stack(|| {
        let (x, y) = chain(1_000_000);
        assert_eq!(y.item(), 1_000_000.0);
        y.backward();
        assert_eq!(x.grad().unwrap().to_vec(), [1.0]);
        drop(y);
    });
}

#[test]
fn a_million_op_chain_drops_without_backward_on_a_small_stack() {
    on_small_stack(|| {
        let (_x, y) = chain(1_000_000);
        drop(y);
    });
}

/// A saved activation is freed when its backward has run, while the graph
/// (held by the loss) still lives: the version check holds its counter
/// weakly, not the storage.
#[test]
fn backward_frees_saved_activations_before_the_graph_drops() {
    let x = Tensor::<(C<4>,)>::from_vec(vec![1., 2., 3., 4.], (C,))
        .unwrap()
        .requires_grad();
    let h = x.mul_scalar(2.0);
    let activation = std::sync::Arc::downgrade(&h.raw().storage);
    let loss = h.square().sum_all(); // square saves h
    drop(h);
    assert!(activation.upgrade().is_some(), "saved until backward");
    loss.backward();
    assert!(activation.upgrade().is_none(), "freed by backward");
    assert_eq!(x.grad().unwrap().to_vec(), [8., 16., 24., 32.]);
    drop(loss);
}

/// An add hands its gradient to both operands unchanged; each leaf still
/// gets a buffer of its own (as in PyTorch), so writing one gradient in
/// place leaves the other's values alone.
#[test]
fn leaves_added_together_get_gradients_of_their_own() {
    let a = Tensor::<(C<2>, C<3>), f32>::ones().requires_grad();
    let b = Tensor::<(C<2>, C<3>), f32>::full(2.0).requires_grad();
    (&a + &b).mul_scalar(3.0).sum_all().backward();
    let (ga, gb) = (a.grad().unwrap(), b.grad().unwrap());
    assert_eq!(ga.to_vec(), vec![3.0; 6]);
    assert_eq!(gb.to_vec(), vec![3.0; 6]);
    ga.fill(7.0);
    assert_eq!(a.grad().unwrap().to_vec(), vec![7.0; 6]);
    assert_eq!(b.grad().unwrap().to_vec(), vec![3.0; 6]);
}
