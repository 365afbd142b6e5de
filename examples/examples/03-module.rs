//! 03: a first module — a model as an annotated struct, its PyTorch names,
//! and a training loop.
//!
//! Run with `cargo run --release -p forma-examples --example 03-module`.
//!
//! `#[derive(Module)]` finds the parameters, names them as PyTorch would
//! (`fc1.weight`, ...), and gives `state_dict`, `load_state_dict`,
//! `train`/`eval`, a parameter count and a repr. `#[derive(Sequential)]`
//! writes `forward` by chaining the fields from the declared input shape to
//! the declared output shape, and checks each step when the program is built.

use forma::nn::layers::{Linear, Tanh};
use forma::nn::module::{downcast_mut, Cx, Role, VisitorMut};
use forma::prelude::*;

/// 2 inputs, two hidden layers of 16, one output in (-1, 1).
#[derive(Module, Sequential)]
#[sequential(input = [B, 2], output = [B, 1])]
struct Net {
    fc1: Linear<2, 16>,
    act1: Tanh,
    fc2: Linear<16, 16>,
    act2: Tanh,
    fc3: Linear<16, 1>,
    out: Tanh,
    // Swap `fc2` for `Linear<32, 16>` and the build fails with:
    //   error: layer `fc2` (Linear) takes 32 input features, but receives [B, 16] (16 features) from `act1`
}

impl Net {
    fn new(rng: &mut Rng) -> Self {
        Net {
            fc1: Linear::new(&Cpu, rng),
            act1: Tanh,
            fc2: Linear::new(&Cpu, rng),
            act2: Tanh,
            fc3: Linear::new(&Cpu, rng),
            out: Tanh,
        }
    }
}

/// Plain gradient descent written as a mutable traversal: every f32
/// parameter moves against its gradient. (The nn optimizers do this with
/// momentum, Adam and the rest.)
struct Sgd {
    lr: f64,
}

impl VisitorMut for Sgd {
    fn tensor<S: Shape, E: Dtype, D: forma::core::Backend>(
        &mut self,
        cx: &Cx,
        t: &mut forma::core::Tensor<S, E, D>,
    ) {
        let Some(p) = downcast_mut::<_, _, _, f32, Cpu>(t) else {
            return;
        };
        if cx.role() != Role::Parameter {
            return;
        }
        if let Some(g) = p.grad() {
            let _no_grad = forma::core::tape::no_grad();
            let flat = p.flatten_all();
            flat.assign(&(&flat - &g.flatten_all().mul_scalar(self.lr)));
        }
    }
}

/// Points in the square; label +1 inside the circle of radius 0.6, else -1.
fn data(n: usize, rng: &mut Rng) -> (Tensor<(Dyn, C<2>)>, Tensor<(Dyn, C<1>)>) {
    let x = Tensor::<(Dyn, C<2>)>::uniform_on((Dyn(n), C), -1.0, 1.0, rng, &Cpu);
    let labels: Vec<f32> = x
        .to_vec()
        .chunks(2)
        .map(|p| {
            if p[0] * p[0] + p[1] * p[1] < 0.36 {
                1.0
            } else {
                -1.0
            }
        })
        .collect();
    let y = Tensor::from_vec(labels, (Dyn(n), C)).expect("one label per point");
    (x, y)
}

fn accuracy(net: &Net, x: &Tensor<(Dyn, C<2>)>, y: &Tensor<(Dyn, C<1>)>) -> f32 {
    let _no_grad = forma::core::tape::no_grad();
    let pred = net.forward(x.clone()).to_vec();
    let hits = pred
        .iter()
        .zip(y.to_vec())
        .filter(|(p, t)| (**p > 0.0) == (*t > 0.0))
        .count();
    hits as f32 / pred.len() as f32
}

fn main() {
    let mut rng = Rng::seed_from(7);
    let mut net = Net::new(&mut rng);
    println!("{}\n", net.repr());
    for (name, info) in net.named_parameters() {
        println!("{name:<12} {:?}", info.dims);
    }
    println!("{} parameters\n", net.num_parameters());

    let (x, y) = data(512, &mut rng);
    let (x_test, y_test) = data(512, &mut rng);
    net.train();
    for epoch in 0..=300 {
        net.zero_grad();
        let loss = (&net.forward(x.clone()) - &y).square().mean_all();
        loss.backward();
        net.visit_mut(&mut Cx::new(), &mut Sgd { lr: 0.2 });
        if epoch % 50 == 0 {
            println!("epoch {epoch:>3}  loss {:.4}", loss.item());
        }
    }
    net.eval();
    let acc = accuracy(&net, &x_test, &y_test);
    println!("\nheld-out accuracy {:.1}%", 100.0 * acc);

    // The state_dict has PyTorch's keys; a fresh model loads it strictly.
    let sd = net.state_dict();
    println!("state_dict keys: {:?}", sd.keys().collect::<Vec<_>>());
    let mut copy = Net::new(&mut Rng::seed_from(99));
    copy.load_state_dict(&sd).expect("same architecture");
    assert_eq!(accuracy(&copy, &x_test, &y_test), acc);
    println!("a fresh model loaded the state_dict and scores the same");
}
