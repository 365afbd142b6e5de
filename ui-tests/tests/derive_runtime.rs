//! `#[derive(Module)]` at run time: the keys it produces (in PyTorch's
//! `state_dict` order), what each field attribute does to them, train/eval
//! flags, state_dict loading and the repr. Also `Tensor![..]`/`Shape![..]`.

use forma::nn::{LoadOptions, Training};
use forma::prelude::*;
use std::collections::HashMap;

/// A Linear-like child: a parameter and an optional bias.
#[derive(Module, Debug)]
#[module(name = "Linear", extra_repr = "Self::extra_repr")]
struct Lin {
    weight: Tensor<(C<2>, C<3>)>,
    bias: Option<Tensor<(C<2>,)>>,
}

impl Lin {
    fn new(value: f32, bias: bool) -> Self {
        Lin {
            weight: Tensor::full(value).requires_grad(),
            bias: bias.then(|| Tensor::full(value).requires_grad()),
        }
    }

    fn extra_repr(&self) -> String {
        let bias = if self.bias.is_some() { "True" } else { "False" };
        format!("in_features=3, out_features=2, bias={bias}")
    }
}

/// A BatchNorm-like layer: a parameter, persistent buffers (one an integer
/// scalar) and a non-persistent one, a train/eval flag and plain config.
#[derive(Module, Debug)]
#[module(name = "BatchNorm1d", extra_repr = "Self::describe_config")]
struct Norm {
    weight: Tensor<(C<2>,)>,
    #[module(buffer)]
    running_mean: Tensor<(C<2>,)>,
    #[module(buffer)]
    num_batches_tracked: Tensor<(), i64>,
    #[module(buffer(persistent = false))]
    scratch: Tensor<(C<2>,)>,
    training: Training,
    eps: f64,
    features: usize,
}

impl Norm {
    fn new(value: f32) -> Self {
        Norm {
            weight: Tensor::full(value).requires_grad(),
            running_mean: Tensor::full(value),
            num_batches_tracked: Tensor::full(value as i64),
            scratch: Tensor::full(value),
            training: Training::default(),
            eps: 1e-5,
            features: 2,
        }
    }

    fn describe_config(&self) -> String {
        format!("{}, eps={:e}", self.features, self.eps)
    }
}

/// Flattened into its parent: its keys sit at the parent's level.
#[derive(Module, Debug)]
struct Inner {
    fc: Lin,
    gate: Tensor<(C<1>,)>,
}

#[derive(Module, Debug)]
struct Model {
    blocks: Vec<Lin>,
    pair: [Lin; 2],
    tup: (Lin, Lin),
    absent: Option<Lin>,
    present: Option<Lin>,
    #[module(rename = "attention.self.query")]
    query: Lin,
    #[module(skip)]
    cache: HashMap<String, Vec<f32>>,
    #[module(flatten)]
    inner: Inner,
    norm: Norm,
    // Declared after the children, yet listed first: a module's own
    // parameters, then its buffers, then its children.
    scale: Tensor<(C<1>,)>,
    #[module(buffer)]
    step: Tensor<(), i64>,
    hidden: usize,
    dropout: f64,
    training: Training,
}

impl Model {
    fn new(v: f32) -> Self {
        Model {
            blocks: vec![Lin::new(v, true), Lin::new(v, false)],
            pair: [Lin::new(v, true), Lin::new(v, true)],
            tup: (Lin::new(v, true), Lin::new(v, false)),
            absent: None,
            present: Some(Lin::new(v, true)),
            query: Lin::new(v, true),
            cache: HashMap::new(),
            inner: Inner {
                fc: Lin::new(v, false),
                gate: Tensor::full(v).requires_grad(),
            },
            norm: Norm::new(v),
            scale: Tensor::full(v).requires_grad(),
            step: Tensor::full(v as i64),
            hidden: 16,
            dropout: 0.1,
            training: Training::default(),
        }
    }
}

fn keys<T>(entries: &[(String, T)]) -> Vec<&str> {
    entries.iter().map(|(k, _)| k.as_str()).collect()
}

const PARAMETERS: [&str; 16] = [
    "scale",
    "blocks.0.weight",
    "blocks.0.bias",
    "blocks.1.weight",
    "pair.0.weight",
    "pair.0.bias",
    "pair.1.weight",
    "pair.1.bias",
    "tup.0.weight",
    "tup.0.bias",
    "tup.1.weight",
    "present.weight",
    "present.bias",
    "attention.self.query.weight",
    "attention.self.query.bias",
    "gate",
];

#[test]
fn named_parameters_in_pytorch_order() {
    let m = Model::new(1.0);
    assert!(m.cache.is_empty());
    let params = m.named_parameters();
    let mut want: Vec<&str> = PARAMETERS.to_vec();
    // The flattened child's own parameter, then its child, then `norm`.
    want.extend(["fc.weight", "norm.weight"]);
    assert_eq!(keys(&params), want);
    assert!(params.iter().all(|(_, info)| info.requires_grad));
    assert_eq!(params[0].1.dims, vec![1]);
    assert_eq!(params[1].1.dims, vec![2, 3]);
}

#[test]
fn named_buffers_include_non_persistent_ones() {
    let m = Model::new(1.0);
    let buffers = m.named_buffers();
    assert_eq!(
        keys(&buffers),
        [
            "step",
            "norm.running_mean",
            "norm.num_batches_tracked",
            "norm.scratch"
        ]
    );
    assert_eq!(buffers[0].1.dtype, DType::I64);
    assert_eq!(buffers[0].1.dims, Vec::<usize>::new());
    assert!(buffers.iter().all(|(_, info)| !info.requires_grad));
}

#[test]
fn state_dict_orders_params_buffers_children_and_drops_non_persistent() {
    let m = Model::new(1.0);
    let sd = m.state_dict();
    let mut want: Vec<&str> = vec!["scale", "step"];
    want.extend(&PARAMETERS[1..]);
    want.extend([
        "fc.weight",
        "norm.weight",
        "norm.running_mean",
        "norm.num_batches_tracked",
    ]);
    assert_eq!(sd.keys().collect::<Vec<_>>(), want);
    assert!(!sd.contains_key("norm.scratch"));
    assert!(sd
        .keys()
        .all(|k| !k.contains("cache") && !k.contains("absent")));
}

#[test]
fn num_parameters_counts_every_element() {
    let m = Model::new(1.0);
    // Lin with bias: 6 + 2; without: 6. Blocks 8 + 6, pair 16, tup 8 + 6,
    // present 8, query 8, fc 6, gate 1, norm.weight 2, scale 1.
    assert_eq!(m.num_parameters(), 14 + 16 + 14 + 8 + 8 + 6 + 1 + 2 + 1);
}

#[test]
fn train_and_eval_reach_nested_flags() {
    let mut m = Model::new(1.0);
    assert!(m.is_training());
    m.eval();
    assert!(!m.is_training());
    assert_eq!(m.training, Training(false));
    assert_eq!(m.norm.training, Training(false));
    assert!(!m.norm.is_training());
    m.train();
    assert!(m.is_training());
    assert!(m.norm.training.is_on());
    m.norm.eval();
    assert!(m.training.is_on());
    assert!(!m.norm.training.is_on());
}

#[test]
fn load_state_dict_round_trips() {
    let source = Model::new(3.0);
    let mut m = Model::new(1.0);
    let report = m.load_state_dict(&source.state_dict()).unwrap();
    assert!(report.missing_keys.is_empty() && report.unexpected_keys.is_empty());
    assert_eq!(m.blocks[1].weight.to_vec(), vec![3.0; 6]);
    assert_eq!(m.query.bias.as_ref().unwrap().to_vec(), vec![3.0; 2]);
    assert_eq!(m.inner.gate.to_vec(), vec![3.0]);
    assert_eq!(m.step.item(), 3);
    assert_eq!(m.norm.num_batches_tracked.item(), 3);
    assert_eq!(m.norm.running_mean.to_vec(), vec![3.0; 2]);
    // Not in the state dict, so not loaded.
    assert_eq!(m.norm.scratch.to_vec(), vec![1.0; 2]);
    assert_eq!(m.state_dict(), source.state_dict());
}

#[test]
fn strict_load_reports_missing_and_unexpected_keys_and_changes_nothing() {
    let mut sd = Model::new(3.0).state_dict();
    let mean = sd.remove("norm.running_mean").unwrap();
    sd.insert("norm.runing_mean", mean);
    let mut m = Model::new(1.0);
    let err = m.load_state_dict(&sd).unwrap_err();
    assert_eq!(err.missing_keys, ["norm.running_mean"]);
    assert_eq!(
        err.unexpected_keys,
        [(
            "norm.runing_mean".to_string(),
            Some("norm.running_mean".to_string())
        )]
    );
    assert_eq!(
        err.to_string(),
        "error(s) in loading state_dict:\n  missing keys: norm.running_mean\n  unexpected key: norm.runing_mean (did you mean norm.running_mean?)"
    );
    assert_eq!(m.scale.to_vec(), vec![1.0]);
    assert_eq!(m.norm.weight.to_vec(), vec![1.0; 2]);

    // A lenient load takes what fits and reports the rest.
    let report = m
        .load_state_dict_with(&sd, LoadOptions { strict: false })
        .unwrap();
    assert_eq!(report.missing_keys, ["norm.running_mean"]);
    assert_eq!(report.unexpected_keys, ["norm.runing_mean"]);
    assert_eq!(m.norm.weight.to_vec(), vec![3.0; 2]);
    assert_eq!(m.norm.running_mean.to_vec(), vec![1.0; 2]);
}

#[test]
fn shape_mismatch_is_refused_and_changes_nothing() {
    let mut sd = Model::new(3.0).state_dict();
    sd.insert("scale", Tensor::<(C<2>,)>::full(5.0).to_data());
    let mut m = Model::new(1.0);
    let err = m.load_state_dict(&sd).unwrap_err();
    assert_eq!(err.mismatched.len(), 1);
    assert_eq!(err.mismatched[0].key, "scale");
    assert_eq!(
        err.to_string(),
        "error(s) in loading state_dict:\n  scale: the checkpoint has [2] float32 but the model needs [1] float32"
    );
    assert_eq!(m.scale.to_vec(), vec![1.0]);
    assert_eq!(m.blocks[0].weight.to_vec(), vec![1.0; 6]);
}

#[test]
fn repr_prints_like_pytorch() {
    let m = Model::new(1.0);
    let want = "\
Model(
  (blocks): ModuleList(
    (0): Linear(in_features=3, out_features=2, bias=True)
    (1): Linear(in_features=3, out_features=2, bias=False)
  )
  (pair): ModuleList(
    (0-1): 2 x Linear(in_features=3, out_features=2, bias=True)
  )
  (tup): Sequential(
    (0): Linear(in_features=3, out_features=2, bias=True)
    (1): Linear(in_features=3, out_features=2, bias=False)
  )
  (present): Linear(in_features=3, out_features=2, bias=True)
  (attention.self.query): Linear(in_features=3, out_features=2, bias=True)
  (fc): Linear(in_features=3, out_features=2, bias=False)
  (norm): BatchNorm1d(2, eps=1e-5)
)";
    assert_eq!(m.repr(), want);
    assert_eq!(m.norm.repr(), "BatchNorm1d(2, eps=1e-5)");
}

/// A stack of any module type.
#[derive(Module)]
struct Stack<M> {
    layers: Vec<M>,
}

/// Generic over the element type and the device, with a where clause.
#[derive(Module)]
struct Net<E: Float, D: forma::core::Backend>
where
    E: Copy,
{
    fc: Tensor<(C<2>, C<2>), E, D>,
    #[module(buffer)]
    mean: Tensor<(C<2>,), E, D>,
}

/// A const parameter and a lifetime.
#[derive(Module)]
struct Window<'a, const N: usize> {
    w: Tensor<Shape![{ N }, 2]>,
    #[module(skip)]
    label: &'a str,
}

/// A tuple struct: keys are the positions.
#[derive(Module)]
struct Pair(Lin, #[module(rename = "second")] Lin);

/// A unit struct: no tensors, a bare repr.
#[derive(Module)]
struct Relu;

/// A recursive module (its field names the struct itself).
#[derive(Module)]
struct Tree {
    w: Tensor<(C<1>,)>,
    children: Vec<Tree>,
}

#[test]
fn generic_tuple_unit_and_recursive_structs_derive() {
    let stack = Stack {
        layers: vec![Lin::new(1.0, true), Lin::new(1.0, false)],
    };
    assert_eq!(
        stack.state_dict().keys().collect::<Vec<_>>(),
        ["layers.0.weight", "layers.0.bias", "layers.1.weight"]
    );
    let nested = Stack {
        layers: vec![Stack { layers: vec![Relu] }],
    };
    assert_eq!(
        nested.repr(),
        "Stack(\n  (layers): ModuleList(\n    (0): Stack(\n      (layers): ModuleList(\n        (0): Relu()\n      )\n    )\n  )\n)"
    );

    let net = Net::<f64, Cpu> {
        fc: Tensor::zeros(),
        mean: Tensor::zeros(),
    };
    assert_eq!(keys(&net.named_parameters()), ["fc"]);
    assert_eq!(keys(&net.named_buffers()), ["mean"]);
    assert_eq!(net.named_buffers()[0].1.dtype, DType::F64);

    let sized = Window::<3> {
        w: Tensor::zeros(),
        label: "w",
    };
    assert_eq!(sized.named_parameters()[0].1.dims, vec![3, 2]);
    assert_eq!(sized.label, "w");

    let pair = Pair(Lin::new(1.0, false), Lin::new(1.0, false));
    assert_eq!(
        keys(&pair.named_parameters()),
        ["0.weight", "second.weight"]
    );
    assert_eq!(
        pair.repr(),
        "Pair(\n  (0): Linear(in_features=3, out_features=2, bias=False)\n  (second): Linear(in_features=3, out_features=2, bias=False)\n)"
    );

    assert!(Relu.state_dict().is_empty());
    assert_eq!(Relu.repr(), "Relu()");
    assert_eq!(Relu.num_parameters(), 0);

    let leaf = || Tree {
        w: Tensor::zeros(),
        children: Vec::new(),
    };
    let tree = Tree {
        w: Tensor::zeros(),
        children: vec![leaf(), leaf()],
    };
    assert_eq!(
        tree.state_dict().keys().collect::<Vec<_>>(),
        ["w", "children.0.w", "children.1.w"]
    );
}

fn same_type<T>(_: &T, _: &T) {}

#[test]
fn tensor_and_shape_macros_write_the_types() {
    const N: usize = 4;
    let a: Tensor![2, 3] = Tensor::zeros();
    same_type(&a, &Tensor::<(C<2>, C<3>)>::zeros());
    let b: Tensor![Dyn, { N * 2 }; f64] = Tensor::zeros_with((Dyn(5), C));
    same_type(&b, &Tensor::<(Dyn, C<8>), f64>::zeros_with((Dyn(5), C)));
    assert_eq!(b.dims().to_vec(), [5, 8]);
    let c: Tensor![7; i64, Cpu] = Tensor::zeros();
    same_type(&c, &Tensor::<(C<7>,), i64, Cpu>::zeros());
    let d: Tensor![] = Tensor::full(2.0);
    assert_eq!(d.item(), 2.0);
    let s: Shape![Dyn, 3, One] = (Dyn(2), C, One);
    same_type(&s, &(Dyn(2), C::<3>, One));
}
