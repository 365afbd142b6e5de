//! Gradient hooks with PyTorch's semantics: `register_hook` sees the summed
//! gradient of its tensor once and may replace it (leaf or intermediate,
//! before `retain_grad` keeps it), hooks chain in registration order, a
//! removed hook stops; `register_post_accumulate_grad_hook` runs on each leaf
//! once per backward, right after its gradient is accumulated, leaves used
//! last in the forward first.

use crate::common::*;
use forma::prelude::*;
use std::sync::{Arc, Mutex};

fn log<T: Send + 'static>() -> (Arc<Mutex<Vec<T>>>, Arc<Mutex<Vec<T>>>) {
    let l = Arc::new(Mutex::new(Vec::new()));
    (Arc::clone(&l), l)
}

device_tests! {
    /// A leaf used twice: the hook sees the total once, and its result is
    /// what accumulates.
    fn a_leaf_hook_sees_the_sum_and_replaces_it<D>(dev) {
        let x: Tensor<(C<2>,), f64, D> =
            Tensor::from_vec_on(vec![1.0, 3.0], (C,), dev).unwrap().requires_grad();
        let (seen, s) = log();
        x.register_hook(move |g| {
            s.lock().unwrap().push(g.to_vec());
            Some(g.mul_scalar(10.0))
        });
        // d/dx (x*x + 3x) = 2x + 3
        (&(&x * &x) + &x.mul_scalar(3.0)).sum_all().backward();
        assert_eq!(*seen.lock().unwrap(), [vec![5.0, 9.0]]);
        assert_eq!(x.grad().unwrap().to_vec(), [50.0, 90.0]);
    }

    /// A hook on an intermediate tensor changes what reaches the inputs, and
    /// `retain_grad` keeps the hooked gradient.
    fn an_intermediate_hook_changes_the_upstream_gradient<D>(dev) {
        let x: Tensor<(C<3>,), f32, D> =
            Tensor::from_vec_on(vec![1.0, 2.0, 3.0], (C,), dev).unwrap().requires_grad();
        let h = x.mul_scalar(2.0);
        h.retain_grad();
        h.register_hook(|g| Some(g.neg()));
        h.square().sum_all().backward(); // dL/dh = 2h = 4x, negated
        assert_eq!(h.grad().unwrap().to_vec(), [-4.0, -8.0, -12.0]);
        assert_eq!(x.grad().unwrap().to_vec(), [-8.0, -16.0, -24.0]);
    }

    /// Hooks chain in registration order, each seeing the one before's
    /// result; a removed hook stops.
    fn hooks_chain_in_order_and_removed_ones_stop<D>(dev) {
        let x: Tensor<(C<1>,), f64, D> =
            Tensor::from_vec_on(vec![1.0], (C,), dev).unwrap().requires_grad();
        let (order, o1) = log();
        let o2 = Arc::clone(&order);
        let first = x.register_hook(move |g| {
            o1.lock().unwrap().push(("first", g.item()));
            Some(g.add_scalar(1.0))
        });
        x.register_hook(move |g| {
            o2.lock().unwrap().push(("second", g.item()));
            None
        });
        x.mul_scalar(3.0).sum_all().backward();
        assert_eq!(*order.lock().unwrap(), [("first", 3.0), ("second", 4.0)]);
        assert_eq!(x.grad().unwrap().item(), 4.0);
        first.remove();
        x.zero_grad();
        order.lock().unwrap().clear();
        x.mul_scalar(3.0).sum_all().backward();
        assert_eq!(*order.lock().unwrap(), [("second", 3.0)]);
        assert_eq!(x.grad().unwrap().item(), 3.0);
    }

    /// A hook that returns a gradient of other sizes fails the backward
    /// with an error naming the hook and the sizes.
    fn a_hook_returning_other_sizes_fails_the_backward<D>(dev) {
        let x: Tensor<(Dyn,), f32, D> =
            Tensor::from_vec_on(vec![1.0, 2.0], (Dyn(2),), dev).unwrap().requires_grad();
        let d = dev.clone();
        x.register_hook(move |_| Some(Tensor::from_vec_on(vec![1.0], (Dyn(1),), &d).unwrap()));
        let err = x.exp().sum_all().try_backward().unwrap_err();
        assert!(err.to_string().contains("register_hook"), "{err}");
        assert!(err.to_string().contains("[1]"), "{err}");
    }

    /// Hooks need a tensor on the tape; post-accumulate hooks need a leaf.
    fn hooks_need_a_tensor_on_the_tape<D>(dev) {
        let c: Tensor<(C<2>,), f32, D> = Tensor::ones_on((C,), dev);
        let err = c.try_register_hook(|_| None).unwrap_err();
        assert!(
            err.to_string().contains("does not require a gradient"),
            "{err}"
        );
        let x: Tensor<(C<2>,), f32, D> = Tensor::ones_on((C,), dev).requires_grad();
        let err = x
            .exp()
            .try_register_post_accumulate_grad_hook(|_| {})
            .unwrap_err();
        assert!(err.to_string().contains("leaf"), "{err}");
    }

    /// An MLP's parameters become ready from the last layer back, each
    /// once, with its final gradient readable and replaceable in the hook.
    fn post_accumulate_hooks_run_once_per_leaf_last_layer_first<D>(dev) {
        let mut rng = Rng::seed_from(3);
        let w1 = Tensor::<(C<4>, C<3>)>::randn((C, C), &mut rng).to_device(dev).requires_grad();
        let w2 = Tensor::<(C<3>, C<3>)>::randn((C, C), &mut rng).to_device(dev).requires_grad();
        let w3 = Tensor::<(C<3>, C<1>)>::randn((C, C), &mut rng).to_device(dev).requires_grad();
        let x = Tensor::<(C<5>, C<4>)>::randn((C, C), &mut rng).to_device(dev);
        let (ready, r) = log();
        let hook = |name: &'static str, r: &Arc<Mutex<Vec<(&'static str, f32)>>>| {
            let r = Arc::clone(r);
            move |p: &Tensor<(Dyn, Dyn), f32, D>| {
                let g = p.grad().expect("accumulated before the hook runs");
                r.lock().unwrap().push((name, g.sum_all().item()));
                // Halve it, as a DDP bucket would overwrite it.
                p.try_set_grad(&g.mul_scalar(0.5)).unwrap();
            }
        };
        w1.clone()
            .into_dyn()
            .register_post_accumulate_grad_hook(hook("w1", &r));
        w2.clone()
            .into_dyn()
            .register_post_accumulate_grad_hook(hook("w2", &r));
        w3.clone()
            .into_dyn()
            .register_post_accumulate_grad_hook(hook("w3", &r));
        // w2 is used twice: still one call, after both uses are summed.
        let h = x
            .matmul(&w1)
            .relu()
            .matmul(&w2)
            .tanh()
            .matmul(&w2)
            .matmul(&w3);
        h.square().sum_all().backward();
        let ready = ready.lock().unwrap().clone();
        let names: Vec<_> = ready.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["w3", "w2", "w1"]);
        // What the hook saw is the full gradient; what is kept is half of it.
        for ((name, sum), w) in ready.iter().zip([
            w3.clone().into_dyn(),
            w2.clone().into_dyn(),
            w1.clone().into_dyn(),
        ]) {
            let kept = w.grad().unwrap().sum_all().item();
            assert!(
                (kept - 0.5 * sum).abs() <= 1e-5 * sum.abs().max(1.0),
                "{name}: {kept} vs {sum}"
            );
        }
    }
}

/// `queue_callback` from a hook runs once, after every gradient of that
/// backward is in; its error is the backward's; outside a backward it is
/// refused.
#[test]
fn a_queued_callback_runs_after_the_whole_backward() {
    use forma::core::tape::queue_callback;
    let a = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,))
        .unwrap()
        .requires_grad();
    let b = Tensor::<(C<2>,)>::from_vec(vec![3.0, 4.0], (C,))
        .unwrap()
        .requires_grad();
    let (seen, s) = log::<String>();
    let (b2, s2) = (b.clone(), Arc::clone(&s));
    a.register_post_accumulate_grad_hook(move |_| {
        let (b, s) = (b2.clone(), Arc::clone(&s2));
        queue_callback(move || {
            // Both leaves have their gradient by now, whichever came first.
            s.lock().unwrap().push(format!(
                "callback: b.grad = {:?}",
                b.grad().map(|g| g.to_vec())
            ));
            Ok(())
        })
        .unwrap();
    });
    b.register_post_accumulate_grad_hook(move |_| s.lock().unwrap().push("b ready".into()));
    (&a * &b).sum_all().backward();
    let seen_now = seen.lock().unwrap().clone();
    assert_eq!(
        seen_now.last().unwrap(),
        "callback: b.grad = Some([1.0, 2.0])"
    );
    assert_eq!(seen_now.len(), 2, "{seen_now:?}");

    let failing = Tensor::<(C<1>,)>::ones().requires_grad();
    failing.register_post_accumulate_grad_hook(|_| {
        queue_callback(|| Err(forma::core::Error::invalid("test", "the reduction failed")))
            .unwrap();
    });
    let e = failing.sum_all().try_backward().unwrap_err();
    assert!(e.to_string().contains("the reduction failed"), "{e}");
    assert!(queue_callback(|| Ok(())).is_err());
}
