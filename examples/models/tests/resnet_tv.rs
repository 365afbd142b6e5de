//! Forma's ResNets against torchvision's (fixtures from
//! `tools/gen_resnet_fixtures.py`):
//!
//! - the full-size ResNet-18 and ResNet-50 have torchvision's `state_dict`
//!   keys and shapes in torchvision's order, and its parameter counts;
//! - narrow twins of both (torchvision's own blocks and `_make_layer` at
//!   width 8 and 4, 10 classes) load from torchvision's `state_dict`
//!   strictly and give its logits in eval mode; in training mode they give
//!   its logits and loss, update the running statistics as it does, and
//!   give its gradients for the input and for parameters of the stem, the
//!   blocks, a projection shortcut and the head;
//! - a file of the wrong shape, block kind or class count is refused with
//!   the key named; a new head loads the backbone strictly and sets the
//!   file's head aside.

mod common;

use common::{assert_same_tensors, elements, entry, fixture, fixture_file, with_file};
use forma::core::{Backend, Shape};
use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::module::{Cx, Visitor};
use forma::nn::{Module, StateDict};
use forma::prelude::*;
use forma::TensorData;
use forma_models::resnet::{
    BasicBlock, BlockKind, Bottleneck, ResNet, ResNet18, ResNet50, ResNetConfig,
};
use forma_models::ModelError;
use std::collections::BTreeMap;

/// The narrow twins' class count (the generator's `CLASSES`).
const CLASSES: usize = 10;
type Twin18 = ResNet18<CLASSES>;
type Twin50 = ResNet50<CLASSES>;

/// Forma in f64 against torch in f64: the largest difference, relative to
/// the largest value of each tensor. Both compute the same sums in another
/// order, so only float64 rounding separates them.
const F64_REL: f64 = 1e-9;

fn io() -> StateDict {
    fixture_file("resnet_io.safetensors")
}

fn values(sd: &StateDict, key: &str) -> Vec<f64> {
    entry(sd, key).to_vec::<f64>()
}

/// Fails unless `got` is within `rel` times the largest `|want|`, element
/// by element.
fn assert_rel(what: &str, got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{what}: the expected values are all zero");
    let (mut worst, mut at) = (0f64, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        assert!(!d.is_nan(), "{what}[{i}]: {g} vs {w}");
        if d > worst {
            (worst, at) = (d, i);
        }
    }
    println!(
        "{what}: max |diff| / max |want| = {:.2e} (bound {rel:.2e})",
        worst / scale
    );
    assert!(
        worst <= rel * scale,
        "{what}[{at}]: {} vs {} (|diff| {worst:e} > {rel:e} x {scale:e})",
        got[at],
        want[at]
    );
}

/// Compares `got` (computed in `E`) with torch's float64 `<name>.<key>`:
/// within [`F64_REL`] in f64; in f32 within the bound the generator derived
/// from torch's own float32 error on that tensor (`<name>.f32_tolerance.<key>`).
fn check<E: Dtype>(io: &StateDict, name: &str, key: &str, got: &TensorData) {
    let want = entry(io, &format!("{name}.{key}"));
    assert_eq!(got.dims(), want.dims(), "{name}.{key}: sizes");
    let rel = if E::DTYPE == DType::F64 {
        F64_REL
    } else {
        values(io, &format!("{name}.f32_tolerance.{key}"))[0]
    };
    assert_rel(
        &format!("{name}.{key} ({:?})", E::DTYPE),
        &got.to_vec::<f64>(),
        &want.to_vec::<f64>(),
        rel,
    );
}

/// The fixture input `[2, 3, 48, 48]`, in `E`.
fn input<E: Float>(io: &StateDict) -> Tensor<(Dyn, C<3>, C<48>, C<48>), E> {
    Tensor::try_from_data(entry(io, "x"), &Cpu).expect("x is [2, 3, 48, 48]")
}

fn tv_layout(model: &str) -> (Vec<(String, Vec<usize>)>, usize) {
    let (keys, doc) = common::layout("resnet_layouts.json", model);
    let params = doc["parameters"].as_u64().expect("a count") as usize;
    (keys, params)
}

/// Parameter elements of a layout (the BatchNorm buffers left out, as
/// `sum(p.numel() for p in model.parameters())` does).
fn parameters(layout: &[(String, Vec<usize>)]) -> usize {
    elements(layout.iter().filter(|(k, _)| {
        !(k.ends_with("running_mean")
            || k.ends_with("running_var")
            || k.ends_with("num_batches_tracked"))
    }))
}

#[test]
fn resnet18_has_torchvisions_keys_and_shapes() {
    let ours = ResNet18::<1000>::state_dict_layout(&ResNetConfig::resnet18(), &Cpu);
    let (tv, params) = tv_layout("resnet18");
    assert_eq!(tv.len(), 122);
    assert_eq!(ours, tv);
    assert_eq!(params, 11_689_512);
    assert_eq!(parameters(&ours), 11_689_512);
}

#[test]
fn resnet50_has_torchvisions_keys_and_shapes() {
    let ours = ResNet50::<1000>::state_dict_layout(&ResNetConfig::resnet50(), &Cpu);
    let (tv, params) = tv_layout("resnet50");
    assert_eq!(tv.len(), 320);
    assert_eq!(ours, tv);
    assert_eq!(params, 25_557_032);
    assert_eq!(parameters(&ours), 25_557_032);
    // A freshly built network counts the same, and holds them.
    let net: ResNet50 = ResNet50::new(&ResNetConfig::resnet50(), &Cpu, &mut Rng::seed_from(0));
    assert_eq!(net.num_parameters(), 25_557_032);
}

fn load<K: BlockKind, E: Float>(file: &str) -> ResNet<K, CLASSES, E> {
    ResNet::from_safetensors(fixture(file), &Cpu)
        .unwrap_or_else(|e| panic!("{file}: {e}"))
        .model
}

/// The network loaded from `file` holds exactly the file's keys (a
/// safetensors file stores them sorted; the order is checked against
/// torchvision's by the layout tests) and its values bit for bit.
fn loads_as_stored<K: BlockKind>(file: &str, config: ResNetConfig) {
    let net = load::<K, f32>(file);
    assert_eq!(
        net.config(),
        config,
        "{file}: blocks and width from the file"
    );
    assert!(!net.is_training(), "a loaded network is in eval mode");
    assert_same_tensors(file, &net.state_dict(), &fixture_file(file));
}

#[test]
fn the_twins_load_strictly_with_their_blocks_and_width_read_from_the_file() {
    loads_as_stored::<BasicBlock>(
        "resnet18_w8.safetensors",
        ResNetConfig::resnet18().with_width(8),
    );
    loads_as_stored::<Bottleneck>(
        "resnet50_w4.safetensors",
        ResNetConfig::resnet50().with_width(4),
    );
    let net = load::<Bottleneck, f32>("resnet50_w4.safetensors");
    assert_eq!(
        net.state_dict()
            .get("layer2.3.bn3.num_batches_tracked")
            .map(|d| d.to_vec::<i64>()),
        Some(vec![2]),
        "the counters come from the file"
    );
}

fn eval_matches<K: BlockKind, E: Float>(name: &str) {
    let io = io();
    let net: ResNet<K, CLASSES, E> = load(&format!("{name}.safetensors"));
    let logits: Tensor<(Dyn, C<CLASSES>), E> = net.forward(input(&io));
    assert_eq!(logits.dims()[..], [2, CLASSES]);
    check::<E>(&io, name, "eval.logits", &logits.to_data());
}

#[test]
fn resnet18_eval_logits_match_torchvision() {
    eval_matches::<BasicBlock, f64>("resnet18_w8");
    eval_matches::<BasicBlock, f32>("resnet18_w8");
}

#[test]
fn resnet50_eval_logits_match_torchvision() {
    eval_matches::<Bottleneck, f64>("resnet50_w4");
    eval_matches::<Bottleneck, f32>("resnet50_w4");
}

/// The gradients of the named parameters (those that have one).
fn grads_of<M: Module>(m: &M) -> BTreeMap<String, TensorData> {
    struct Grads(BTreeMap<String, TensorData>);
    impl Visitor for Grads {
        fn tensor<S: Shape, E: Dtype, D: Backend>(
            &mut self,
            cx: &Cx,
            t: &forma::core::Tensor<S, E, D>,
        ) {
            if let Some(g) = t.grad() {
                self.0.insert(cx.path().to_string(), g.to_data());
            }
        }
    }
    let mut g = Grads(BTreeMap::new());
    m.visit(&mut Cx::new(), &mut g);
    g.0
}

fn train_matches<K: BlockKind, E: Float>(name: &str) {
    let io = io();
    let mut net: ResNet<K, CLASSES, E> = load(&format!("{name}.safetensors"));
    net.train();
    let x = input::<E>(&io).requires_grad();
    let target: Tensor<(Dyn,), i64> = Tensor::try_from_data(entry(&io, "target"), &Cpu).unwrap();
    let logits: Tensor<(Dyn, C<CLASSES>), E> = net.forward(x.clone());
    check::<E>(&io, name, "train.logits", &logits.to_data());
    let loss = cross_entropy(&logits, &target, Mean);
    check::<E>(&io, name, "train.loss", &loss.to_data());
    loss.backward();

    // Every BatchNorm buffer after that one forward.
    let sd = net.state_dict();
    let prefix = format!("{name}.train.state.");
    let mut buffers = 0;
    for key in io.keys().filter_map(|k| k.strip_prefix(&prefix)) {
        buffers += 1;
        let got = sd.get(key).unwrap_or_else(|| panic!("no {key}"));
        if key.ends_with("num_batches_tracked") {
            assert_eq!(got.to_vec::<i64>(), [3], "{key}");
        } else {
            check::<E>(&io, name, &format!("train.state.{key}"), got);
        }
    }
    let norms = sd.keys().filter(|k| k.ends_with("running_var")).count();
    assert_eq!(
        buffers,
        3 * norms,
        "every norm's three buffers were compared"
    );

    let gx = x.grad().expect("the input's gradient");
    check::<E>(&io, name, "grad.x", &gx.to_data());
    let ours = grads_of(&net);
    assert_eq!(
        ours.len(),
        net.named_parameters().len(),
        "every parameter got a gradient"
    );
    // The parameters whose gradients the generator records (its `GRADS`).
    let prefix = format!("{name}.grad.");
    let grads: Vec<&str> = io
        .keys()
        .filter_map(|k| k.strip_prefix(&prefix))
        .filter(|k| *k != "x")
        .collect();
    assert_eq!(grads.len(), 10, "{name}: {grads:?}");
    for key in grads {
        let got = ours
            .get(key)
            .unwrap_or_else(|| panic!("no gradient for {key}"));
        check::<E>(&io, name, &format!("grad.{key}"), got);
    }
}

#[test]
fn resnet18_training_step_matches_torchvision() {
    train_matches::<BasicBlock, f64>("resnet18_w8");
    train_matches::<BasicBlock, f32>("resnet18_w8");
}

#[test]
fn resnet50_training_step_matches_torchvision() {
    train_matches::<Bottleneck, f64>("resnet50_w4");
    train_matches::<Bottleneck, f32>("resnet50_w4");
}

fn twin18_file() -> StateDict {
    fixture_file("resnet18_w8.safetensors")
}

/// The load error's message, from a file holding `sd`.
fn refusal<K: BlockKind, const N: usize>(name: &str, sd: &StateDict) -> String {
    with_file(name, sd, |path| {
        match ResNet::<K, N>::from_safetensors(path, &Cpu) {
            Ok(_) => panic!("{name}: the file was accepted"),
            Err(e @ ModelError::Load { .. }) => e.to_string(),
            Err(e) => panic!("{name}: refused for another reason: {e}"),
        }
    })
}

#[test]
fn a_wrong_shape_is_refused_naming_the_key() {
    let mut sd = twin18_file();
    sd.insert(
        "layer3.1.conv2.weight",
        TensorData::from_vec(&vec![0.5f32; 32 * 32 * 3 * 3 * 2], vec![32, 64, 3, 3]).unwrap(),
    );
    let msg = refusal::<BasicBlock, CLASSES>("shape", &sd);
    assert!(msg.contains("layer3.1.conv2.weight"), "{msg}");
    assert!(
        msg.contains("[32, 32, 3, 3]") && msg.contains("[32, 64, 3, 3]"),
        "{msg}"
    );
    assert!(msg.contains("forma-models-"), "the file is named: {msg}");
}

#[test]
fn another_block_kind_or_class_count_is_refused_naming_the_keys() {
    // A ResNet-18 file is no ResNet-50.
    let msg = refusal::<Bottleneck, CLASSES>("kind", &twin18_file());
    assert!(msg.contains("layer1.0.conv3.weight"), "{msg}");
    // A 10-class file is no 1000-class network.
    let msg = refusal::<BasicBlock, 1000>("classes", &twin18_file());
    assert!(
        msg.contains("fc.weight") && msg.contains("[1000, 64]"),
        "{msg}"
    );
    // A missing key is named too.
    let mut sd = twin18_file();
    sd.remove("layer4.1.bn2.running_var");
    let msg = refusal::<BasicBlock, CLASSES>("missing", &sd);
    assert!(msg.contains("layer4.1.bn2.running_var"), "{msg}");
}

/// The width comes from the file's `conv1.weight`; a file whose other
/// tensors do not fit that width is refused before the network is built,
/// so a 1 MB file cannot make it allocate a ResNet-18 of width 2048 (11.7
/// billion parameters).
#[test]
fn a_file_asking_for_a_huge_network_is_refused_before_anything_is_allocated() {
    let mut sd = twin18_file();
    sd.insert(
        "conv1.weight",
        TensorData::from_vec(&vec![0f32; 2048 * 3 * 7 * 7], vec![2048, 3, 7, 7]).unwrap(),
    );
    let msg = refusal::<BasicBlock, CLASSES>("huge", &sd);
    assert!(
        msg.contains("bn1.weight") && msg.contains("[2048]"),
        "{msg}"
    );
    assert!(msg.contains("more"), "the rest are counted: {msg}");

    // A stage without blocks is named too.
    let mut sd = twin18_file();
    let stage4: Vec<String> = sd
        .keys()
        .filter(|k| k.starts_with("layer4."))
        .map(String::from)
        .collect();
    for k in &stage4 {
        sd.remove(k);
    }
    let err = with_file("no-stage", &sd, |p| {
        Twin18::from_safetensors(p, &Cpu).map(|_| ())
    });
    assert!(
        matches!(err, Err(ModelError::NoLayers("layer4"))),
        "{err:?}"
    );
}

#[test]
fn files_without_num_batches_tracked_load_like_pytorch() {
    let mut sd = twin18_file();
    let counters: Vec<String> = sd
        .keys()
        .filter(|k| k.ends_with("num_batches_tracked"))
        .map(String::from)
        .collect();
    assert_eq!(counters.len(), 20);
    for k in &counters {
        sd.remove(k);
    }
    let net = with_file("legacy", &sd, |p| Twin18::from_safetensors(p, &Cpu))
        .expect("loads")
        .model;
    let ours = net.state_dict();
    for k in &counters {
        assert_eq!(ours.get(k).map(|d| d.to_vec::<i64>()), Some(vec![0]), "{k}");
    }
    let io = io();
    let logits: Tensor<(Dyn, C<CLASSES>)> = net.forward(input(&io));
    check::<f32>(&io, "resnet18_w8", "eval.logits", &logits.to_data());
}

#[test]
fn a_new_head_keeps_the_backbone_and_sets_the_files_head_aside() {
    let mut rng = Rng::seed_from(7);
    let loaded = ResNet18::<3>::from_safetensors_new_head(
        fixture("resnet18_w8.safetensors"),
        &Cpu,
        &mut rng,
    )
    .expect("a 10-class file under a 3-class head");
    assert_eq!(loaded.report.dropped, ["fc.bias", "fc.weight"]);
    let net = loaded.model;
    assert!(!net.is_training());
    let tv = twin18_file();
    let ours = net.state_dict();
    for (k, d) in tv.iter().filter(|(k, _)| !k.starts_with("fc.")) {
        assert_eq!(ours.get(k), Some(d), "{k} is the file's");
    }
    assert_eq!(ours.get("fc.weight").unwrap().dims(), [3, 64]);
    let bound = 1.0 / 64f32.sqrt();
    let w = ours.get("fc.weight").unwrap().to_vec::<f32>();
    assert!(w.iter().all(|v| v.abs() <= bound) && w.iter().any(|v| *v != 0.0));

    // The pooled features are the backbone's: the old head on them gives
    // torchvision's logits, the new one gives 3 classes.
    let io = io();
    let feats = net.features(input(&io)).unwrap();
    assert_eq!(feats.dims()[..], [2, 64]);
    let old = load::<BasicBlock, f32>("resnet18_w8.safetensors");
    let logits: Tensor<(Dyn, C<CLASSES>)> = old.fc.forward(feats.clone());
    check::<f32>(&io, "resnet18_w8", "eval.logits", &logits.to_data());
    let three: Tensor<(Dyn, C<3>)> = net.forward(input(&io));
    assert_eq!(three.dims()[..], [2, 3]);

    // A wrong backbone is still refused, naming the key.
    let mut sd = twin18_file();
    sd.remove("layer1.1.conv1.weight");
    let err = with_file("new-head", &sd, |p| {
        ResNet18::<3>::from_safetensors_new_head(p, &Cpu, &mut rng).map(|_| ())
    })
    .expect_err("a backbone key is missing");
    assert!(err.to_string().contains("layer1.1.conv1.weight"), "{err}");
}

#[test]
fn with_head_swaps_only_the_head() {
    let net = load::<BasicBlock, f32>("resnet18_w8.safetensors");
    let before = net.state_dict();
    let net: ResNet18<5> = net.with_head(&mut Rng::seed_from(3));
    assert!(!net.is_training(), "the mode is kept");
    let after = net.state_dict();
    assert_eq!(after.get("fc.weight").unwrap().dims(), [5, 64]);
    assert_eq!(after.get("fc.bias").unwrap().dims(), [5]);
    for (k, d) in before.iter().filter(|(k, _)| !k.starts_with("fc.")) {
        assert_eq!(after.get(k), Some(d), "{k}");
    }
    assert_eq!(after.len(), before.len());
}

#[test]
fn forma_saves_load_back_and_print_like_torchvision() {
    let net = load::<Bottleneck, f32>("resnet50_w4.safetensors");
    let sd = net.state_dict();
    let again = with_file("round-trip", &sd, |p| Twin50::from_safetensors(p, &Cpu))
        .expect("Forma's save loads")
        .model;
    assert_eq!(again.state_dict(), sd);
    let repr = net.repr();
    for line in [
        "ResNet(",
        "(conv1): Conv2d(3, 4, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)",
        "(bn1): BatchNorm2d(4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)",
        "(maxpool): MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)",
        "(0): Bottleneck(",
        "(conv2): Conv2d(8, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)",
        "(fc): Linear(in_features=128, out_features=10, bias=True)",
    ] {
        assert!(repr.contains(line), "no {line:?} in\n{repr}");
    }
}

/// `forma::compile` on a twin: in eval mode the whole forward (convolutions,
/// BatchNorm with running statistics, pooling, the residual adds, the
/// head) replays from its graph and gives the eager logits bit for bit, in
/// f32 and f64; in training mode BatchNorm's statistics update is an
/// in-place write capture refuses, so the forward runs eagerly (explained)
/// and still gives the eager logits.
fn compiled_matches<E: Float>() {
    let io = io();
    for training in [false, true] {
        let mut net: Twin18Of<E> = load("resnet18_w8.safetensors");
        net.set_training(training);
        let model = forma::compile(net);
        let x: Tensor<(Dyn, C<3>, C<48>, C<48>), E> = input(&io);
        let eager: Tensor<(Dyn, C<CLASSES>), E> = model.eager().forward(x.clone());
        let got: Tensor<(Dyn, C<CLASSES>), E> = model.forward(x);
        assert_eq!(got.to_vec(), eager.to_vec(), "training {training}");
        let stats = model.stats();
        assert_eq!(
            stats.fallbacks,
            usize::from(training),
            "{:?}",
            model.explain()
        );
    }
}

type Twin18Of<E> = ResNet<BasicBlock, CLASSES, E>;

#[test]
fn a_compiled_twin_gives_the_eager_logits() {
    compiled_matches::<f32>();
    compiled_matches::<f64>();
}
