//! Kernel throughput: square f32 matmul (GFLOP/s) and a fused-looking
//! elementwise chain `gelu(x * w + b)` (GB/s). Run with
//! `cargo bench -p forma-benches --bench kernels`.

use forma::prelude::*;
use forma_benches::median_secs;

fn matmul(n: usize, rng: &mut Rng) {
    let a = Tensor::<(Dyn, Dyn)>::randn((Dyn(n), Dyn(n)), rng);
    let b = Tensor::<(Dyn, Dyn)>::randn((Dyn(n), Dyn(n)), rng);
    let rounds = if n >= 1024 { 5 } else { 21 };
    let t = median_secs(2, rounds, || {
        std::hint::black_box(a.matmul(&b));
    });
    println!(
        "matmul f32 {n:>4}x{n:<4}  {:>8.1} GFLOP/s  ({:.3} ms)",
        2.0 * (n as f64).powi(3) / t / 1e9,
        t * 1e3
    );
}

fn main() {
    let mut rng = Rng::seed_from(0);
    for n in [128, 256, 512, 1024] {
        matmul(n, &mut rng);
    }
    let n = 1 << 22;
    let x = Tensor::<(Dyn,)>::randn((Dyn(n),), &mut rng);
    let w = Tensor::<(Dyn,)>::randn((Dyn(n),), &mut rng);
    let b = Tensor::<(Dyn,)>::randn((Dyn(n),), &mut rng);
    let t = median_secs(2, 11, || {
        std::hint::black_box((&(&x * &w) + &b).gelu());
    });
    // Effective bytes: three inputs read and one output written, as PyTorch's figure counts them.
    println!(
        "gelu(x * w + b) 4M f32  {:>8.2} GB/s effective  ({:.3} ms)",
        16.0 * n as f64 / t / 1e9,
        t * 1e3
    );
}
