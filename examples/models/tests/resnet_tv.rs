//! Forma's ResNets against torchvision's (fixtures from
//! `tools/gen_resnet_fixtures.py`): the full-size ResNet-18 and ResNet-50
//! have torchvision's `state_dict` keys and shapes in torchvision's order,
//! and its parameter counts.

mod common;

use common::fixture;
use forma::nn::Module;
use forma::prelude::*;
use forma_models::resnet::{ResNet18, ResNet50, ResNetConfig};

fn tv_layout(model: &str) -> (Vec<(String, Vec<usize>)>, usize) {
    let text =
        std::fs::read_to_string(fixture("resnet_layouts.json")).expect("resnet_layouts.json");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let keys = doc[model]["state_dict"]
        .as_array()
        .unwrap_or_else(|| panic!("resnet_layouts.json has no {model}"))
        .iter()
        .map(|e| {
            let key = e[0].as_str().expect("a key").to_string();
            let dims = e[1]
                .as_array()
                .expect("dims")
                .iter()
                .map(|d| d.as_u64().expect("a size") as usize)
                .collect();
            (key, dims)
        })
        .collect();
    let params = doc[model]["parameters"].as_u64().expect("a count") as usize;
    (keys, params)
}

/// Parameter elements of a layout (the BatchNorm buffers left out, as
/// `sum(p.numel() for p in model.parameters())` does).
fn parameters(layout: &[(String, Vec<usize>)]) -> usize {
    layout
        .iter()
        .filter(|(k, _)| {
            !(k.ends_with("running_mean")
                || k.ends_with("running_var")
                || k.ends_with("num_batches_tracked"))
        })
        .map(|(_, d)| d.iter().product::<usize>())
        .sum()
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
