//! Loads that PyTorch accepts on purpose: a BatchNorm checkpoint without
//! `num_batches_tracked` (PyTorch before 0.4.1, and many converted files)
//! loads strictly and keeps the module's counter, as PyTorch 2.15 does for
//! any state dict without version metadata. Fixtures from
//! `tools/gen_checkpoint_fixtures.py` (PyTorch wrote the files and the
//! eval-mode outputs after its own strict load).

use crate::common::*;
use forma::nn::layers::{BatchNorm2d, Conv2d};
use forma::nn::state::load_file;
use forma::nn::Module;
use forma::prelude::*;

fn fixture_path(name: &str) -> String {
    format!("{}/tools/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `[n, CH, h, w]` input stored by the generator.
fn io<const CH: usize>(key: &str) -> Tensor<(Dyn, C<CH>, Dyn, Dyn)> {
    let a = Fixture::load("bn_no_num_batches_tracked_io").array::<f32>(key);
    assert_eq!(a.shape[1], CH);
    let dims = (Dyn(a.shape[0]), C, Dyn(a.shape[2]), Dyn(a.shape[3]));
    Tensor::from_vec(a.data, dims).unwrap()
}

#[test]
fn batch_norm_without_num_batches_tracked_loads_strictly() {
    let sd = load_file(fixture_path("bn_no_num_batches_tracked.safetensors"))
        .unwrap()
        .tensors;
    assert!(!sd.contains_key("num_batches_tracked"));
    let mut bn = BatchNorm2d::<3>::new(&Cpu);
    let report = bn
        .load_state_dict(&sd)
        .expect("PyTorch loads it with strict=True");
    assert!(report.missing_keys.is_empty() && report.unexpected_keys.is_empty());
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item(), 0);
    bn.eval();
    let x = io::<3>("bn.input");
    let y = bn.forward(x);
    let want = Fixture::load("bn_no_num_batches_tracked_io").array::<f32>("bn.output");
    assert_close(&y.to_vec(), &want.data, 1e-5, 1e-6);
}

#[test]
fn a_missing_counter_keeps_the_modules_own() {
    let sd = load_file(fixture_path("bn_no_num_batches_tracked.safetensors"))
        .unwrap()
        .tensors;
    let mut bn = BatchNorm2d::<3>::new(&Cpu);
    bn.num_batches_tracked.as_ref().unwrap().fill(5.0);
    bn.load_state_dict(&sd).unwrap();
    assert_eq!(
        bn.num_batches_tracked.as_ref().unwrap().item(),
        5,
        "PyTorch keeps it too"
    );
    // Other buffers stay required.
    let mut partial = sd.clone();
    partial.remove("running_var");
    let err = bn.load_state_dict(&partial).unwrap_err();
    assert_eq!(err.missing_keys, ["running_var"]);
}

#[test]
fn a_sequential_conv_and_batch_norm_loads_and_matches_pytorch() {
    let sd = load_file(fixture_path("bn_no_num_batches_tracked_seq.safetensors"))
        .unwrap()
        .tensors;
    let mut rng = Rng::seed_from(0);
    let mut model = (
        Conv2d::<1, 3, 3>::new(&Cpu, &mut rng),
        BatchNorm2d::<3>::new(&Cpu),
    );
    model.load_state_dict(&sd).expect("strict load");
    model.eval();
    let x = io::<1>("seq.input");
    let h: Tensor<(Dyn, C<3>, Dyn, Dyn)> = model.0.forward(x);
    let y = model.1.forward(h);
    let want = Fixture::load("bn_no_num_batches_tracked_io").array::<f32>("seq.output");
    assert_close(&y.to_vec(), &want.data, 1e-5, 1e-5);
    assert_eq!(model.1.num_batches_tracked.as_ref().unwrap().item(), 0);
}
