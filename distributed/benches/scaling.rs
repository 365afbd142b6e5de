//! Data-parallel scaling on this machine, beside PyTorch: the training
//! example's LeNet, SGD with momentum, 32 random 28x28 images per process
//! per step, one thread per process; world size 1 and 2, and one process
//! without the wrapper (what DistributedDataParallel costs by itself).
//!
//! ```sh
//! cargo bench -p forma-distributed --features mpi --bench scaling            # 3 rounds
//! cargo bench -p forma-distributed --features mpi --bench scaling -- --rounds 1
//! ```
//!
//! Forma's side runs this binary under `mpirun -np N` (DistributedDataParallel
//! on MPI); PyTorch's is `benches/ddp_gloo.py` (DistributedDataParallel on
//! gloo, `torch.multiprocessing`). Each round measures every configuration on
//! both sides back to back, alternating which goes first; the table shows
//! the median examples/s over the rounds (all processes together) and the
//! scaling efficiency, throughput(2) / (2 x throughput(1)).

use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::optim::{Optimizer, Sgd, SgdOptions};
use forma::prelude::*;
use forma_distributed::DistributedDataParallel;
use forma_examples::train::Cnn;
use std::process::Command;
use std::time::Instant;

const BATCH: usize = 32;
const WARMUP: usize = 10;
const STEPS: usize = 60;

type Images = Tensor<(Dyn, C<1>, C<28>, C<28>)>;

/// Seconds for `STEPS` SGD-momentum steps of `model` on one batch drawn
/// from `seed`, after `WARMUP` steps; `sync` runs before and after the
/// timed steps (a barrier in a job). One thread.
fn timed_steps<M: Module + Forward<Images, Tensor<(Dyn, C<10>)>>>(
    model: &M,
    seed: u64,
    sync: impl Fn(),
) -> f64 {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .ok();
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.05).momentum(0.9));
    let mut rng = Rng::seed_from(seed);
    let x = Images::randn((Dyn(BATCH), C, C, C), &mut rng);
    let y = Tensor::<(Dyn,), i64>::from_vec(
        (0..BATCH).map(|_| rng.below(10) as i64).collect(),
        (Dyn(BATCH),),
    )
    .unwrap();
    let mut step = || {
        opt.zero_grad(model);
        cross_entropy(&model.forward(x.clone()), &y, Mean).backward();
        opt.step(model);
    };
    for _ in 0..WARMUP {
        step();
    }
    sync();
    let t0 = Instant::now();
    for _ in 0..STEPS {
        step();
    }
    sync();
    t0.elapsed().as_secs_f64()
}

/// The same training in this process without the wrapper or MPI: what
/// DistributedDataParallel costs at world size 1.
fn plain_main() {
    let secs = timed_steps(&Cnn::new(&mut Rng::seed_from(0)), 1000, || {});
    println!("examples_per_s\t{:.1}", (BATCH * STEPS) as f64 / secs);
}

/// One rank's part: prints the job's examples/s from rank 0.
fn rank_main() {
    let world = forma_distributed::init().expect("MPI");
    let rank = world.rank();
    let ddp = DistributedDataParallel::new(Cnn::new(&mut Rng::seed_from(0)), &world).expect("DDP");
    let secs = timed_steps(&ddp, 1000 + rank as u64, || {
        world.barrier().expect("barrier")
    });
    if rank == 0 {
        println!(
            "examples_per_s\t{:.1}",
            (world.world_size() * BATCH * STEPS) as f64 / secs
        );
    }
}

/// The `examples_per_s` a command printed, or `None` (with its output).
fn examples_per_s(cmd: &mut Command) -> Option<f64> {
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("examples_per_s\t"))
        .and_then(|v| v.trim().parse().ok());
    if v.is_none() {
        eprintln!("{}{}", text, String::from_utf8_lossy(&out.stderr));
    }
    v
}

/// Forma's examples/s with `world` processes, or in-process without the
/// wrapper for `None`.
fn forma(world: Option<usize>) -> Option<f64> {
    let exe = std::env::current_exe().ok()?;
    let Some(world) = world else {
        return examples_per_s(
            Command::new(exe)
                .arg("--plain")
                .env("RAYON_NUM_THREADS", "1"),
        );
    };
    examples_per_s(
        Command::new("mpirun")
            .args([
                "--allow-run-as-root",
                "--oversubscribe",
                "--bind-to",
                "none",
                "-np",
                &world.to_string(),
            ])
            .arg(exe)
            .arg("--rank")
            .env("RAYON_NUM_THREADS", "1"),
    )
}

/// PyTorch's, the same way.
fn torch(world: Option<usize>) -> Option<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/ddp_gloo.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script);
    if world.is_none() {
        cmd.arg("--plain");
    }
    examples_per_s(cmd.args([
        "--world",
        &world.unwrap_or(1).to_string(),
        "--batch",
        &BATCH.to_string(),
        "--steps",
        &STEPS.to_string(),
        "--warmup",
        &WARMUP.to_string(),
    ]))
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".into(), |s| s.trim().to_string())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--rank") {
        return rank_main();
    }
    if args.iter().any(|a| a == "--plain") {
        return plain_main();
    }
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(3usize);
    println!(
        "data-parallel scaling: LeNet (the training example's), SGD momentum, {BATCH} images per process per step, {STEPS} timed steps after {WARMUP}; 1 thread per process"
    );
    println!(
        "machine: {}, {} cores; load average before: {}",
        cpu_name(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    // (label, processes; None: one process without the wrapper)
    let worlds = [
        ("1, no DDP wrapper", None),
        ("1", Some(1usize)),
        ("2", Some(2)),
    ];
    let mut f: Vec<Vec<f64>> = vec![Vec::new(); worlds.len()];
    let mut t: Vec<Vec<f64>> = vec![Vec::new(); worlds.len()];
    for round in 0..rounds {
        for (i, &(_, w)) in worlds.iter().enumerate() {
            let order: [bool; 2] = if (round + i) % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for forma_side in order {
                let v = if forma_side { forma(w) } else { torch(w) };
                if let Some(v) = v {
                    (if forma_side { &mut f } else { &mut t })[i].push(v);
                }
            }
        }
        eprintln!("round {}/{rounds} done", round + 1);
    }
    let (fm, tm): (Vec<_>, Vec<_>) = (
        f.iter_mut().map(|v| median(v)).collect(),
        t.iter_mut().map(|v| median(v)).collect(),
    );
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    println!("\n| processes | Forma (MPI) examples/s | PyTorch DDP (gloo) examples/s | Forma / PyTorch |");
    println!("|---|---|---|---|");
    for (i, &(w, _)) in worlds.iter().enumerate() {
        let ratio = match (fm[i], tm[i]) {
            (Some(a), Some(b)) => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        println!("| {w} | {} | {} | {ratio} |", show(fm[i]), show(tm[i]));
    }
    let eff = |v: &[Option<f64>]| match (v[1], v[2]) {
        (Some(one), Some(two)) => format!("{:.0}%", 100.0 * two / (2.0 * one)),
        _ => "-".into(),
    };
    println!("| efficiency 2 vs 1 | {} | {} | |", eff(&fm), eff(&tm));
    println!("\nload average after: {}", load_average());
    if tm.iter().all(Option::is_none) {
        println!("(PyTorch absent: python3 cannot import torch)");
    }
}
