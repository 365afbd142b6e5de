//! The NCCL group and data-parallel wrapper on one GPU (world size 1): runs
//! in tools/gpu-check.sh on a GPU machine; elsewhere each test says why it
//! skipped.

use forma::cuda::Cuda;
use forma::prelude::*;
use forma_distributed::{NcclGroup, ReduceOp};

fn gpu() -> Option<Cuda> {
    if !NcclGroup::is_available() {
        eprintln!("skipped: libnccl could not be loaded");
        return None;
    }
    match Cuda::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn collectives_on_one_gpu() {
    let Some(dev) = gpu() else { return };
    let g = NcclGroup::new(&dev, 0, 1, NcclGroup::unique_id().unwrap()).unwrap();
    assert_eq!((g.rank(), g.world_size()), (0, 1));
    let t = Tensor::<(C<3>,), f32, Cuda>::from_vec_on(vec![1.0, -2.0, 3.5], (C,), &dev).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        g.all_reduce(&t, op).unwrap();
        assert_eq!(t.to_vec(), [1.0, -2.0, 3.5], "{op:?}");
    }
    let h = Tensor::<(C<2>,), half::bf16, Cuda>::from_vec_on(
        vec![half::bf16::from_f32(1.5); 2],
        (C,),
        &dev,
    )
    .unwrap();
    g.all_reduce(&h, ReduceOp::Sum).unwrap();
    assert_eq!(h.to_vec(), [half::bf16::from_f32(1.5); 2]);
    g.broadcast(&t, 0).unwrap();
    assert!(g.broadcast(&t, 1).is_err());
    let parts = g.all_gather(&t).unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].to_vec(), [1.0, -2.0, 3.5]);
    let flat = Tensor::<(Dyn,), f32, Cuda>::from_vec_on(vec![4.0, 5.0], (Dyn(2),), &dev).unwrap();
    assert_eq!(
        g.reduce_scatter(&flat, ReduceOp::Sum).unwrap().to_vec(),
        [4.0, 5.0]
    );
    g.barrier().unwrap();
    // A view that is not contiguous is refused, with the reason.
    let m = Tensor::<(C<2>, C<3>), f32, Cuda>::zeros_on((C, C), &dev);
    let e = g
        .all_reduce(&m.transpose::<0, 1>(), ReduceOp::Sum)
        .unwrap_err();
    assert!(e.to_string().contains("contiguous"), "{e}");
}

#[test]
fn torchrun_environment_of_one_rank() {
    let Some(_dev) = gpu() else { return };
    // SAFETY: this test binary runs its tests on one thread in gpu-check.sh;
    // no other thread reads the environment meanwhile.
    unsafe {
        std::env::set_var("RANK", "0");
        std::env::set_var("WORLD_SIZE", "1");
        std::env::set_var("MASTER_ADDR", "127.0.0.1");
        std::env::set_var("MASTER_PORT", "29517");
    }
    let g = NcclGroup::init_from_env(std::time::Duration::from_secs(10)).unwrap();
    let t = Tensor::<(C<2>,), f32, Cuda>::from_vec_on(vec![2.0, 3.0], (C,), g.device()).unwrap();
    g.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(t.to_vec(), [2.0, 3.0]);
}

/// NcclDistributedDataParallel at world size 1: the gradients are the
/// plain model's, `no_sync` accumulates, unused parameters are named or,
/// with `find_unused_parameters`, left without a gradient.
#[test]
fn data_parallel_on_one_gpu_gives_the_plain_gradients() {
    use forma::nn::layers::Linear;
    use forma_distributed::{DdpOptions, NcclDistributedDataParallel};
    let Some(dev) = gpu() else { return };
    let g = NcclGroup::new(&dev, 0, 1, NcclGroup::unique_id().unwrap()).unwrap();
    let plain = Linear::<4, 3, f32, Cuda>::new(&dev, &mut Rng::seed_from(1));
    let ddp = NcclDistributedDataParallel::new(
        Linear::<4, 3, f32, Cuda>::new(&dev, &mut Rng::seed_from(1)),
        &g,
        DdpOptions::default(),
    )
    .unwrap();
    let x = Tensor::<(Dyn, C<4>), f32, Cuda>::from_vec_on(
        (0..8).map(|v| v as f32 * 0.25).collect(),
        (Dyn(2), C),
        &dev,
    )
    .unwrap();
    plain.forward(x.clone()).square().mean_all().backward();
    ddp.forward(x.clone()).square().mean_all().backward();
    assert_eq!(
        plain.weight.grad().unwrap().to_vec(),
        ddp.module().weight.grad().unwrap().to_vec()
    );
    {
        let _local = ddp.no_sync();
        ddp.forward(x.clone()).square().mean_all().backward();
    }
    let twice: Vec<f32> = plain
        .weight
        .grad()
        .unwrap()
        .to_vec()
        .iter()
        .map(|v| 2.0 * v)
        .collect();
    assert_eq!(ddp.module().weight.grad().unwrap().to_vec(), twice);

    #[derive(Module)]
    struct Two {
        used: Tensor<(C<2>,), f32, Cuda>,
        idle: Tensor<(C<2>,), f32, Cuda>,
    }
    let two = || Two {
        used: Tensor::ones_on((C,), &dev).requires_grad(),
        idle: Tensor::ones_on((C,), &dev).requires_grad(),
    };
    let strict = NcclDistributedDataParallel::new(two(), &g, DdpOptions::default()).unwrap();
    let e = strict.module().used.sum_all().try_backward().unwrap_err();
    assert!(e.to_string().contains("idle"), "{e}");
    drop(strict);
    let opts = DdpOptions {
        find_unused_parameters: true,
        ..Default::default()
    };
    let lenient = NcclDistributedDataParallel::new(two(), &g, opts).unwrap();
    lenient.module().used.sum_all().backward();
    assert_eq!(lenient.module().used.grad().unwrap().to_vec(), [1.0, 1.0]);
    assert!(lenient.module().idle.grad().is_none());
}
