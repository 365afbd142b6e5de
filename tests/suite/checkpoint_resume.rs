//! Resuming from a checkpoint file continues a run bit-identically on the
//! CPU: the model, the optimizer's moments and step counts, the scheduler and
//! the data loader's position (mid-epoch, with shuffling and workers) all go
//! through one safetensors file written by `TrainingState::save`.

use forma::nn::data::{DataLoader, TensorDataset};
use forma::nn::layers::Linear;
use forma::nn::optim::{Adam, AdamOptions, Optimizer};
use forma::nn::sched::{LrScheduler, StepLR};
use forma::nn::state::TrainingState;
use forma::prelude::*;
use std::collections::BTreeMap;

#[derive(Module)]
struct Mlp {
    fc1: Linear<8, 16>,
    fc2: Linear<16, 3>,
}

impl Mlp {
    fn new(seed: u64) -> Self {
        let mut rng = Rng::seed_from(seed);
        Mlp {
            fc1: Linear::new(&Cpu, &mut rng),
            fc2: Linear::new(&Cpu, &mut rng),
        }
    }

    fn flat(&self) -> Vec<u32> {
        self.state_dict()
            .iter()
            .flat_map(|(_, d)| d.to_vec::<f32>())
            .map(f32::to_bits)
            .collect()
    }
}

fn dataset() -> TensorDataset<(C<8>,)> {
    let mut rng = Rng::seed_from(3);
    let x: Vec<f32> = (0..100 * 8).map(|_| rng.normal() as f32).collect();
    let y: Vec<i64> = (0..100).map(|i| (i % 3) as i64).collect();
    TensorDataset::from_vec(x, (C,), y).expect("100 items")
}

fn loader() -> DataLoader<TensorDataset<(C<8>,)>> {
    DataLoader::new(dataset(), 16)
        .expect("batch size")
        .shuffle(11)
        .num_workers(2)
}

fn optimizer() -> Adam {
    Adam::new(AdamOptions::default().lr(0.02).weight_decay(1e-3))
}

/// Trains `steps` batches from the loader's current position.
fn train(
    model: &Mlp,
    opt: &mut Adam,
    sched: &mut StepLR,
    data: &mut DataLoader<TensorDataset<(C<8>,)>>,
    steps: usize,
) {
    let mut done = 0;
    while done < steps {
        for batch in data.iter() {
            let (x, y) = batch.expect("batch");
            let logits = model.fc2.forward(model.fc1.forward(x).relu());
            let y: Tensor<(Dyn, C<1>), i64> = y.unsqueeze::<1>().try_into_shape().expect("labels");
            let loss = -logits.log_softmax::<1>().gather::<1, _>(&y).mean_all();
            opt.zero_grad(model);
            loss.backward();
            opt.step(model);
            sched.step(opt);
            done += 1;
            if done == steps {
                return;
            }
        }
    }
}

#[test]
fn a_run_resumed_from_a_file_matches_an_uninterrupted_one_bit_for_bit() {
    const TOTAL: usize = 20; // 7 batches per epoch: ends in the third epoch
    const CUT: usize = 9; // mid-way through the second epoch

    let straight = Mlp::new(1);
    let mut opt = optimizer();
    let mut sched = StepLR::new(&mut opt, 4, 0.5);
    let mut data = loader();
    train(&straight, &mut opt, &mut sched, &mut data, TOTAL);

    let first = Mlp::new(1);
    let mut opt1 = optimizer();
    let mut sched1 = StepLR::new(&mut opt1, 4, 0.5);
    let mut data1 = loader();
    train(&first, &mut opt1, &mut sched1, &mut data1, CUT);
    let state = TrainingState {
        model: first.state_dict(),
        optimizer: Some(opt1.state_dict()),
        scheduler: Some(sched1.state_dict()),
        loader: Some(data1.state()),
        extra: BTreeMap::from([("step".to_string(), CUT.to_string())]),
    };
    let dir = std::env::temp_dir().join(format!("forma-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.safetensors");
    state.save(&path).unwrap();
    drop((first, opt1, sched1, data1, state));

    // A fresh process: everything rebuilt from other seeds, then loaded.
    let loaded = TrainingState::load(&path).unwrap();
    assert_eq!(loaded.extra["step"], CUT.to_string());
    let mut resumed = Mlp::new(77);
    resumed.load_state_dict(&loaded.model).unwrap();
    let mut opt2 = optimizer();
    let mut sched2 = StepLR::new(&mut opt2, 4, 0.5);
    opt2.load_state_dict(&resumed, loaded.optimizer.as_ref().unwrap())
        .unwrap();
    sched2
        .load_state_dict(loaded.scheduler.as_ref().unwrap())
        .unwrap();
    let mut data2 = loader();
    data2.set_state(loaded.loader.unwrap()).unwrap();
    train(&resumed, &mut opt2, &mut sched2, &mut data2, TOTAL - CUT);

    assert_eq!(straight.flat(), resumed.flat(), "bit-identical parameters");
    assert_eq!(opt.state_dict(), opt2.state_dict(), "optimizer state");
    assert_eq!(data.state(), data2.state(), "loader position");
    assert_ne!(straight.flat(), Mlp::new(1).flat(), "the run trained");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_checkpoint_of_another_kind_is_refused() {
    let mut sd = forma::nn::StateDict::new();
    sd.insert(
        "stray",
        forma::TensorData::from_vec(&[1.0f32], vec![1]).unwrap(),
    );
    let bytes = forma::nn::state::file::to_bytes(&sd, &BTreeMap::new()).unwrap();
    let err = TrainingState::from_bytes(&bytes, "x.safetensors").unwrap_err();
    assert!(
        err.to_string().contains("not a training checkpoint"),
        "{err}"
    );
}
