//! CUDA throughput: matmul TFLOP/s (f32, bf16, f16 at 4096 and 8192) and a
//! forward + backward step of an MLP and of a small CNN. Prints one
//! `RESULT <name> <value> <unit>` line per figure; `benches/cuda_bench.py`
//! prints them beside PyTorch's on the same GPU. Without the `cuda` feature
//! or a GPU it prints why it skipped.
//!
//! `cargo bench -p forma-benches --features cuda --bench cuda`

#[cfg(feature = "cuda")]
mod run {
    use forma::core::Float;
    use forma::cuda::Cuda;
    use forma::prelude::*;
    use forma_benches::median_secs;

    fn matmul<E: Float>(g: &Cuda, n: usize, name: &str)
    where
        Cuda: Device<E>,
    {
        let mut rng = Rng::seed_from(0);
        let a = Tensor::<(Dyn, Dyn), E, Cuda>::normal_on((Dyn(n), Dyn(n)), 0.0, 1.0, &mut rng, g);
        let b = Tensor::<(Dyn, Dyn), E, Cuda>::normal_on((Dyn(n), Dyn(n)), 0.0, 1.0, &mut rng, g);
        let t = median_secs(2, if n >= 8192 { 5 } else { 11 }, || {
            std::hint::black_box(a.matmul(&b));
            g.synchronize().unwrap();
        });
        println!(
            "RESULT matmul_{name}_{n} {:.2} TFLOP/s",
            2.0 * (n as f64).powi(3) / t / 1e12
        );
    }

    /// 784 -> 1024 -> 1024 -> 10, batch 256: forward, log-softmax loss, backward.
    fn mlp(g: &Cuda) {
        let mut rng = Rng::seed_from(1);
        let p = |r: usize, c: usize, rng: &mut Rng| {
            Tensor::<(Dyn, Dyn), f32, Cuda>::normal_on((Dyn(r), Dyn(c)), 0.0, 0.03, rng, g)
                .requires_grad()
        };
        let x =
            Tensor::<(Dyn, Dyn), f32, Cuda>::normal_on((Dyn(256), Dyn(784)), 0.0, 1.0, &mut rng, g);
        let (w1, w2, w3) = (
            p(784, 1024, &mut rng),
            p(1024, 1024, &mut rng),
            p(1024, 10, &mut rng),
        );
        let t = median_secs(3, 21, || {
            let h = x.matmul(&w1).relu().matmul(&w2).relu().matmul(&w3);
            let loss = h.log_softmax::<1>().mean_all().neg();
            loss.backward();
            for w in [&w1, &w2, &w3] {
                w.zero_grad();
            }
            g.synchronize().unwrap();
        });
        println!("RESULT mlp_step {:.3} ms", t * 1e3);
    }

    /// [128, 1, 28, 28] -> conv 32 -> relu -> pool -> conv 64 -> relu -> pool -> mean.
    fn cnn(g: &Cuda) {
        let mut rng = Rng::seed_from(2);
        let x = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, Cuda>::normal_on(
            (Dyn(128), Dyn(1), Dyn(28), Dyn(28)),
            0.0,
            1.0,
            &mut rng,
            g,
        );
        let w1 = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, Cuda>::normal_on(
            (Dyn(32), Dyn(1), Dyn(3), Dyn(3)),
            0.0,
            0.3,
            &mut rng,
            g,
        )
        .requires_grad();
        let w2 = Tensor::<(Dyn, Dyn, Dyn, Dyn), f32, Cuda>::normal_on(
            (Dyn(64), Dyn(32), Dyn(3), Dyn(3)),
            0.0,
            0.05,
            &mut rng,
            g,
        )
        .requires_grad();
        let p = Conv2dParams {
            padding: [1, 1],
            ..Default::default()
        };
        let pool = Pool2dParams::new([2, 2]);
        let t = median_secs(3, 21, || {
            let y = x
                .conv2d(&w1, p)
                .relu()
                .max_pool2d(pool)
                .conv2d(&w2, p)
                .relu()
                .max_pool2d(pool);
            let loss = y.square().mean_all();
            loss.backward();
            w1.zero_grad();
            w2.zero_grad();
            g.synchronize().unwrap();
        });
        println!("RESULT cnn_step {:.3} ms", t * 1e3);
    }

    pub fn main() {
        let g = match Cuda::new(0) {
            Ok(g) => g,
            Err(e) => {
                println!("skipped: no usable GPU ({e})");
                return;
            }
        };
        println!(
            "device: {}",
            g.device_name().unwrap_or_else(|e| e.to_string())
        );
        for n in [4096, 8192] {
            matmul::<f32>(&g, n, "f32");
            matmul::<bf16>(&g, n, "bf16");
            matmul::<f16>(&g, n, "f16");
        }
        mlp(&g);
        cnn(&g);
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    run::main();
    #[cfg(not(feature = "cuda"))]
    println!("skipped: built without the `cuda` feature (cargo bench -p forma-benches --features cuda --bench cuda)");
}
