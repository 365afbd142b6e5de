// `#[derive(Module)]` and `Tensor![..]`/`Shape![..]` raise no warning in the
// user's crate: a unit struct, a tuple struct, generic structs (type, const
// and lifetime parameters, a where clause) and a struct using every attribute.
#![deny(warnings)]
#![deny(clippy::all, clippy::pedantic)]

use forma::nn::Training;
use forma::prelude::*;

#[derive(Module)]
struct Relu;

#[derive(Module)]
struct Empty {}

#[derive(Module)]
struct Pair(Tensor![2, 3], #[module(rename = "b")] Tensor![2]);

#[derive(Module)]
struct Generic<'a, E: Float, const N: usize, M>
where
    M: Copy,
{
    w: Tensor<Shape![{ N }, 2], E>,
    #[module(skip)]
    label: &'a str,
    #[module(skip)]
    marker: M,
}

#[derive(Module)]
#[module(crate = "::forma::nn", name = "Block", extra_repr = "Self::extra")]
struct Everything {
    #[module(rename = "proj.weight")]
    weight: Tensor![4, 4],
    #[module(buffer)]
    count: Tensor![; i64],
    #[module(buffer(persistent = false))]
    cache: Tensor![4],
    #[module(buffer(persistent = true))]
    mean: Option<Tensor![4]>,
    #[module(flatten)]
    pair: Pair,
    #[module(skip)]
    note: std::collections::HashMap<String, String>,
    layers: Vec<Relu>,
    training: Training,
    dim: usize,
}

impl Everything {
    fn extra(&self) -> String {
        format!("dim={}, notes={}", self.dim, self.note.len())
    }
}

fn main() {
    let e = Everything {
        weight: Tensor::zeros(),
        count: Tensor::zeros(),
        cache: Tensor::zeros(),
        mean: Some(Tensor::zeros()),
        pair: Pair(Tensor::zeros(), Tensor::zeros()),
        note: std::collections::HashMap::new(),
        layers: vec![Relu],
        training: Training::default(),
        dim: 4,
    };
    let keys: Vec<String> = e.state_dict().keys().map(str::to_string).collect();
    assert_eq!(keys, ["proj.weight", "count", "mean", "0", "b"]);
    assert_eq!(
        e.repr(),
        "Block(\n  dim=4, notes=0\n  (layers): ModuleList(\n    (0): Relu()\n  )\n)"
    );
    assert!(e.is_training());

    let g = Generic::<f64, 3, u8> {
        w: Tensor::zeros(),
        label: "g",
        marker: 0,
    };
    assert_eq!(g.named_parameters()[0].1.dims, vec![3, 2]);
    assert_eq!((g.label, g.marker), ("g", 0));
    assert_eq!(Relu.repr(), "Relu()");
    assert_eq!(Empty {}.repr(), "Empty()");
}
