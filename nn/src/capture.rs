//! Graph capture of a model's forward, like `torch.export.export`: the
//! model runs once on example inputs and every op it ran is recorded, with
//! its module path, into a [`Graph`] whose parameters are named by their
//! `state_dict` keys and whose `Dyn` input sizes stay symbolic.
//!
//! ```
//! use forma::prelude::*;
//! use forma::nn::capture::capture;
//! use forma::nn::layers::{Linear, Relu};
//!
//! #[derive(Module, Sequential)]
//! #[sequential(input = [B, 4], output = [B, 2])]
//! struct Mlp {
//!     fc1: Linear<4, 8>,
//!     act: Relu,
//!     fc2: Linear<8, 2>,
//! }
//!
//! let mut rng = Rng::seed_from(0);
//! let model = Mlp { fc1: Linear::new(&Cpu, &mut rng), act: Relu, fc2: Linear::new(&Cpu, &mut rng) };
//! let x = Tensor::<(Dyn, C<4>)>::zeros_on((Dyn(3), C), &Cpu);
//! let graph = capture(&model, x).unwrap();
//! assert_eq!(graph.op_names(), ["linear", "relu"]);
//! let text = graph.to_string();
//! assert!(text.contains("%v5: f32[batch, 8] = linear(%input, %fc1.weight, %fc1.bias)  # fc1"));
//! // graph(%input: f32[batch, 4]):
//! //     %fc1.weight: f32[8, 4] = param
//! //     ...
//! //     %v5: f32[batch, 8] = linear(%input, %fc1.weight, %fc1.bias)  # fc1
//! //     %v6: f32[batch, 8] = relu(%v5)  # act
//! //     %v7: f32[batch, 2] = linear(%v6, %fc2.weight, %fc2.bias)  # fc2
//! //     return (%v7)
//! ```
//!
//! The capture runs under `no_grad` (it records the forward, not a
//! training step). What it cannot follow stops it with an error naming the
//! op and the module path ([`forma_core::graph`] lists the cases): a host
//! read of values computed from the inputs, an in-place write into a
//! captured value, or an op with no graph form.

use crate::module::{Cx, Forward, Module, Visitor};
use forma_core::graph::{Capture, Traced};
use forma_core::{Backend, Dtype, Error, Result, Shape, Tensor};

pub use forma_core::graph::{Dim, Elem, Graph, Node, Op, Source, Symbol, Value, ValueId};

/// Names for a capture's inputs and their symbolic sizes.
#[derive(Clone, Debug, Default)]
pub struct CaptureOptions {
    /// The inputs' names, in order (default `input`, or `input0`, `input1`,
    /// .. for several).
    pub input_names: Vec<String>,
    /// For each input, the names of its `Dyn` sizes in axis order; a name
    /// used in two inputs is one size. Default: `batch` for axis 0, `seq`
    /// for axis 1, `<input>_<axis>` beyond.
    pub dim_names: Vec<Vec<String>>,
}

/// Captures `model`'s forward on the example input `x` (a tensor or a
/// tuple of them) with the default names; see [`capture_with`].
///
/// # Errors
/// As [`capture_with`].
pub fn capture<M, X, Y>(model: &M, x: X) -> Result<Graph>
where
    M: Module + Forward<X, Y>,
    X: Traced,
    Y: Traced,
{
    capture_with(model, x, &CaptureOptions::default())
}

/// Captures `model`'s forward on the example input `x`.
///
/// The forward runs twice: on `x`, and on `x` with every `Dyn` size grown
/// (the new positions repeat the last one); the two graphs must be the
/// same, so a forward whose computation depends on its sizes in a way the
/// graph cannot express (a loop over a `Dyn` size, a table built on the
/// host at the example's length) is refused instead of captured at one
/// size. An example must leave room for its sizes to grow by a few.
/// Where the example has a size of 1 (a batch of one), which the capture
/// cannot tell from a fixed 1, and the two graphs differ, a third run at
/// sizes grown twice as far decides: if it agrees with the second, the
/// second's graph is the capture.
///
/// # Errors
/// What the forward returns; or, from the capture, the first op it could not
/// record (a host read of data-dependent values, an in-place write into a
/// captured value, an op with no graph form), with its module path; a
/// symbol given two different sizes; or a graph that changes with the
/// input sizes.
pub fn capture_with<M, X, Y>(model: &M, x: X, opts: &CaptureOptions) -> Result<Graph>
where
    M: Module + Forward<X, Y>,
    X: Traced,
    Y: Traced,
{
    let inputs = x.traced();
    let mut names = Vec::with_capacity(inputs.len());
    for (i, (_, dynamic)) in inputs.iter().enumerate() {
        let name = match (opts.input_names.get(i), inputs.len()) {
            (Some(n), _) => n.clone(),
            (None, 1) => "input".to_string(),
            (None, _) => format!("input{i}"),
        };
        let dims = match opts.dim_names.get(i) {
            Some(n) => n.clone(),
            None => default_dim_names(&name, dynamic),
        };
        names.push((name, dims));
    }
    // The second example: symbol k (in order of appearance) longer by
    // k + 1, so two symbols of equal size at the example differ here.
    let mut symbols: Vec<&str> = Vec::new();
    let extra: Vec<Vec<usize>> = inputs
        .iter()
        .zip(&names)
        .map(|((_, dynamic), (_, dims))| {
            let mut dims = dims.iter();
            dynamic
                .iter()
                .map(|&dy| {
                    let Some(sym) = dy.then(|| dims.next()).flatten() else {
                        return 0;
                    };
                    let k = match symbols.iter().position(|s| *s == sym.as_str()) {
                        Some(k) => k,
                        None => {
                            symbols.push(sym);
                            symbols.len() - 1
                        }
                    };
                    k + 1
                })
                .collect()
        })
        .collect();
    let (second, third) = if symbols.is_empty() {
        (None, None)
    } else {
        let twice: Vec<Vec<usize>> = extra
            .iter()
            .map(|e| e.iter().map(|n| 2 * n).collect())
            .collect();
        (
            Some(x.grown(&extra, &mut 0)?),
            Some(x.grown(&twice, &mut 0)?),
        )
    };
    let graph = capture_once(model, x, &names)?;
    if let (Some(x2), Some(x3)) = (second, third) {
        let grown = capture_once(model, x2, &names)?;
        if let Err(e) = graph.check_same_as(&grown) {
            // A size of 1 in the example reads as a number where the graph
            // needs the symbol (a mask broadcast over a batch of 1), so
            // the graphs differ; then the grown examples, which have no 1,
            // decide: if they agree, the first grown one's graph serves
            // (it is checked at the call's sizes when it replays).
            if !graph.symbols.iter().any(|s| s.example == 1) {
                return Err(e);
            }
            return match capture_once(model, x3, &names) {
                Ok(g3) if grown.check_same_as(&g3).is_ok() => Ok(grown),
                _ => Err(e),
            };
        }
    }
    Ok(graph)
}

/// One capture of the forward on `x`, its inputs named by `names`.
fn capture_once<M, X, Y>(model: &M, x: X, names: &[(String, Vec<String>)]) -> Result<Graph>
where
    M: Module + Forward<X, Y>,
    X: Traced,
    Y: Traced,
{
    let _no_grad = forma_core::tape::no_grad();
    let cap = Capture::start(crate::scope::current_path)?;
    for ((v, dynamic), (name, dims)) in x.traced().iter().zip(names) {
        cap.input(name, v, dynamic, dims)?;
    }
    struct Params<'a>(&'a Capture, Option<Error>);
    impl Visitor for Params<'_> {
        fn tensor<S: Shape, E: Dtype, D: Backend>(&mut self, cx: &Cx, t: &Tensor<S, E, D>) {
            if self.1.is_none() {
                if let Err(e) = self.0.param(cx.path(), &t.val()) {
                    self.1 = Some(e);
                }
            }
        }
    }
    let mut params = Params(&cap, None);
    model.visit(&mut Cx::new(), &mut params);
    if let Some(e) = params.1 {
        return Err(e);
    }
    let y = model.try_forward(x)?;
    let outs: Vec<_> = y.traced().into_iter().map(|(v, _)| v).collect();
    cap.finish(&outs)
}

/// `batch` for a `Dyn` axis 0, `seq` for axis 1, `<input>_<axis>` beyond.
fn default_dim_names(input: &str, dynamic: &[bool]) -> Vec<String> {
    dynamic
        .iter()
        .enumerate()
        .filter(|(_, &d)| d)
        .map(|(axis, _)| match axis {
            0 => "batch".to_string(),
            1 => "seq".to_string(),
            _ => format!("{input}_{axis}"),
        })
        .collect()
}
