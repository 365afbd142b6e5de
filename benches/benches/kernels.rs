//! Kernel throughput: f32 matmul (GFLOP/s, the median and the best of the
//! repetitions: on a shared machine the best shows what the kernel can do)
//! and a fused-looking elementwise chain `gelu(x * w + b)` (GB/s). Run with
//! `cargo bench -p forma-benches --bench kernels`; `RAYON_NUM_THREADS=1`
//! measures one thread. Last, the cost of running a module as a named child
//! (the module path kept for errors and hooks) over calling it directly.

use forma::prelude::*;
use forma_benches::{median_secs, Sample};

/// A module whose forward returns its input: what is left to time is the
/// call itself.
#[derive(Module)]
struct Pass;

impl Forward<Tensor<(Dyn,)>, Tensor<(Dyn,)>> for Pass {
    fn try_forward(&self, x: Tensor<(Dyn,)>) -> forma::Result<Tensor<(Dyn,)>> {
        Ok(x)
    }
}

/// Nanoseconds per call of `Pass` called directly and as a named child
/// (`try_forward_as`: the path pushed and popped, the hook count read).
fn named_child_overhead(rng: &mut Rng) {
    let x = Tensor::<(Dyn,)>::randn((Dyn(4),), rng);
    let calls = 100_000;
    let per_call = |named: bool| {
        let x = x.clone();
        median_secs(2, 15, || {
            let mut h = x.clone();
            for _ in 0..calls {
                h = if named {
                    std::hint::black_box(&Pass).try_forward_as("layer", h)
                } else {
                    std::hint::black_box(&Pass).try_forward(h)
                }
                .unwrap();
            }
            std::hint::black_box(h);
        }) / calls as f64
            * 1e9
    };
    let (direct, named) = (per_call(false), per_call(true));
    println!(
        "named child call  {:>6.1} ns ({direct:.1} ns direct, {:.1} ns for the path); \
         the encoder b1 s16 row makes 54 such calls per forward",
        named,
        named - direct
    );
}

fn matmul(m: usize, k: usize, n: usize, rng: &mut Rng) {
    let a = Tensor::<(Dyn, Dyn)>::randn((Dyn(m), Dyn(k)), rng);
    let b = Tensor::<(Dyn, Dyn)>::randn((Dyn(k), Dyn(n)), rng);
    let flops = 2.0 * (m * k * n) as f64;
    let rounds = (2e10 / flops).clamp(5.0, 101.0) as usize;
    let ms = Sample::time(2, rounds, || {
        std::hint::black_box(a.matmul(&b));
    });
    let gflops = |ms: f64| flops / ms / 1e6;
    println!(
        "matmul f32 {m:>4}x{k:<4} @ {k:>4}x{n:<4}  {:>7.1} GFLOP/s median, {:>7.1} best  ({:.3} ms)",
        gflops(ms.median()),
        gflops(ms.min_max().0),
        ms.median()
    );
}

fn main() {
    let mut rng = Rng::seed_from(0);
    for n in [128, 256, 512, 1024] {
        matmul(n, n, n, &mut rng);
    }
    matmul(64, 784, 512, &mut rng);
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
    named_child_overhead(&mut rng);
}
