//! Forma's ViT against Hugging Face's `ViTForImageClassification`
//! (fixtures from `tools/gen_vit_fixtures.py`, transformers 5.25, eager
//! attention, f32, eval mode): the `save_pretrained` file loads with one
//! call and gives the same logits and last hidden state within 1e-5, the
//! same hidden states and attention probabilities on request, and the same
//! loss and gradients (input pixels and weights of every kind) within 1e-4
//! of each tensor's largest value; its `config.json` is checked against the
//! type; the full-size google/vit-base-patch16-224 layout is the checkpoint's
//! keys and shapes; wrong files are refused naming the key; saves give the
//! file's keys back.

mod common;

use common::{
    assert_close, assert_same_tensors, elements, entry, fixture, fixture_file, with_file,
};
use forma::nn::loss::{cross_entropy, Mean};
use forma::nn::{Module, StateDict};
use forma::prelude::*;
use forma::TensorData;
use forma_models::vit::{ViTBase16, ViTConfig, ViTForImageClassification};
use forma_models::{HfLoadReport, ModelError, Outputs};

/// `TINY_VIT`: 20 x 20 RGB images in 4 x 4 patches, hidden 32, 4 heads,
/// MLP 64, 5 classes; 2 layers.
type Tiny = ViTForImageClassification<20, 4, 3, 32, 4, 64, 5>;
type Pixels<B = Dyn, E = f32> = Tensor<(B, C<3>, C<20>, C<20>), E>;

/// Logits and hidden states, elementwise.
const TOL: f32 = 1e-5;
/// Gradients, relative to each tensor's largest value.
const GRAD_REL: f32 = 1e-4;

fn io() -> StateDict {
    fixture_file("vit_io.safetensors")
}

fn tiny() -> Tiny {
    let loaded =
        Tiny::from_safetensors(fixture("vit_tiny.safetensors"), &Cpu).expect("load vit_tiny");
    assert_eq!(loaded.report, HfLoadReport::default());
    loaded.model
}

fn pixels(io: &StateDict) -> Pixels {
    Tensor::try_from_data(entry(io, "tiny.pixel_values"), &Cpu).expect("[2, 3, 20, 20]")
}

fn want(io: &StateDict, key: &str) -> Vec<f32> {
    entry(io, &format!("tiny.{key}")).to_vec::<f32>()
}

#[test]
fn logits_and_last_hidden_state_match_transformers() {
    let vit = tiny();
    assert!(!vit.is_training(), "a loaded model is in eval mode");
    assert_eq!(
        vit.vit.encoder.layer.len(),
        2,
        "the layer count comes from the file"
    );
    assert_eq!(Tiny::POSITIONS, 26);
    let io = io();
    let out = vit.run(&pixels(&io)).unwrap();
    assert_eq!(out.logits.dims()[..], [2, 5]);
    assert_eq!(out.vit.last_hidden_state.dims()[..], [2, 26, 32]);
    assert!(out.vit.hidden_states.is_none() && out.vit.attentions.is_none());
    assert_close("logits", &out.logits.to_vec(), &want(&io, "logits"), TOL);
    assert_close(
        "last_hidden_state",
        &out.vit.last_hidden_state.to_vec(),
        &want(&io, "last_hidden_state"),
        TOL,
    );
    // The classifier reads the class token, position 0.
    let cls = out
        .vit
        .last_hidden_state
        .narrow::<1>(0, 1)
        .reshape::<(Dyn, C<32>)>();
    assert_eq!(vit.classifier.forward(cls).to_vec(), out.logits.to_vec());
}

/// `forward` keeps the caller's batch type: a static batch stays static.
#[test]
fn forward_takes_typed_images() {
    let vit = tiny();
    let io = io();
    let x: Pixels<C<2>> = pixels(&io).try_into_shape().unwrap();
    let logits: Tensor<(C<2>, C<5>)> = vit.forward(x);
    assert_eq!(
        logits.to_vec(),
        vit.run(&pixels(&io)).unwrap().logits.to_vec()
    );
}

#[test]
fn hidden_states_and_attentions_match_transformers() {
    let vit = tiny();
    let io = io();
    let out = vit.run_with(&pixels(&io), Outputs::ALL).unwrap();
    assert_close(
        "logits with attentions",
        &out.logits.to_vec(),
        &want(&io, "logits"),
        TOL,
    );
    let hidden = out.vit.hidden_states.expect("requested hidden states");
    assert_eq!(hidden.len(), 3, "the embeddings' output, then each layer's");
    for (i, h) in hidden.iter().enumerate() {
        assert_eq!(h.dims()[..], [2, 26, 32]);
        let key = format!("hidden_states.{i}");
        assert_close(&key, &h.to_vec(), &want(&io, &key), TOL);
    }
    // The last one is the raw output of the last layer: the final norm
    // turns it into `last_hidden_state`.
    let normed = vit.vit.layernorm.forward(hidden[2].clone());
    assert_eq!(normed.to_vec(), out.vit.last_hidden_state.to_vec());
    let attentions = out.vit.attentions.expect("requested attentions");
    assert_eq!(attentions.len(), 2);
    for (i, a) in attentions.iter().enumerate() {
        assert_eq!(a.dims()[..], [2, 4, 26, 26]);
        let key = format!("attentions.{i}");
        assert_close(&key, &a.to_vec(), &want(&io, &key), TOL);
        for (r, row) in a.to_vec().chunks(26).enumerate() {
            let sum: f32 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "{key} row {r} sums to {sum}");
        }
    }
}

/// The public layer forward passes compose to the model's.
#[test]
fn the_layers_run_one_by_one() {
    let vit = tiny();
    let io = io();
    let hidden = vit
        .run_with(&pixels(&io), Outputs::ALL)
        .unwrap()
        .vit
        .hidden_states
        .unwrap();
    let x = vit.vit.embeddings.run(&pixels(&io)).unwrap();
    assert_eq!(x.to_vec(), hidden[0].to_vec());
    let (y, probs) = vit.vit.encoder.layer[0].run(x, true).unwrap();
    assert_eq!(y.to_vec(), hidden[1].to_vec());
    assert_eq!(probs.unwrap().dims()[..], [2, 4, 26, 26]);
    let (z, none) = vit.vit.encoder.layer[1].run(y, false).unwrap();
    assert!(none.is_none());
    assert_close(
        "layer 1 (fused attention)",
        &z.to_vec(),
        &hidden[2].to_vec(),
        TOL,
    );
}

/// The gradient the backward pass left in the weight `key` (a file name).
fn grad_of(vit: &Tiny, key: &str) -> TensorData {
    let emb = &vit.vit.embeddings;
    let [l0, l1] = &vit.vit.encoder.layer[..] else {
        panic!("two layers")
    };
    let g = match key {
        "vit.embeddings.cls_token" => emb.cls_token.grad().map(|g| g.to_data()),
        "vit.embeddings.position_embeddings" => emb.position_embeddings.grad().map(|g| g.to_data()),
        "vit.embeddings.patch_embeddings.projection.weight" => emb
            .patch_embeddings
            .projection
            .weight
            .grad()
            .map(|g| g.to_data()),
        "vit.embeddings.patch_embeddings.projection.bias" => {
            let bias = emb.patch_embeddings.projection.bias.as_ref();
            bias.and_then(|b| b.grad()).map(|g| g.to_data())
        }
        "vit.encoder.layer.0.attention.attention.query.weight" => l0
            .attention
            .attention
            .query
            .weight
            .grad()
            .map(|g| g.to_data()),
        "vit.encoder.layer.0.attention.attention.value.bias" => {
            let bias = l0.attention.attention.value.bias.as_ref();
            bias.and_then(|b| b.grad()).map(|g| g.to_data())
        }
        "vit.encoder.layer.0.layernorm_before.weight" => l0
            .layernorm_before
            .weight
            .as_ref()
            .and_then(Tensor::grad)
            .map(|g| g.to_data()),
        "vit.encoder.layer.1.attention.output.dense.weight" => {
            l1.attention.output.dense.weight.grad().map(|g| g.to_data())
        }
        "vit.encoder.layer.1.layernorm_after.bias" => l1
            .layernorm_after
            .bias
            .as_ref()
            .and_then(Tensor::grad)
            .map(|g| g.to_data()),
        "vit.encoder.layer.1.intermediate.dense.weight" => {
            l1.intermediate.dense.weight.grad().map(|g| g.to_data())
        }
        "vit.encoder.layer.1.output.dense.bias" => {
            let bias = l1.output.dense.bias.as_ref();
            bias.and_then(|b| b.grad()).map(|g| g.to_data())
        }
        "vit.layernorm.weight" => vit
            .vit
            .layernorm
            .weight
            .as_ref()
            .and_then(Tensor::grad)
            .map(|g| g.to_data()),
        "classifier.weight" => vit.classifier.weight.grad().map(|g| g.to_data()),
        "classifier.bias" => {
            let bias = vit.classifier.bias.as_ref();
            bias.and_then(|b| b.grad()).map(|g| g.to_data())
        }
        other => panic!("the test does not know the weight {other}"),
    };
    g.unwrap_or_else(|| panic!("{key} has no gradient"))
}

/// `got` against the fixture's `key`, within [`GRAD_REL`] of its largest value.
fn assert_grad(io: &StateDict, key: &str, got: &TensorData) {
    let want = entry(io, &format!("tiny.grad.{key}"));
    assert_eq!(got.dims(), want.dims(), "{key}: sizes");
    let want = want.to_vec::<f32>();
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{key}: the gradient is all zero");
    assert_close(
        &format!("grad {key}"),
        &got.to_vec::<f32>(),
        &want,
        GRAD_REL * scale,
    );
}

/// The loss `ViTForImageClassification(pixel_values, labels=labels)`
/// returns, and its gradients, in eval mode (no dropout).
#[test]
fn loss_and_gradients_match_transformers() {
    let vit = tiny();
    let io = io();
    let x = pixels(&io).requires_grad();
    let labels: Tensor<(Dyn,), i64> =
        Tensor::try_from_data(entry(&io, "tiny.labels"), &Cpu).unwrap();
    let logits = vit.run(&x).unwrap().logits;
    let loss = cross_entropy(&logits, &labels, Mean);
    assert_close("loss", &loss.to_vec(), &want(&io, "loss"), TOL);
    loss.backward();

    let gx = x.grad().expect("the input's gradient");
    assert_grad(&io, "pixel_values", &gx.to_data());
    let keys: Vec<&str> = io
        .keys()
        .filter_map(|k| k.strip_prefix("tiny.grad."))
        .filter(|k| *k != "pixel_values")
        .collect();
    assert_eq!(keys.len(), 14, "{keys:?}");
    for key in keys {
        assert_grad(&io, key, &grad_of(&vit, key));
    }
}

#[test]
fn vit_base_16_has_the_checkpoints_keys_and_shapes() {
    let config = ViTConfig::vit_base();
    let ours = ViTBase16::<1000>::state_dict_layout(&config, &Cpu);
    let (hf, doc) = common::layout("vit_layouts.json", "vit_base_patch16_224");
    let c = &doc["config"];
    assert_eq!(c["num_hidden_layers"], config.num_hidden_layers);
    assert_eq!(c["layer_norm_eps"], config.layer_norm_eps);
    assert_eq!(hf.len(), 200);
    assert_eq!(ours, hf);
    let params = doc["num_parameters"].as_u64().expect("a count") as usize;
    assert_eq!(elements(&ours), params);
    assert_eq!(params, 86_567_656); // google/vit-base-patch16-224's parameter count
    assert_eq!(ViTBase16::<1000>::POSITIONS, 197);
}

#[test]
fn save_then_load_round_trips_the_hf_keys() {
    let vit = tiny();
    let hf = fixture_file("vit_tiny.safetensors");
    assert_same_tensors("vit_tiny", &vit.state_dict(), &hf);
    // Saved by Forma, the file holds the same keys and values, and loads
    // back into a fresh model that computes the same logits.
    let path = common::temp_file("vit_saved");
    vit.save_safetensors(&path).expect("save");
    let saved = forma::nn::state::load_file(&path).unwrap().tensors;
    let again = Tiny::from_safetensors(&path, &Cpu).unwrap().model;
    let _ = std::fs::remove_file(&path);
    assert_same_tensors("saved", &saved, &hf);
    let io = io();
    assert_eq!(
        again.run(&pixels(&io)).unwrap().logits.to_vec(),
        vit.run(&pixels(&io)).unwrap().logits.to_vec()
    );
}

#[test]
fn a_wrong_shaped_file_is_refused_naming_the_key() {
    let key = "vit.embeddings.position_embeddings";
    let mut sd = fixture_file("vit_tiny.safetensors");
    // The table of 16 x 16 images (17 positions) where the type has 20 x 20 (26).
    sd.insert(
        key,
        TensorData::from_vec(&vec![0.0f32; 17 * 32], vec![1, 17, 32]).unwrap(),
    );
    let err = with_file("vit_bad_shape", &sd, |p| Tiny::from_safetensors(p, &Cpu)).unwrap_err();
    let text = err.to_string();
    match &err {
        ModelError::Load { source, .. } => {
            assert_eq!(source.mismatched.len(), 1, "{text}");
            assert_eq!(source.mismatched[0].key, key);
            assert_eq!(source.mismatched[0].expected.0, [1, 26, 32]);
            assert_eq!(source.mismatched[0].found.0, [1, 17, 32]);
        }
        other => panic!("expected a load error, got {other}"),
    }
    assert!(text.contains("vit_bad_shape"), "names the file: {text}");
    // The in-memory load leaves the model as it was.
    let mut vit = Tiny::new(&ViTConfig::with_layers(2), &Cpu, &mut Rng::seed_from(1));
    let before = vit.state_dict();
    assert!(matches!(
        vit.load_hf_state_dict(sd),
        Err(ModelError::Load { .. })
    ));
    assert_eq!(vit.state_dict(), before, "a refused load changes nothing");
}

#[test]
fn a_file_with_other_classes_or_no_layers_is_refused() {
    let hf = fixture_file("vit_tiny.safetensors");
    let err = with_file("vit_five_classes", &hf, |p| {
        ViTForImageClassification::<20, 4, 3, 32, 4, 64, 10>::from_safetensors(p, &Cpu)
    })
    .unwrap_err();
    let ModelError::Load { source, .. } = &err else {
        panic!("{err}")
    };
    let keys: Vec<&str> = source.mismatched.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["classifier.weight", "classifier.bias"], "{err}");

    let no_layers = hf.remap(|k| (!k.starts_with("vit.encoder.")).then(|| k.to_string()));
    let err = with_file("vit_no_layers", &no_layers, |p| {
        Tiny::from_safetensors(p, &Cpu)
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::NoLayers("encoder")), "{err}");
}

#[test]
fn config_json_is_checked_against_the_type() {
    let path = fixture("vit_tiny_config.json");
    let config = Tiny::read_hf_config(&path).unwrap();
    assert_eq!(config, ViTConfig::with_layers(2));
    // The full-size type refuses the tiny file, naming the first size that differs.
    match ViTBase16::<1000>::read_hf_config(&path) {
        Err(ModelError::ConfigMismatch {
            field,
            found,
            expected,
            ..
        }) => assert_eq!(
            (field.as_str(), found.as_str(), expected.as_str()),
            ("image_size", "20", "224")
        ),
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // Five labels in `id2label`, ten in the type.
    let err =
        ViTForImageClassification::<20, 4, 3, 32, 4, 64, 10>::read_hf_config(&path).unwrap_err();
    let text = err.to_string();
    assert!(
        text.ends_with(
            "len(id2label) = 5, the type has 10 \
             (the file describes `ViTForImageClassification<20, 4, 3, 32, 4, 64, 5>`)"
        ),
        "{text}"
    );
}

/// A model folder as `save_pretrained` writes it: `config.json` and
/// `model.safetensors`.
#[test]
fn a_model_folder_loads_in_one_call() {
    let dir = std::env::temp_dir().join(format!("forma-models-{}-vit-dir", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture("vit_tiny_config.json"), dir.join("config.json")).unwrap();
    std::fs::copy(
        fixture("vit_tiny.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    let loaded = Tiny::from_pretrained_dir(&dir, &Cpu);
    let _ = std::fs::remove_dir_all(&dir);
    let loaded = loaded.unwrap();
    assert_eq!(loaded.report, HfLoadReport::default());
    assert!(!loaded.model.is_training());
    let io = io();
    let logits = loaded.model.run(&pixels(&io)).unwrap().logits;
    assert_close("folder logits", &logits.to_vec(), &want(&io, "logits"), TOL);
}

/// A state dict in transformers 5's in-memory module names
/// (`save_file(model.state_dict())` there), renamed key by key as
/// transformers maps them (the layout file records its mapping).
#[test]
fn transformers_5_module_names_load_with_a_report() {
    let (_, doc) = common::layout("vit_layouts.json", "vit_base_patch16_224");
    let module_name = |k: &str| {
        let name = doc["module_names"][k].as_str();
        name.unwrap_or_else(|| panic!("no module name for {k}"))
            .to_string()
    };
    let hf = fixture_file("vit_tiny.safetensors");
    let sd = hf.clone().remap(|k| Some(module_name(k)));
    for key in [
        "vit.layers.0.attention.q_proj.weight",
        "vit.layers.1.mlp.fc2.bias",
    ] {
        assert!(sd.contains_key(key), "{key}");
    }
    let mut vit = Tiny::new(&ViTConfig::with_layers(2), &Cpu, &mut Rng::seed_from(1));
    let report = vit.load_hf_state_dict(sd.clone()).unwrap();
    assert_eq!(vit.state_dict(), tiny().state_dict());
    assert_eq!(report.prefix, None);
    assert!(report.dropped.is_empty());
    // Every layer's key, 16 per layer; the embeddings, the final norm and
    // the classifier keep their names.
    assert_eq!(report.renamed.len(), 2 * 16);
    for (from, to) in &report.renamed {
        assert_eq!(from, &module_name(to), "{to}");
    }
    let loaded = with_file("vit_module_names", &sd, |p| Tiny::from_safetensors(p, &Cpu)).unwrap();
    assert_eq!(loaded.report, report);
    let io = io();
    let logits = loaded.model.run(&pixels(&io)).unwrap().logits;
    assert_close(
        "renamed file's logits",
        &logits.to_vec(),
        &want(&io, "logits"),
        TOL,
    );
}

/// Held by the test that registers forward hooks and by those that run a
/// model of other types: hooks are global, and one that meets another
/// output type at its path fails that run.
static HOOKED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Forward hooks see the modules under their `state_dict` names: the
/// patches' convolution, each layer's MLP output and the classifier.
#[test]
fn forward_hooks_see_the_modules_under_their_keys() {
    let _hooked = HOOKED.lock().unwrap_or_else(|e| e.into_inner());
    use forma::nn::hooks::register_forward_hook;
    use forma::nn::HookHandle;
    use std::sync::{Arc, Mutex};
    type Seen = Arc<Mutex<Vec<(String, Vec<usize>)>>>;
    /// Records the path and sizes of each output at `path`, from this
    /// thread only (hooks are global, and other tests run models too).
    fn record<S: forma::core::Shape>(path: &str, seen: &Seen) -> HookHandle {
        let (seen, me) = (Arc::clone(seen), std::thread::current().id());
        register_forward_hook(path, move |at, y: &Tensor<S>| {
            if std::thread::current().id() == me {
                seen.lock()
                    .unwrap()
                    .push((at.to_string(), y.dims().to_vec()));
            }
            None
        })
    }
    let vit = tiny();
    let seen: Seen = Arc::default();
    let handles = [
        record::<(Dyn, C<32>, Dyn, Dyn)>("vit.embeddings.patch_embeddings.projection", &seen),
        record::<(Dyn, Dyn, C<32>)>("vit.encoder.layer.*.output.dense", &seen),
        record::<(Dyn, C<5>)>("classifier", &seen),
    ];
    vit.run(&pixels(&io())).unwrap();
    for h in handles {
        h.remove();
    }
    let want = [
        (
            "vit.embeddings.patch_embeddings.projection",
            vec![2, 32, 5, 5],
        ),
        ("vit.encoder.layer.0.output.dense", vec![2, 26, 32]),
        ("vit.encoder.layer.1.output.dense", vec![2, 26, 32]),
        ("classifier", vec![2, 5]),
    ];
    let want: Vec<(String, Vec<usize>)> =
        want.into_iter().map(|(p, d)| (p.to_string(), d)).collect();
    assert_eq!(*seen.lock().unwrap(), want);
}

/// In f64 the model keeps its keys and still gives transformers' logits
/// (whose own f32 error dominates the difference).
#[test]
fn an_f64_copy_gives_the_same_logits() {
    let _hooked = HOOKED.lock().unwrap_or_else(|e| e.into_inner());
    let vit = tiny();
    let wide = vit.to_dtype::<f64>();
    let keys = |sd: StateDict| sd.keys().map(String::from).collect::<Vec<_>>();
    assert_eq!(keys(wide.state_dict()), keys(vit.state_dict()));
    let io = io();
    let x: Pixels<Dyn, f64> = pixels(&io).to_dtype::<f64>();
    let logits: Vec<f32> = wide.run(&x).unwrap().logits.to_dtype::<f32>().to_vec();
    assert_close("f64 logits", &logits, &want(&io, "logits"), TOL);
}

/// An image size that is not a multiple of the patch size: as PyTorch's
/// convolution (and so `transformers`) does, the last pixels are dropped,
/// (18 / 4)^2 = 16 patches and the class token.
#[test]
fn pixels_past_the_last_whole_patch_are_dropped() {
    type Odd = ViTForImageClassification<18, 4, 3, 8, 2, 16, 3>;
    let mut vit = Odd::new(&ViTConfig::with_layers(1), &Cpu, &mut Rng::seed_from(0));
    vit.eval();
    assert_eq!(Odd::POSITIONS, 17);
    let mut rng = Rng::seed_from(1);
    let x =
        Tensor::<(Dyn, C<3>, C<18>, C<18>)>::normal_on((Dyn(1), C, C, C), 0.0, 1.0, &mut rng, &Cpu);
    let out = vit.run(&x).unwrap();
    assert_eq!(out.vit.last_hidden_state.dims()[..], [1, 17, 8]);
    // Changing the last two rows and columns changes nothing.
    let mut pixels = x.to_vec();
    for (i, p) in pixels.iter_mut().enumerate() {
        let (row, col) = ((i / 18) % 18, i % 18);
        if row >= 16 || col >= 16 {
            *p += 1.0;
        }
    }
    let y = Tensor::from_vec(pixels.clone(), (Dyn(1), C, C, C)).unwrap();
    assert_ne!(y.to_vec(), x.to_vec());
    assert_eq!(vit.run(&y).unwrap().logits.to_vec(), out.logits.to_vec());
    // While a pixel of the last whole patch counts.
    pixels[15 * 18 + 15] += 1.0;
    let z = Tensor::from_vec(pixels, (Dyn(1), C, C, C)).unwrap();
    assert_ne!(vit.run(&z).unwrap().logits.to_vec(), out.logits.to_vec());
}
