//! Forward + backward of an MLP training step (784-512-512-10, batch 128,
//! cross-entropy), the workload `benches/mlp_step.sh` compares with PyTorch.
//! Run alone with `cargo bench -p forma-benches --bench mlp_step`.

use forma::prelude::*;
use forma_benches::median_secs;

fn main() {
    let mut rng = Rng::seed_from(0);
    let batch = 128;
    let scale = |fan_in: f64| 1.0 / fan_in.sqrt();
    let w1 =
        Tensor::<(C<784>, C<512>)>::uniform_on((C, C), -scale(784.0), scale(784.0), &mut rng, &Cpu)
            .requires_grad();
    let b1 = Tensor::<(C<512>,)>::zeros().requires_grad();
    let w2 =
        Tensor::<(C<512>, C<512>)>::uniform_on((C, C), -scale(512.0), scale(512.0), &mut rng, &Cpu)
            .requires_grad();
    let b2 = Tensor::<(C<512>,)>::zeros().requires_grad();
    let w3 =
        Tensor::<(C<512>, C<10>)>::uniform_on((C, C), -scale(512.0), scale(512.0), &mut rng, &Cpu)
            .requires_grad();
    let b3 = Tensor::<(C<10>,)>::zeros().requires_grad();
    let x = Tensor::<(Dyn, C<784>)>::randn((Dyn(batch), C), &mut rng);
    let labels: Vec<i64> = (0..batch as i64).map(|i| i % 10).collect();
    let y = Tensor::<(Dyn, C<1>), i64>::from_vec(labels, (Dyn(batch), C)).unwrap();

    let step = || {
        w1.zero_grad();
        w2.zero_grad();
        w3.zero_grad();
        b1.zero_grad();
        b2.zero_grad();
        b3.zero_grad();
        let h1 = (&x.matmul(&w1) + &b1).relu();
        let h2 = (&h1.matmul(&w2) + &b2).relu();
        let logits = &h2.matmul(&w3) + &b3;
        // Cross-entropy over class indices: -mean(log_softmax(logits)[target]).
        let loss = logits
            .log_softmax::<1>()
            .gather::<1, _>(&y)
            .mean_all()
            .neg();
        loss.backward();
        std::hint::black_box(loss.item());
    };
    let t = median_secs(3, 21, step);
    println!(
        "forma  MLP 784-512-512-10 batch {batch} forward+backward: {:.3} ms (median of 21)",
        t * 1e3
    );
}
