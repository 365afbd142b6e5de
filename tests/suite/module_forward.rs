//! Fallible forward, module paths in errors, and module forward hooks.
//!
//! - `try_forward` returns what the layers' ops raise, and `forward` panics
//!   with the same message;
//! - an error raised inside a named child carries the dotted path of the
//!   module that raised it, in `state_dict` names (renames, list indices);
//! - forward pre/post hooks see and replace a module's input and output,
//!   chain in registration order, match `*` steps, stop once removed, and a
//!   hook of the wrong type is an error rather than skipped.
//!
//! Module hooks are kept per process and the tests of this binary run in
//! parallel, so every hooked path here is a field name no other test uses,
//! and the hook tests take turns with their own other-device variants.

use crate::common::*;
use forma::nn::layers::{
    Bilinear, Conv1d, Embedding, Flatten, Linear, Relu, TransformerEncoderLayer,
};
use forma::nn::{hooks, scope};
use forma::prelude::*;
use forma::Error;
use std::sync::{Arc, Mutex};

/// `[batch, 2, 4]` flattened to `[batch, 8]`, then projected: the flatten
/// fails at run time when the middle size is not 2.
#[derive(Module)]
struct Block<D: Device<f32>> {
    #[module(rename = "flatten")]
    flat: Flatten,
    fc: Linear<8, 2, f32, D>,
}

impl<D: Device<f32>> Forward<Tensor<(Dyn, Dyn, C<4>), f32, D>, Tensor<(Dyn, C<2>), f32, D>>
    for Block<D>
{
    fn try_forward(
        &self,
        x: Tensor<(Dyn, Dyn, C<4>), f32, D>,
    ) -> forma::Result<Tensor<(Dyn, C<2>), f32, D>> {
        let h: Tensor<(Dyn, C<8>), f32, D> = child!(self.flat, x)?;
        child!(self.fc, h)
    }
}

/// Runs block `i` on input `i`.
#[derive(Module)]
struct Net<D: Device<f32>> {
    blocks: Vec<Block<D>>,
}

type Seq<D> = Tensor<(Dyn, Dyn, C<4>), f32, D>;

impl<D: Device<f32>> Forward<Vec<Seq<D>>, Vec<Tensor<(Dyn, C<2>), f32, D>>> for Net<D> {
    fn try_forward(&self, xs: Vec<Seq<D>>) -> forma::Result<Vec<Tensor<(Dyn, C<2>), f32, D>>> {
        xs.into_iter()
            .enumerate()
            .map(|(i, x)| child!(self.blocks[i], x))
            .collect()
    }
}

fn net<D: Device<f32>>(dev: &D) -> Net<D> {
    let mut rng = Rng::seed_from(0);
    let blocks = (0..2)
        .map(|_| Block {
            flat: Flatten,
            fc: Linear::new(dev, &mut rng),
        })
        .collect();
    Net { blocks }
}

device_tests! {
    /// The error of block 1's flatten names `blocks.1.flatten` (the field's
    /// rename, not its Rust name), and the op's own message follows.
    fn an_error_carries_the_path_of_the_module_that_raised_it<D>(dev) {
        let net = net::<D>(dev);
        let good = Tensor::zeros_on((Dyn(3), Dyn(2), C), dev);
        let bad = Tensor::zeros_on((Dyn(3), Dyn(5), C), dev);
        let ok = net.try_forward(vec![good.clone(), good.clone()]).unwrap();
        assert_eq!(ok[1].dims()[..], [3, 2]);

        let err = net.try_forward(vec![good, bad]).unwrap_err();
        assert_eq!(err.module_path(), Some("blocks.1.flatten"));
        assert!(matches!(err.innermost(), Error::Shape(_)), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.starts_with("blocks.1.flatten: flatten: expected shape [_, 8], got [3, 5, 4]"),
            "{msg}"
        );
        // Nothing is left on the path stack, on success or on failure.
        assert_eq!(scope::current_path(), "");
    }

    /// `forward` panics with the same message, path first.
    fn forward_panics_with_the_error_and_its_path<D>(dev) {
        let net = net::<D>(dev);
        let bad = Tensor::zeros_on((Dyn(1), Dyn(3), C), dev);
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            net.forward(vec![bad]);
        }))
        .expect_err("a flatten of 12 values into 8");
        let msg = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.starts_with("blocks.0.flatten: flatten:"), "{msg}");
        assert_eq!(scope::current_path(), "", "the unwinding popped the path");
    }

    /// Layers that used to panic on a bad run-time size return the error.
    fn layers_return_their_ops_errors<D>(dev) {
        let mut rng = Rng::seed_from(1);
        let bilinear = Bilinear::<2, 3, 4, f32, D>::new(dev, &mut rng);
        let x1: Tensor<(Dyn, C<2>), f32, D> = Tensor::zeros_on((Dyn(3), C), dev);
        let x2: Tensor<(Dyn, C<3>), f32, D> = Tensor::zeros_on((Dyn(2), C), dev);
        let err = bilinear.try_forward((x1, x2)).unwrap_err();
        assert!(err.to_string().starts_with("Bilinear: expected shape"), "{err}");

        // A stated output length that the input's length does not give.
        let conv = Conv1d::<1, 1, 3, 1, 0, 1, f32, D>::new(dev, &mut rng);
        let x: Tensor<(Dyn, C<1>, Dyn), f32, D> = Tensor::zeros_on((Dyn(1), C, Dyn(6)), dev);
        let r: forma::Result<Tensor<(Dyn, C<1>, C<5>), f32, D>> = conv.try_forward(x);
        let err = r.unwrap_err().to_string();
        assert!(err.starts_with("Conv1d: the stated output length does not fit"), "{err}");

        let emb = Embedding::<4, 2, f32, D>::new(dev, &mut rng);
        let idx: Tensor<(C<2>,), i64, D> = Tensor::from_vec_on(vec![1, 9], (C,), dev).unwrap();
        let r: forma::Result<Tensor<(C<2>, C<2>), f32, D>> = emb.try_forward(idx);
        assert!(matches!(r.unwrap_err(), Error::IndexOutOfRange { index: 9, size: 4, .. }));
    }
}

fn mlp_input<D: Device<f32>>(dev: &D) -> Tensor<(Dyn, C<4>), f32, D> {
    let v = (1..=12).map(|v| v as f32 / 4.0).collect();
    Tensor::from_vec_on(v, (Dyn(3), C), dev).unwrap()
}

fn log<T: Send + 'static>() -> (Arc<Mutex<Vec<T>>>, Arc<Mutex<Vec<T>>>) {
    let l = Arc::new(Mutex::new(Vec::new()));
    (Arc::clone(&l), l)
}

/// Hooks are per process: the CPU and CUDA variants of one test hook the
/// same paths with different tensor types, so hook tests take turns.
fn hook_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Module, Sequential)]
#[sequential(input = [Dyn, 4], output = [Dyn, 2])]
struct PostMlp<D: Device<f32>> {
    post_fc1: Linear<4, 8, f32, D>,
    post_act: Relu,
    post_fc2: Linear<8, 2, f32, D>,
}

#[derive(Module, Sequential)]
#[sequential(input = [Dyn, 4], output = [Dyn, 2])]
struct PreMlp<D: Device<f32>> {
    pre_fc1: Linear<4, 8, f32, D>,
    pre_act: Relu,
    pre_fc2: Linear<8, 2, f32, D>,
}

#[derive(Module)]
struct Wild<D: Device<f32>> {
    wild_layers: Vec<Linear<4, 4, f32, D>>,
}

impl<D: Device<f32>> Forward<Tensor<(Dyn, C<4>), f32, D>, Tensor<(Dyn, C<4>), f32, D>> for Wild<D> {
    fn try_forward(
        &self,
        mut x: Tensor<(Dyn, C<4>), f32, D>,
    ) -> forma::Result<Tensor<(Dyn, C<4>), f32, D>> {
        for i in 0..self.wild_layers.len() {
            x = child!(self.wild_layers[i], x)?;
        }
        Ok(x)
    }
}

#[derive(Module, Sequential)]
#[sequential(input = [Dyn, 4], output = [Dyn, 2])]
struct Typed<D: Device<f32>> {
    typed_fc1: Linear<4, 8, f32, D>,
    typed_act: Relu,
    typed_fc2: Linear<8, 2, f32, D>,
}

#[derive(Module)]
struct Encoder<D: Device<f32>> {
    enc_layer: TransformerEncoderLayer<8, 2, 16, f32, D>,
}

type Tokens<D> = Tensor<(Dyn, Dyn, C<8>), f32, D>;

impl<D: Device<f32>> Forward<Tokens<D>, Tokens<D>> for Encoder<D> {
    fn try_forward(&self, x: Tokens<D>) -> forma::Result<Tokens<D>> {
        child!(self.enc_layer, x)
    }
}

device_tests! {
    /// A forward hook sees the output of its module, its `Some` replaces it,
    /// and after `remove` it no longer runs.
    fn a_forward_hook_sees_and_replaces_the_output<D>(dev) {
        let _turn = hook_lock();
        let mut rng = Rng::seed_from(2);
        let m = PostMlp {
            post_fc1: Linear::new(dev, &mut rng),
            post_act: Relu,
            post_fc2: Linear::new(dev, &mut rng),
        };
        let plain = m.forward(mlp_input(dev));
        let (seen, s) = log();
        let handle = hooks::register_forward_hook(
            "post_act",
            move |path, y: &Tensor<(Dyn, C<8>), f32, D>| {
                s.lock().unwrap().push((path.to_string(), y.to_vec()));
                Some(y.zeros_like())
            },
        );
        let hooked = m.forward(mlp_input(dev));
        handle.remove();
        // A zero hidden layer leaves the second layer's bias.
        let bias = m.post_fc2.bias.as_ref().unwrap().to_vec();
        assert_eq!(hooked.to_vec(), [bias.clone(), bias.clone(), bias].concat());
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, "post_act");
        let relu = m.post_fc1.forward(mlp_input(dev)).relu().to_vec();
        assert_eq!(seen[0].1, relu, "the hook saw the ReLU's output");
        assert_eq!(m.forward(mlp_input(dev)).to_vec(), plain.to_vec(), "removed");
    }

    /// A pre-hook sees the input and its `Some` replaces it; hooks on one
    /// path chain in registration order, each seeing the one before's result.
    fn pre_hooks_replace_the_input_and_chain_in_order<D>(dev) {
        let _turn = hook_lock();
        let mut rng = Rng::seed_from(3);
        let m = PreMlp {
            pre_fc1: Linear::new(dev, &mut rng),
            pre_act: Relu,
            pre_fc2: Linear::new(dev, &mut rng),
        };
        let (order, o) = log();
        let o2 = Arc::clone(&o);
        let first = hooks::register_forward_pre_hook(
            "pre_fc1",
            move |_, x: &Tensor<(Dyn, C<4>), f32, D>| {
                o.lock().unwrap().push(("first", x.to_vec()[0]));
                Some(x.mul_scalar(2.0))
            },
        );
        let second = hooks::register_forward_pre_hook(
            "pre_fc1",
            move |_, x: &Tensor<(Dyn, C<4>), f32, D>| {
                o2.lock().unwrap().push(("second", x.to_vec()[0]));
                None
            },
        );
        let hooked = m.forward(mlp_input(dev));
        first.remove();
        second.remove();
        assert_eq!(*order.lock().unwrap(), [("first", 0.25), ("second", 0.5)]);
        let doubled = m.forward(mlp_input(dev).mul_scalar(2.0));
        assert_eq!(hooked.to_vec(), doubled.to_vec());
    }

    /// `*` matches one step: every element of a list, with its own path.
    fn a_star_step_matches_every_element_of_a_list<D>(dev) {
        let _turn = hook_lock();
        let mut rng = Rng::seed_from(4);
        let m = Wild {
            wild_layers: (0..3).map(|_| Linear::new(dev, &mut rng)).collect(),
        };
        let (paths, p) = log();
        let h = hooks::register_forward_hook(
            "wild_layers.*",
            move |path, _: &Tensor<(Dyn, C<4>), f32, D>| {
                p.lock().unwrap().push(path.to_string());
                None
            },
        );
        m.forward(mlp_input(dev));
        h.remove();
        assert_eq!(
            *paths.lock().unwrap(),
            ["wild_layers.0", "wild_layers.1", "wild_layers.2"]
        );
    }

    /// A hook whose type is not the module's makes the forward fail, naming
    /// the path and both types, rather than being skipped in silence.
    fn a_hook_of_another_type_is_an_error<D>(dev) {
        let _turn = hook_lock();
        let mut rng = Rng::seed_from(5);
        let m = Typed {
            typed_fc1: Linear::new(dev, &mut rng),
            typed_act: Relu,
            typed_fc2: Linear::new(dev, &mut rng),
        };
        let h = hooks::register_forward_hook(
            "typed_fc2",
            |_, _: &Tensor<(Dyn, C<3>), f32, D>| None,
        );
        let err = m.try_forward(mlp_input(dev)).unwrap_err();
        h.remove();
        assert_eq!(err.module_path(), Some("typed_fc2"));
        let msg = err.to_string();
        assert!(
            msg.contains("forward_hook: the hook registered for `typed_fc2` sees a `"),
            "{msg}"
        );
        assert!(msg.contains("C<3>") && msg.contains("C<2>"), "{msg}");
        assert!(m.try_forward(mlp_input(dev)).is_ok(), "removed");
    }

    /// The built-in composite layers run their children as named children,
    /// so a hook reaches inside them with the `state_dict` path.
    fn hooks_reach_inside_built_in_layers<D>(dev) {
        let _turn = hook_lock();
        let mut rng = Rng::seed_from(6);
        let mut m = Encoder {
            enc_layer: TransformerEncoderLayer::new(dev, &mut rng),
        };
        m.eval();
        let (paths, p) = log();
        let p2 = Arc::clone(&p);
        let a = hooks::register_forward_hook(
            "enc_layer.linear2",
            move |path, _: &Tokens<D>| {
                p.lock().unwrap().push(path.to_string());
                None
            },
        );
        let b = hooks::register_forward_hook(
            "enc_layer.self_attn.out_proj",
            move |path, _: &Tokens<D>| {
                p2.lock().unwrap().push(path.to_string());
                None
            },
        );
        let x = Tokens::<Cpu>::randn((Dyn(2), Dyn(3), C), &mut rng).to_device(dev);
        let y = m.forward(x.clone());
        a.remove();
        b.remove();
        assert_eq!(
            *paths.lock().unwrap(),
            ["enc_layer.self_attn.out_proj", "enc_layer.linear2"]
        );
        assert_eq!(
            y.to_vec(),
            m.enc_layer.forward(x).to_vec(),
            "hooks that return None change nothing"
        );
    }
}
