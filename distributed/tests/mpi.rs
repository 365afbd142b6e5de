//! The distributed tests, run under MPI: `cargo test -p forma-distributed
//! --features mpi` runs this binary, which finds no MPI launcher around it
//! and starts itself under `mpirun -np N --case NAME` once per case (as
//! root and oversubscribed where needed, so it runs on a 2-core CI
//! machine), then checks each job's exit status and output.

use forma::nn::data::{DataLoader, DistributedSampler, TensorDataset};
use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::optim::{Optimizer, Sgd, SgdOptions};
use forma::nn::sched::{LrScheduler, StepLR};
use forma::nn::state::TrainingState;
use forma::prelude::*;
use forma_distributed::{
    save_on_rank0, DdpOptions, DistError, DistributedDataParallel, EvenBatches, ProcessGroup,
    ReduceOp,
};
use forma_examples::train::Cnn;
use half::bf16;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type R<T = ()> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        let ok: bool = $cond;
        if !ok {
            return Err(format!($($fmt)*));
        }
    };
}

fn world() -> R<ProcessGroup> {
    Ok(forma_distributed::init()
        .map_err(err)?
        .with_timeout(Duration::from_secs(120)))
}

// ---------------------------------------------------------------- cases

/// Every collective against values computed by hand (2 ranks).
fn collectives() -> R {
    let g = world()?;
    ensure!(
        g.world_size() == 2 && g.backend() == "mpi",
        "expected 2 MPI ranks, got {} on {}",
        g.world_size(),
        g.backend()
    );
    let r = g.rank() as f32;
    let t = |v: Vec<f32>| Tensor::<(C<3>,)>::from_vec(v, (C,)).unwrap();
    // rank 0: [1, 2, 0], rank 1: [2, 4, -1]
    let mine = || t(vec![1.0 + r, 2.0 * (r + 1.0), -r]);
    for (op, want) in [
        (ReduceOp::Sum, [3.0, 6.0, -1.0]),
        (ReduceOp::Mean, [1.5, 3.0, -0.5]),
        (ReduceOp::Max, [2.0, 4.0, 0.0]),
        (ReduceOp::Min, [1.0, 2.0, -1.0]),
    ] {
        let x = mine();
        g.all_reduce(&x, op).map_err(err)?;
        ensure!(
            x.to_vec() == want,
            "all_reduce {op:?}: {:?}, want {want:?}",
            x.to_vec()
        );
    }
    // f64, bf16 (reduced in f32), i64.
    let x = Tensor::<(C<2>,), f64>::from_vec(vec![0.1 * (r as f64 + 1.0), 1e300], (C,)).unwrap();
    g.all_reduce(&x, ReduceOp::Sum).map_err(err)?;
    ensure!(
        x.to_vec() == [0.1 + 0.2, 2e300],
        "f64 sum: {:?}",
        x.to_vec()
    );
    let x = Tensor::<(C<2>,), bf16>::from_vec(
        vec![bf16::from_f32(1.5 + r), bf16::from_f32(-2.0)],
        (C,),
    )
    .unwrap();
    g.all_reduce(&x, ReduceOp::Mean).map_err(err)?;
    ensure!(
        x.to_vec() == [bf16::from_f32(2.0), bf16::from_f32(-2.0)],
        "bf16 mean: {:?}",
        x.to_vec()
    );
    let x = Tensor::<(C<2>,), i64>::from_vec(vec![7 * (g.rank() as i64 + 1), -1], (C,)).unwrap();
    g.all_reduce(&x, ReduceOp::Sum).map_err(err)?;
    ensure!(x.to_vec() == [21, -2], "i64 sum: {:?}", x.to_vec());
    // In place: a contiguous tensor keeps its storage; a transposed view
    // writes back through its strides.
    let base =
        Tensor::<(C<2>, C<3>)>::from_vec((0..6).map(|v| v as f32 + 10.0 * r).collect(), (C, C))
            .unwrap();
    let view = base.transpose::<0, 1>();
    g.all_reduce(&view, ReduceOp::Sum).map_err(err)?;
    let want: Vec<f32> = (0..6).map(|v| 2.0 * v as f32 + 10.0).collect();
    ensure!(
        base.to_vec() == want,
        "all_reduce through a transposed view: {:?}",
        base.to_vec()
    );
    // broadcast from rank 1, of floats and of a bool mask.
    let x = Tensor::<(C<4>,)>::full_on((C,), (r as f64) as f32, &Cpu);
    g.broadcast(&x, 1).map_err(err)?;
    ensure!(x.to_vec() == [1.0; 4], "broadcast: {:?}", x.to_vec());
    let m = Tensor::<(C<3>,), bool>::from_vec(vec![r == 0.0, r == 1.0, true], (C,)).unwrap();
    g.broadcast(&m, 0).map_err(err)?;
    ensure!(
        m.to_vec() == [true, false, true],
        "bool broadcast: {:?}",
        m.to_vec()
    );
    // all_gather, reduce_scatter, barrier.
    let parts = g.all_gather(&mine()).map_err(err)?;
    ensure!(
        parts.len() == 2
            && parts[0].to_vec() == [1.0, 2.0, 0.0]
            && parts[1].to_vec() == [2.0, 4.0, -1.0],
        "all_gather: {:?}",
        parts.iter().map(|p| p.to_vec()).collect::<Vec<_>>()
    );
    let inputs = vec![t(vec![r, 1.0, 2.0]), t(vec![10.0 * r, 3.0, 4.0])];
    let out = g.reduce_scatter(&inputs, ReduceOp::Sum).map_err(err)?;
    let want = if g.rank() == 0 {
        [1.0, 2.0, 4.0]
    } else {
        [10.0, 6.0, 8.0]
    };
    ensure!(
        out.to_vec() == want,
        "reduce_scatter: {:?}, want {want:?}",
        out.to_vec()
    );
    g.barrier().map_err(err)?;
    // Sub-groups: rank 1 alone, and both in reverse order.
    let solo = g.new_group(&[1]).map_err(err)?;
    ensure!(
        solo.as_ref().map(|s| (s.rank(), s.world_size())) == (g.rank() == 1).then_some((0, 1)),
        "new_group([1]) on rank {r}: {:?}",
        solo.as_ref().map(|s| s.rank())
    );
    let rev = g
        .new_group(&[1, 0])
        .map_err(err)?
        .ok_or("new_group([1, 0]) left a rank out")?;
    ensure!(
        rev.rank() == 1 - g.rank(),
        "new_group([1, 0]): rank {} became {}",
        g.rank(),
        rev.rank()
    );
    let x = Tensor::<(C<1>,)>::full_on((C,), (rev.rank() as f64 + 1.0) as f32, &Cpu);
    rev.broadcast(&x, 0).map_err(err)?; // from world rank 1
    ensure!(x.to_vec() == [1.0], "sub-group broadcast: {:?}", x.to_vec());
    // Sizes that differ between ranks: an error naming both, on both.
    let n = 3 + g.rank();
    let x = Tensor::<(Dyn,)>::zeros_on((Dyn(n),), &Cpu);
    let e = g
        .all_reduce(&x, ReduceOp::Sum)
        .expect_err("mismatched sizes must fail");
    let msg = e.to_string();
    ensure!(
        matches!(e, DistError::Mismatch { .. })
            && msg.contains("rank 0: all_reduce of 3 float32 elements")
            && msg.contains("rank 1: all_reduce of 4 float32 elements"),
        "mismatch message: {msg}"
    );
    println!("rank {}: mismatch reported as: {msg}", g.rank());
    Ok(())
}

/// A batch of 64 digits-sized images and labels, the same on every rank.
fn batch(step: u64) -> (Vec<f32>, Vec<i64>) {
    let mut rng = Rng::seed_from(1000 + step);
    let x = (0..64 * 784).map(|_| rng.normal() as f32).collect();
    let y = (0..64).map(|_| rng.below(10) as i64).collect();
    (x, y)
}

fn images(x: &[f32], rows: usize) -> Tensor<(Dyn, C<1>, C<28>, C<28>)> {
    Tensor::from_vec(x.to_vec(), (Dyn(rows), C, C, C)).unwrap()
}

fn labels(y: &[i64]) -> Tensor<(Dyn,), i64> {
    Tensor::from_vec(y.to_vec(), (Dyn(y.len()),)).unwrap()
}

/// The training example's CNN, 50 SGD-momentum steps: 2 ranks of 32 give
/// the parameters of one process on the 64.
fn ddp_matches_single() -> R {
    let g = world()?;
    let rank = g.rank();
    // Different initial weights per rank: DDP must start them all from rank 0's.
    let model = Cnn::new(&mut Rng::seed_from(100 + rank as u64));
    let ddp = DistributedDataParallel::with_options(
        model,
        &g,
        DdpOptions {
            bucket_cap_mb: 0.01,
            ..Default::default()
        },
    )
    .map_err(err)?;
    ensure!(
        ddp.buckets().len() == 3,
        "a 0.01 MB cap should make several buckets: {:?}",
        ddp.buckets()
    );
    let single = Cnn::new(&mut Rng::seed_from(100));
    let opts = SgdOptions::default().lr(0.05).momentum(0.9);
    let mut opt: Sgd = Sgd::new(opts.clone());
    let mut opt1: Sgd = Sgd::new(opts);
    let per = 32;
    for step in 0..50 {
        let (x, y) = batch(step);
        let (xs, ys) = (
            &x[rank * per * 784..(rank + 1) * per * 784],
            &y[rank * per..(rank + 1) * per],
        );
        opt.zero_grad(&ddp);
        let loss = cross_entropy(&ddp.forward(images(xs, per)), &labels(ys), Mean);
        loss.try_backward().map_err(err)?;
        opt.try_step(&ddp).map_err(err)?;
        if rank == 0 {
            opt1.zero_grad(&single);
            let loss = cross_entropy(&single.forward(images(&x, 64)), &labels(&y), Mean);
            loss.backward();
            opt1.try_step(&single).map_err(err)?;
        }
    }
    // Every replica holds the same bits.
    let flat: Vec<f32> = ddp
        .state_dict()
        .iter()
        .flat_map(|(_, d)| d.to_vec::<f32>())
        .collect();
    let all = g
        .all_gather(&Tensor::<(Dyn,)>::from_vec(flat.clone(), (Dyn(flat.len()),)).unwrap())
        .map_err(err)?;
    ensure!(
        all[0].to_vec() == all[1].to_vec(),
        "the replicas differ after training"
    );
    if rank == 0 {
        let mut worst = 0.0f64;
        for ((k, a), (_, b)) in ddp.state_dict().iter().zip(single.state_dict().iter()) {
            let (a, b) = (a.to_vec::<f32>(), b.to_vec::<f32>());
            let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
            let diff = a
                .iter()
                .zip(&b)
                .fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) as f64;
            let rel = diff / scale.max(1e-12);
            println!("  {k}: max |ddp - single| / max |single| = {rel:.2e}");
            worst = worst.max(rel);
        }
        println!(
            "DDP (2 x 32) vs one process (64), 50 steps: worst relative difference {worst:.2e}"
        );
        ensure!(
            worst < 1e-5,
            "DDP and the single process differ by {worst:.2e} (bound 1e-5)"
        );
    }
    Ok(())
}

/// Gradient accumulation under `no_sync`, unused parameters, buffers.
fn ddp_options() -> R {
    let g = world()?;
    let rank = g.rank() as f64;
    // no_sync: two local backwards, then a synced one, average the sum of all three.
    let w = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,))
        .unwrap()
        .requires_grad();
    let ddp = DistributedDataParallel::new(w, &g).map_err(err)?;
    {
        let _local = ddp.no_sync();
        for k in 0..2 {
            // d/dw sum(w * c) = c
            let c = Tensor::<(C<2>,)>::full_on((C,), (rank + k as f64) as f32, &Cpu);
            (ddp.module() * &c).sum_all().try_backward().map_err(err)?;
        }
        let local = ddp.module().grad().unwrap().to_vec();
        ensure!(
            local == [(2.0 * rank + 1.0) as f32; 2],
            "no_sync must keep the local sum: {local:?}"
        );
    }
    let c = Tensor::<(C<2>,)>::full_on((C,), 10.0, &Cpu);
    (ddp.module() * &c).sum_all().try_backward().map_err(err)?;
    // rank 0: 0 + 1 + 10 = 11, rank 1: 1 + 2 + 10 = 13, mean 12.
    let got = ddp.module().grad().unwrap().to_vec();
    ensure!(
        got == [12.0; 2],
        "after no_sync, the synced backward averages the accumulated sums: {got:?}"
    );

    // Unused parameters: rank 1 never uses `b`.
    #[derive(Module)]
    struct Two {
        a: Tensor<(C<2>,)>,
        b: Tensor<(C<2>,)>,
        c: Tensor<(C<1>,)>,
    }
    let two = || Two {
        a: Tensor::ones().requires_grad(),
        b: Tensor::ones().requires_grad(),
        c: Tensor::ones().requires_grad(),
    };
    let strict = DistributedDataParallel::new(two(), &g).map_err(err)?;
    let loss = |m: &Two| {
        let s = m.a.sum_all();
        if rank == 0.0 {
            &s + &m.b.sum_all().mul_scalar(3.0)
        } else {
            s
        }
    };
    let e = loss(strict.module())
        .try_backward()
        .expect_err("an unused parameter must be an error without find_unused_parameters");
    ensure!(
        e.to_string().contains("received no gradient") && e.to_string().contains('c'),
        "unused-parameter message: {e}"
    );
    drop(strict);
    // On rank 0 `b` was used too, so rank 0 waited in its reduction: with
    // the strict wrapper gone, both ranks go on with the lenient one.
    let lenient = DistributedDataParallel::with_options(
        two(),
        &g,
        DdpOptions {
            find_unused_parameters: true,
            ..Default::default()
        },
    )
    .map_err(err)?;
    loss(lenient.module()).try_backward().map_err(err)?;
    let m = lenient.module();
    ensure!(
        m.a.grad().unwrap().to_vec() == [1.0; 2],
        "a: {:?}",
        m.a.grad().map(|g| g.to_vec())
    );
    ensure!(
        m.b.grad().unwrap().to_vec() == [1.5; 2],
        "b (3 on rank 0, unused on rank 1): {:?}",
        m.b.grad().map(|g| g.to_vec())
    );
    ensure!(
        m.c.grad().is_none(),
        "c, used by no rank, keeps no gradient: {:?}",
        m.c.grad().map(|g| g.to_vec())
    );

    // Buffers: BatchNorm's running statistics follow rank 0 at each forward.
    let bn = forma::nn::layers::BatchNorm1d::<3>::new(&Cpu);
    let ddp = DistributedDataParallel::new(bn, &g).map_err(err)?;
    let x = Tensor::<(Dyn, C<3>)>::from_vec(
        (0..12).map(|v| v as f32 * (rank as f32 + 1.0)).collect(),
        (Dyn(4), C),
    )
    .unwrap();
    let _ = ddp.forward(x.clone());
    let _ = ddp.forward(x); // broadcasts the running stats updated by rank 0's first forward
    let stats = |t: &Option<Tensor<(C<3>,)>>| t.clone().ok_or("BatchNorm1d::new tracks statistics");
    let all = g
        .all_gather(&stats(&ddp.module().running_mean)?)
        .map_err(err)?;
    ensure!(
        all[0].to_vec() != all[1].to_vec(),
        "after a local update the ranks' statistics differ until the next forward"
    );
    let _ = ddp.forward(Tensor::<(Dyn, C<3>)>::zeros_on((Dyn(2), C), &Cpu));
    let all = g
        .all_gather(&stats(&ddp.module().running_var)?)
        .map_err(err)?;
    ensure!(all.len() == 2, "gathered {}", all.len());
    Ok(())
}

/// Uneven inputs: rank 1 has one batch fewer.
fn uneven() -> R {
    let g = world()?;
    let n = 3 - g.rank();
    let mut got = Vec::new();
    let mut error = None;
    for b in EvenBatches::new(&g, 0..n) {
        match b {
            Ok(i) => got.push(i),
            Err(e) => error = Some(e),
        }
    }
    ensure!(
        got == [0, 1],
        "both ranks run the two common steps: {got:?}"
    );
    let e = error.ok_or("the uneven step must be reported")?;
    let msg = e.to_string();
    ensure!(
        msg.contains("at step 2")
            && msg.contains("rank(s) [1] ran out")
            && msg.contains("rank(s) [0] had more"),
        "uneven message: {msg}"
    );
    println!("rank {}: {msg}", g.rank());
    Ok(())
}

/// Rank 1 leaves before a collective; rank 0's times out with an error.
fn early_exit() -> R {
    let g = world()?.with_timeout(Duration::from_secs(3));
    if g.rank() == 1 {
        println!("rank 1: leaving early");
        drop(g); // finalises MPI, without the all_reduce rank 0 waits in
        return Ok(());
    }
    let t0 = Instant::now();
    let x = Tensor::<(C<4>,)>::ones();
    let e = g
        .check_sizes(false)
        .all_reduce(&x, ReduceOp::Sum)
        .expect_err("rank 1 never joins");
    println!("rank 0: after {:.1} s: {e}", t0.elapsed().as_secs_f64());
    ensure!(
        matches!(e, DistError::Timeout { .. }),
        "expected a timeout: {e}"
    );
    Ok(())
}

/// Rank 1 crashes (a panic, no MPI finalize): mpirun ends the job.
fn crash() -> R {
    let g = world()?;
    if g.rank() == 1 {
        panic!("rank 1 crashes on purpose");
    }
    let x = Tensor::<(C<4>,)>::ones();
    let e = g.all_reduce(&x, ReduceOp::Sum);
    Err(format!(
        "rank 0 should have been stopped by mpirun, got {e:?}"
    ))
}

// -------------------------------------------------- checkpoint and resume

struct TrainArgs {
    steps: u64,
    ckpt: PathBuf,
    out: PathBuf,
    save_every: u64,
    kill_at: Option<u64>,
    resume: bool,
}

fn train_args(args: &[String]) -> TrainArgs {
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .map(|i| args[i + 1].clone())
    };
    TrainArgs {
        steps: get("--steps").map_or(24, |s| s.parse().unwrap()),
        ckpt: get("--ckpt").map(PathBuf::from).unwrap(),
        out: get("--out").map(PathBuf::from).unwrap_or_default(),
        save_every: get("--save-every").map_or(0, |s| s.parse().unwrap()),
        kill_at: get("--kill-at").map(|s| s.parse().unwrap()),
        resume: args.iter().any(|a| a == "--resume"),
    }
}

/// Data-parallel training of the CNN on 256 items with a DistributedSampler,
/// SGD with momentum and a StepLR; checkpoints on rank 0; optionally killed
/// or resumed.
fn train(a: &TrainArgs) -> R {
    let g = world()?;
    let rank = g.rank();
    let mut rng = Rng::seed_from(5);
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::randn((Dyn(256), C, C, C), &mut rng);
    let y = Tensor::<(Dyn,), i64>::from_vec(
        (0..256).map(|_| rng.below(10) as i64).collect(),
        (Dyn(256),),
    )
    .unwrap();
    let data = TensorDataset::new(&x, &y).map_err(err)?;
    let sampler = DistributedSampler::new(g.world_size(), rank)
        .map_err(err)?
        .seed(3);
    let mut loader = DataLoader::new(data, 16).map_err(err)?.sampler(sampler);
    let mut ddp =
        DistributedDataParallel::new(Cnn::new(&mut Rng::seed_from(100)), &g).map_err(err)?;
    let mut opt: Sgd = Sgd::new(SgdOptions::default().lr(0.05).momentum(0.9));
    let mut sched = StepLR::try_new(&mut opt, 10, 0.5).map_err(err)?;
    let mut step = 0u64;
    if a.resume {
        let st = TrainingState::load(&a.ckpt).map_err(err)?;
        ddp.load_state_dict(&st.model).map_err(err)?;
        opt.load_state_dict(&ddp, st.optimizer.as_ref().ok_or("no optimizer state")?)
            .map_err(err)?;
        sched
            .load_state_dict(st.scheduler.as_ref().ok_or("no scheduler state")?)
            .map_err(err)?;
        step = st.extra["step"].parse().map_err(err)?;
        let saved_world: usize = st.extra["distributed.world_size"].parse().map_err(err)?;
        let pos = st.loader.ok_or("no loader position")?;
        if saved_world == g.world_size() {
            loader.set_state(pos).map_err(err)?;
        } else {
            // Other shares: restart the epoch; the weights must be the saved ones.
            loader
                .set_state(forma::nn::data::LoaderState {
                    epoch: pos.epoch,
                    batch: 0,
                })
                .map_err(err)?;
            for (k, a) in ddp.state_dict().iter() {
                let b = st
                    .model
                    .get(k)
                    .ok_or(format!("{k} is not in the checkpoint"))?;
                ensure!(
                    a.to_vec::<f32>() == b.to_vec::<f32>(),
                    "{k} differs from the checkpoint after loading"
                );
            }
            println!(
                "rank {rank}: resumed a {saved_world}-rank checkpoint on {} rank(s) at step {step}",
                g.world_size()
            );
        }
    }
    'outer: while step < a.steps {
        let mut batches = loader.iter();
        while let Some(b) = batches.next() {
            let (xb, yb): (Tensor<(Dyn, C<1>, C<28>, C<28>)>, Tensor<(Dyn,), i64>) =
                b.map_err(err)?;
            opt.zero_grad(&ddp);
            let loss = cross_entropy(&ddp.forward(xb), &yb, Mean);
            loss.try_backward().map_err(err)?;
            opt.try_step(&ddp).map_err(err)?;
            step += 1;
            if step.is_multiple_of(8) {
                sched.try_step(&mut opt).map_err(err)?;
            }
            if a.save_every > 0 && step.is_multiple_of(a.save_every) {
                let mut st = TrainingState {
                    model: ddp.state_dict(),
                    optimizer: Some(opt.try_state_dict().map_err(err)?),
                    scheduler: Some(sched.state_dict()),
                    loader: Some(batches.state()),
                    ..Default::default()
                };
                st.extra.insert("step".into(), step.to_string());
                save_on_rank0(&g, &a.ckpt, &st).map_err(err)?;
            }
            if a.kill_at == Some(step) && rank == 1 {
                eprintln!("rank 1: killed at step {step}");
                std::process::abort();
            }
            if step == a.steps {
                break 'outer;
            }
        }
    }
    if rank == 0 && !a.out.as_os_str().is_empty() {
        ddp.save_safetensors(&a.out).map_err(err)?;
        let st = opt.try_state_dict().map_err(err)?;
        let mut t = TrainingState {
            optimizer: Some(st),
            ..Default::default()
        };
        t.extra
            .insert("lr".into(), format!("{:?}", sched.state_dict()));
        t.save(a.out.with_extension("opt")).map_err(err)?;
    }
    Ok(())
}

/// The training example with `--distributed`: the ranks report the same
/// metrics; only rank 0 writes files.
fn example(out: &str) -> R {
    // The example calls `init` again: it gets this same world.
    let g = world()?;
    let args = forma_examples::train::Args {
        distributed: true,
        epochs: Some(1),
        train_size: Some(512),
        test_size: Some(128),
        batch_size: Some(32),
        progress: false,
        out: PathBuf::from(out).join(format!("rank{}", g.rank())),
        ..Default::default()
    };
    let summary = forma_examples::train::run(&args).map_err(err)?;
    let acc = Tensor::<(C<1>,), f64>::from_vec(vec![summary.best_test_acc], (C,)).unwrap();
    let all = g.all_gather(&acc).map_err(err)?;
    ensure!(
        all[0].to_vec() == all[1].to_vec(),
        "the ranks disagree: {:?} vs {:?}",
        all[0].to_vec(),
        all[1].to_vec()
    );
    let wrote = args.out.join("best.safetensors").exists() && args.out.join("metrics.csv").exists();
    ensure!(
        wrote == (g.rank() == 0),
        "rank {} wrote files: {wrote}",
        g.rank()
    );
    Ok(())
}

// ---------------------------------------------------------------- launcher

fn run_case(name: &str, args: &[String]) -> R {
    match name {
        "collectives" => collectives(),
        "ddp-matches-single" => ddp_matches_single(),
        "ddp-options" => ddp_options(),
        "uneven" => uneven(),
        "early-exit" => early_exit(),
        "crash" => crash(),
        "train" => train(&train_args(args)),
        "example" => example(&args[0]),
        other => Err(format!("no case {other}")),
    }
}

struct Job {
    np: usize,
    out: String,
    ok: bool,
    secs: f64,
}

fn mpirun(np: usize, case: &str, extra: &[&str], limit: Duration) -> Job {
    let exe = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let mut cmd = Command::new("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        &np.to_string(),
    ])
    .arg(&exe)
    .args(["--case", case])
    .args(extra)
    .env("RAYON_NUM_THREADS", "1")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Job { np, out: format!("cannot start mpirun ({e}): install OpenMPI (apt-get install openmpi-bin libopenmpi-dev)"), ok: false, secs: 0.0 };
        }
    };
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(o)) => Job {
            np,
            out: format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            ok: o.status.success(),
            secs: t0.elapsed().as_secs_f64(),
        },
        Ok(Err(e)) => Job {
            np,
            out: e.to_string(),
            ok: false,
            secs: t0.elapsed().as_secs_f64(),
        },
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            Job {
                np,
                out: format!("mpirun did not finish within {limit:?}"),
                ok: false,
                secs: limit.as_secs_f64(),
            }
        }
    }
}

fn launcher() -> i32 {
    let dir = std::env::temp_dir().join(format!("forma-mpi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |n: &str| dir.join(n).display().to_string();
    let limit = Duration::from_secs(600);
    let mut results: Vec<(&str, R)> = Vec::new();
    let plain = |job: Job| -> R {
        if job.ok {
            Ok(())
        } else {
            Err(format!("{} ranks, exit failure:\n{}", job.np, job.out))
        }
    };
    for case in ["collectives", "ddp-matches-single", "ddp-options", "uneven"] {
        let job = mpirun(2, case, &[], limit);
        print_job(case, &job);
        results.push((case, plain(job)));
    }
    let job = mpirun(2, "example", &[&p("example")], limit);
    print_job("the training example, --distributed", &job);
    results.push(("training example", plain(job)));
    // A rank that leaves: rank 0 gets a timeout error within about 3 s.
    let job = mpirun(2, "early-exit", &[], Duration::from_secs(120));
    print_job("early-exit", &job);
    results.push(("early-exit", {
        if job.out.contains("did not complete within 3.0 s") && job.secs < 60.0 {
            Ok(())
        } else {
            Err(format!("no timeout error from rank 0:\n{}", job.out))
        }
    }));
    // A rank that crashes: mpirun stops the job and says which.
    let job = mpirun(2, "crash", &[], Duration::from_secs(120));
    print_job("crash", &job);
    results.push(("crash", {
        if !job.ok && job.secs < 60.0 && job.out.contains("crashes on purpose") {
            Ok(())
        } else {
            Err(format!(
                "the crash did not end the job promptly (ok={}, {:.1} s):\n{}",
                job.ok, job.secs, job.out
            ))
        }
    }));
    // Resume after a killed run, bit-identical to an uninterrupted one.
    let full = mpirun(
        2,
        "train",
        &["--ckpt", &p("full.ckpt"), "--out", &p("full.safetensors")],
        limit,
    );
    print_job("train (uninterrupted, 24 steps)", &full);
    let killed = mpirun(
        2,
        "train",
        &[
            "--ckpt",
            &p("run.ckpt"),
            "--save-every",
            "5",
            "--kill-at",
            "13",
        ],
        limit,
    );
    print_job("train (killed at step 13, checkpoint at 10)", &killed);
    let resumed = mpirun(
        2,
        "train",
        &[
            "--ckpt",
            &p("run.ckpt"),
            "--out",
            &p("resumed.safetensors"),
            "--resume",
        ],
        limit,
    );
    print_job("train (resumed from step 10)", &resumed);
    results.push((
        "resume after a killed run",
        (|| {
            ensure!(full.ok, "uninterrupted run failed:\n{}", full.out);
            ensure!(!killed.ok, "the killed run should fail:\n{}", killed.out);
            ensure!(resumed.ok, "resumed run failed:\n{}", resumed.out);
            let a = std::fs::read(p("full.safetensors")).map_err(err)?;
            let b = std::fs::read(p("resumed.safetensors")).map_err(err)?;
            ensure!(
                a == b,
                "the resumed weights differ from the uninterrupted run's"
            );
            let a = std::fs::read(p("full.opt")).map_err(err)?;
            let b = std::fs::read(p("resumed.opt")).map_err(err)?;
            ensure!(
                a == b,
                "the resumed optimizer state differs from the uninterrupted run's"
            );
            Ok(())
        })(),
    ));
    // The same checkpoint on one rank: the model and optimizer load.
    let one = mpirun(
        1,
        "train",
        &["--ckpt", &p("run.ckpt"), "--steps", "12", "--resume"],
        limit,
    );
    print_job("train (2-rank checkpoint resumed on 1 rank)", &one);
    results.push(("resume on another world size", plain(one)));
    let _ = std::fs::remove_dir_all(&dir);

    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    for (name, r) in &failed {
        println!("FAILED {name}: {}", r.as_ref().unwrap_err());
    }
    println!(
        "\n{} passed, {} failed",
        results.len() - failed.len(),
        failed.len()
    );
    i32::from(!failed.is_empty())
}

fn print_job(name: &str, job: &Job) {
    println!(
        "--- {name}: {} ranks, {:.1} s, {}",
        job.np,
        job.secs,
        if job.ok { "exit 0" } else { "exit failure" }
    );
    for line in job.out.lines().filter(|l| !l.trim().is_empty()).take(40) {
        println!("    {line}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let name = args[i + 1].clone();
        let result = run_case(&name, &args[i + 2..]);
        let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap_or_default();
        match result {
            Ok(()) => println!("rank {rank}: {name} ok"),
            Err(e) => {
                println!("rank {rank}: {name} FAILED: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    std::process::exit(launcher());
}
