//! Graph capture (`forma::nn::capture`): every op of a forward recorded in
//! order with its attributes and module path, parameters named by their
//! `state_dict` keys, `Dyn` sizes symbolic through shape ops, and the
//! steps capture cannot follow refused with the op and the path.

use forma::nn::capture::{capture, Dim, Op, Source};
use forma::nn::layers::{Conv2d, Flatten, Linear, MaxPool2d, Relu, TransformerEncoderLayer};
use forma::prelude::*;

#[derive(Module, Sequential)]
#[sequential(input = [B, 1, 12, 12], output = [B, 10])]
struct Cnn {
    conv: Conv2d<1, 4, 3>,
    act: Relu,
    pool: MaxPool2d<2>,
    flatten: Flatten,
    fc: Linear<100, 10>,
}

fn cnn() -> Cnn {
    let mut rng = Rng::seed_from(0);
    Cnn {
        conv: Conv2d::new(&Cpu, &mut rng),
        act: Relu,
        pool: MaxPool2d,
        flatten: Flatten,
        fc: Linear::new(&Cpu, &mut rng),
    }
}

#[test]
fn a_cnn_is_captured_in_order_with_paths_and_state_dict_keys() {
    let model = cnn();
    let x = Tensor::<(Dyn, C<1>, C<12>, C<12>)>::zeros_on((Dyn(3), C, C, C), &Cpu);
    let g = capture(&model, x).unwrap();
    let ops: Vec<(&str, &str)> = g
        .nodes
        .iter()
        .map(|n| (n.op.name(), n.path.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            ("conv2d", "conv"),
            ("reshape", "conv"),
            ("add", "conv"),
            ("relu", "act"),
            ("max_pool2d", "pool"),
            ("reshape", "flatten"),
            ("linear", "fc"),
        ]
    );
    let params: Vec<&str> = g.params().map(|(k, _)| k).collect();
    assert_eq!(params, ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]);
    let input = &g.values[g.inputs[0]];
    assert_eq!(
        input.dims,
        [
            Dim::var("batch"),
            Dim::Fixed(1),
            Dim::Fixed(12),
            Dim::Fixed(12)
        ]
    );
    // The flatten keeps the batch symbolic.
    let flat = g.nodes.iter().find(|n| n.path == "flatten").unwrap();
    assert_eq!(
        flat.op,
        Op::Reshape {
            dims: vec![Dim::var("batch"), Dim::Fixed(100)]
        }
    );
    let out = &g.values[g.outputs[0]];
    assert_eq!(out.dims, [Dim::var("batch"), Dim::Fixed(10)]);
    let printed = g.to_string();
    assert!(
        printed.starts_with("graph(%input: f32[batch, 1, 12, 12]):"),
        "{printed}"
    );
    assert!(
        printed.contains("= linear(%v") && printed.contains(", %fc.weight, %fc.bias)  # fc"),
        "{printed}"
    );
}

#[test]
fn attention_keeps_batch_and_sequence_symbolic_through_head_splits() {
    let mut rng = Rng::seed_from(1);
    let mut layer = TransformerEncoderLayer::<16, 4, 32>::new(&Cpu, &mut rng);
    layer.eval();
    let x = Tensor::<(Dyn, Dyn, C<16>)>::randn((Dyn(2), Dyn(5), C), &mut rng);
    let g = capture(&layer, x).unwrap();
    let (b, s) = (Dim::var("batch"), Dim::var("seq"));
    let splits: Vec<&Op> = g
        .nodes
        .iter()
        .map(|n| &n.op)
        .filter(|op| matches!(op, Op::Reshape { .. }))
        .collect();
    assert!(!splits.is_empty());
    for op in &splits {
        let Op::Reshape { dims } = op else {
            unreachable!()
        };
        let mut syms = Vec::new();
        for d in dims {
            d.symbols(&mut syms);
        }
        assert!(syms.iter().all(|n| n == "batch" || n == "seq"), "{op}");
        assert!(
            dims.iter().any(|d| d.fixed().is_none()),
            "a reshape lost its symbols: {op}"
        );
    }
    let out = &g.values[g.outputs[0]];
    assert_eq!(out.dims, [b, s, Dim::Fixed(16)]);
    for n in &g.nodes {
        assert!(
            n.path.starts_with("self_attn")
                || n.path.starts_with("linear")
                || n.path.starts_with("norm")
                || n.path.is_empty()
                || n.path.starts_with("dropout"),
            "{}",
            n.path
        );
    }
    assert!(g.params().count() >= 12);
    assert!(
        g.values
            .iter()
            .all(|v| !matches!(v.source, Source::Constant(_))),
        "{g}"
    );
}

/// A forward that reads its own activations on the host.
#[derive(Module)]
struct Peeks {
    fc: Linear<4, 4>,
}

impl Forward<Tensor<(Dyn, C<4>)>, Tensor<(Dyn, C<4>)>> for Peeks {
    fn try_forward(&self, x: Tensor<(Dyn, C<4>)>) -> forma::Result<Tensor<(Dyn, C<4>)>> {
        let h: Tensor<(Dyn, C<4>)> = child!(self.fc, x)?;
        if h.to_vec()[0] > 0.0 {
            Ok(h.relu())
        } else {
            Ok(h)
        }
    }
}

#[test]
fn a_host_read_of_activations_stops_the_capture_naming_the_op() {
    let mut rng = Rng::seed_from(2);
    let model = Peeks {
        fc: Linear::new(&Cpu, &mut rng),
    };
    let x = Tensor::<(Dyn, C<4>)>::randn((Dyn(2), C), &mut rng);
    let err = capture(&model, x).unwrap_err().to_string();
    assert!(
        err.contains("`to_vec`") && err.contains("data-dependent"),
        "{err}"
    );
}
