//! DistributedDataParallel and the process group in one process (world size
//! 1, no MPI): the same program a job runs, which must change nothing.

use forma::nn::data::{DataLoader, DistributedSampler, TensorDataset};
use forma::nn::layers::Linear;
use forma::nn::state::StateDict;
use forma::prelude::*;
use forma_distributed::{
    strip_module_prefix, DdpOptions, DistError, DistributedDataParallel, ProcessGroup, ReduceOp,
};
use forma_examples::train::Cnn;

#[test]
fn ddp_of_one_process_gives_the_plain_gradients() {
    let world = ProcessGroup::single();
    let plain = Cnn::new(&mut Rng::seed_from(1));
    let ddp = DistributedDataParallel::new(Cnn::new(&mut Rng::seed_from(1)), &world).unwrap();
    let x = Tensor::<(Dyn, C<1>, C<28>, C<28>)>::randn((Dyn(4), C, C, C), &mut Rng::seed_from(2));
    plain.forward(x.clone()).square().mean_all().backward();
    ddp.forward(x).square().mean_all().backward();
    let (a, b) = (
        plain.fc1.weight.grad().unwrap(),
        ddp.module().fc1.weight.grad().unwrap(),
    );
    assert_eq!(a.to_vec(), b.to_vec());
    assert_eq!(
        plain.state_dict().keys().collect::<Vec<_>>(),
        ddp.state_dict().keys().collect::<Vec<_>>(),
        "the wrapper's state_dict has the bare model's keys"
    );
}

#[test]
fn buckets_follow_reverse_parameter_order_and_the_cap() {
    let world = ProcessGroup::single();
    let one = DistributedDataParallel::new(Cnn::new(&mut Rng::seed_from(1)), &world).unwrap();
    assert_eq!(one.buckets().len(), 1, "25 MB holds the whole LeNet");
    assert_eq!(one.buckets()[0][0], "fc2.bias");
    assert_eq!(one.buckets()[0].last().unwrap(), "conv1.weight");
    // fc1.weight (400 x 64 x 4 bytes) alone exceeds 0.01 MB and closes its bucket.
    let opts = DdpOptions {
        bucket_cap_mb: 0.01,
        ..Default::default()
    };
    let small =
        DistributedDataParallel::with_options(Cnn::new(&mut Rng::seed_from(1)), &world, opts)
            .unwrap();
    assert_eq!(
        small.buckets(),
        [
            vec!["fc2.bias", "fc2.weight", "fc1.bias", "fc1.weight"],
            vec!["conv2.bias", "conv2.weight"],
            vec!["conv1.bias", "conv1.weight"],
        ]
    );
    let bad = DdpOptions {
        bucket_cap_mb: 0.0,
        ..Default::default()
    };
    let e = DistributedDataParallel::with_options(Cnn::new(&mut Rng::seed_from(1)), &world, bad)
        .unwrap_err();
    assert!(e.to_string().contains("bucket_cap_mb"), "{e}");
}

#[test]
fn unused_parameters_are_named_unless_allowed() {
    #[derive(Module)]
    struct Two {
        used: Tensor<(C<2>,)>,
        idle: Tensor<(C<2>,)>,
    }
    let two = || Two {
        used: Tensor::ones().requires_grad(),
        idle: Tensor::ones().requires_grad(),
    };
    let world = ProcessGroup::single();
    let strict = DistributedDataParallel::new(two(), &world).unwrap();
    let e = strict.module().used.sum_all().try_backward().unwrap_err();
    assert!(
        e.to_string().contains("`idle`") || e.to_string().contains("idle"),
        "{e}"
    );
    drop(strict);
    let opts = DdpOptions {
        find_unused_parameters: true,
        ..Default::default()
    };
    let lenient = DistributedDataParallel::with_options(two(), &world, opts).unwrap();
    lenient.module().used.sum_all().backward();
    assert_eq!(lenient.module().used.grad().unwrap().to_vec(), [1.0, 1.0]);
    assert!(lenient.module().idle.grad().is_none());
}

#[test]
fn no_sync_accumulates_and_the_hooks_go_with_the_wrapper() {
    let world = ProcessGroup::single();
    let w = Tensor::<(C<2>,)>::from_vec(vec![1.0, 2.0], (C,))
        .unwrap()
        .requires_grad();
    let ddp = DistributedDataParallel::new(w.clone(), &world).unwrap();
    {
        let _local = ddp.no_sync();
        w.mul_scalar(2.0).sum_all().backward();
    }
    w.mul_scalar(3.0).sum_all().backward();
    assert_eq!(w.grad().unwrap().to_vec(), [5.0, 5.0]);
    drop(ddp);
    // Without the wrapper, a parameter may be left out of a backward again.
    w.zero_grad();
    Tensor::<(C<1>,)>::ones()
        .requires_grad()
        .sum_all()
        .backward();
    assert!(w.grad().is_none());
}

#[test]
fn pytorch_ddp_checkpoints_load_without_their_prefix() {
    let mut sd = StateDict::new();
    let lin = Linear::<2, 1>::new(&Cpu, &mut Rng::seed_from(0));
    for (k, v) in lin.state_dict().iter() {
        sd.insert(format!("module.{k}"), v.clone());
    }
    let stripped = strip_module_prefix(&sd);
    assert_eq!(stripped.keys().collect::<Vec<_>>(), ["weight", "bias"]);
    let world = ProcessGroup::single();
    let mut ddp =
        DistributedDataParallel::new(Linear::<2, 1>::new(&Cpu, &mut Rng::seed_from(9)), &world)
            .unwrap();
    ddp.load_state_dict(&sd).unwrap();
    assert_eq!(ddp.module().weight.to_vec(), lin.weight.to_vec());
    // Keys without the prefix pass through.
    assert_eq!(strip_module_prefix(&lin.state_dict()).keys().count(), 2);
}

#[test]
fn the_single_group_is_the_identity() {
    let g = ProcessGroup::single();
    assert_eq!((g.rank(), g.world_size(), g.backend()), (0, 1, "local"));
    let x = Tensor::<(C<3>,)>::from_vec(vec![1.0, 2.0, 3.0], (C,)).unwrap();
    g.all_reduce(&x, ReduceOp::Mean).unwrap();
    assert_eq!(x.to_vec(), [1.0, 2.0, 3.0]);
    assert_eq!(g.all_gather(&x).unwrap()[0].to_vec(), [1.0, 2.0, 3.0]);
    assert_eq!(
        g.reduce_scatter(std::slice::from_ref(&x), ReduceOp::Sum)
            .unwrap()
            .to_vec(),
        [1.0, 2.0, 3.0]
    );
    g.broadcast(&x, 0).unwrap();
    let e = g.broadcast(&x, 1).unwrap_err();
    assert!(matches!(e, DistError::Invalid { .. }), "{e}");
    let flags = Tensor::<(C<1>,), bool>::from_vec(vec![true], (C,)).unwrap();
    assert!(g.all_reduce(&flags, ReduceOp::Sum).is_err());
    assert!(g.new_group(&[0]).unwrap().is_some());
    assert!(g.new_group(&[0, 0]).is_err());
}

#[test]
fn a_loader_with_a_distributed_sampler_yields_its_share() {
    let x =
        Tensor::<(Dyn, C<1>)>::from_vec((0..10).map(|v| v as f32).collect(), (Dyn(10), C)).unwrap();
    let y = Tensor::<(Dyn,), i64>::from_vec((0..10).collect(), (Dyn(10),)).unwrap();
    let mut seen = Vec::new();
    for rank in 0..3 {
        let s = DistributedSampler::new(3, rank).unwrap().seed(4);
        let mut loader = DataLoader::new(TensorDataset::new(&x, &y).unwrap(), 2)
            .unwrap()
            .sampler(s);
        assert_eq!(
            loader.len(),
            2,
            "4 items per rank (10 padded to 12), batches of 2"
        );
        let mut mine = Vec::new();
        for b in loader.iter() {
            let (_, yb): (Tensor<(Dyn, C<1>)>, Tensor<(Dyn,), i64>) = b.unwrap();
            mine.extend(yb.to_vec());
        }
        assert_eq!(
            mine,
            s.indices(10, 0)
                .iter()
                .map(|&i| i as i64)
                .collect::<Vec<_>>()
        );
        seen.extend(mine);
    }
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
}

#[test]
fn a_failed_backward_leaves_the_wrapper_usable() {
    #[derive(Module)]
    struct Two {
        a: Tensor<(C<2>,)>,
        b: Tensor<(C<2>,)>,
    }
    impl Forward<Tensor<(C<2>,)>, Tensor<(C<2>,)>> for Two {
        fn try_forward(&self, x: Tensor<(C<2>,)>) -> forma::core::Result<Tensor<(C<2>,)>> {
            Ok(&(&x * &self.a) + &self.b)
        }
    }
    let world = ProcessGroup::single();
    let ddp = DistributedDataParallel::new(
        Two {
            a: Tensor::ones().requires_grad(),
            b: Tensor::ones().requires_grad(),
        },
        &world,
    )
    .unwrap();
    let x = Tensor::<(C<2>,)>::from_vec(vec![2.0, 3.0], (C,)).unwrap();
    // `a` gets its gradient first (its hook starts the reduction and queues
    // the end-of-backward callback), then `fail`'s hook fails the backward,
    // which drops that callback.
    let fail = Tensor::<(Dyn,)>::ones_on((Dyn(2),), &Cpu).requires_grad();
    fail.register_hook(|_| Some(Tensor::<(Dyn,)>::ones_on((Dyn(3),), &Cpu)));
    let e = (&fail.sum_all() + &ddp.module().a.sum_all())
        .try_backward()
        .unwrap_err();
    assert!(e.to_string().contains("register_hook"), "{e}");
    // The next forward starts clean: a backward that leaves `b` out is
    // reported again (the end-of-backward check runs), and a full step
    // reduces and writes the gradients.
    let _ = ddp.forward(x.clone());
    let e = ddp.module().a.sum_all().try_backward().unwrap_err();
    assert!(e.to_string().contains("received no gradient"), "{e}");
    ddp.module().a.zero_grad();
    ddp.forward(x).sum_all().backward();
    assert_eq!(ddp.module().a.grad().unwrap().to_vec(), [2.0, 3.0]);
    assert_eq!(ddp.module().b.grad().unwrap().to_vec(), [1.0, 1.0]);
}
