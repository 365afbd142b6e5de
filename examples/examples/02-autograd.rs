//! 02: autograd — fit a line with gradients from the tape.
//!
//! Run with `cargo run --release -p forma-examples --example 02-autograd`.

use forma::prelude::*;

fn main() {
    let mut rng = Rng::seed_from(42);
    // Data: y = 3x - 1 plus a little noise.
    let n = 256;
    let x = Tensor::<(Dyn, C<1>)>::uniform_on((Dyn(n), C), -1.0, 1.0, &mut rng, &Cpu);
    let noise = Tensor::<(Dyn, C<1>)>::normal_on((Dyn(n), C), 0.0, 0.05, &mut rng, &Cpu);
    let y = &(&x * 3.0f32) + &(&noise - 1.0f32);

    // Parameters are leaves: `requires_grad()` puts them on the tape.
    let w = Tensor::<(C<1>, C<1>)>::zeros().requires_grad();
    let b = Tensor::<(C<1>,)>::zeros().requires_grad();
    let lr = 0.5;
    for step in 0..=100 {
        // zero grads, forward, loss, backward, step: the same loop as PyTorch's.
        w.zero_grad();
        b.zero_grad();
        let pred = &x.matmul(&w) + &b;
        let loss = (&pred - &y).square().mean_all();
        loss.backward();
        sgd_step(&w, lr);
        sgd_step(&b, lr);
        if step % 20 == 0 {
            // Reading values is outside the graph; `no_grad()` would also stop recording.
            println!(
                "step {step:>3}  loss {:.5}  w {:.4}  b {:.4}",
                loss.item(),
                w.item(),
                b.item()
            );
        }
    }
    println!(
        "\nfitted y = {:.3} x + {:.3}  (truth: y = 3 x - 1)",
        w.item(),
        b.item()
    );
}

/// Plain gradient descent in place, outside the graph: `p -= lr * p.grad`.
/// `assign` is the checked way to write in place: it moves the tensor's
/// version counter, so a backward that still needs the old values refuses.
fn sgd_step<S: Shape>(p: &Tensor<S>, lr: f32) {
    let g = p.grad().expect("backward ran").to_vec();
    let stepped: Vec<f32> = p.to_vec().iter().zip(g).map(|(v, g)| v - lr * g).collect();
    p.assign(&Tensor::from_vec(stepped, p.shape()).expect("the same sizes"));
}
