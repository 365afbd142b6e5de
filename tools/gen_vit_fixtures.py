#!/usr/bin/env python3
"""Writes the Hugging Face golden values that
`examples/models/tests/vit_hf.rs` compares Forma's ViT
(`forma_models::vit`) against:

- `tools/fixtures/models/vit_tiny.safetensors`: the `model.safetensors` that
  `save_pretrained` writes for a tiny random `ViTForImageClassification`
  (`TINY_VIT`), stamped with the torch and transformers versions, and
  `vit_tiny_config.json`, the `config.json` it writes beside it;
- `tools/fixtures/models/vit_io.safetensors`: a fixed input and the model's
  outputs and gradients (see "Conventions");
- `tools/fixtures/models/vit_layouts.json`: the keys and shapes, in order,
  of the full-size `google/vit-base-patch16-224` (`VIT_BASE_16`, built on
  the `meta` device, so no weights are allocated or shipped), with its
  parameter count.

Run from the repository root:

    python3 tools/gen_vit_fixtures.py            # keeps vit_io.safetensors' values
    python3 tools/gen_vit_fixtures.py --fresh    # rewrites them from this run

Needs `torch`, `safetensors` and `transformers` (written against torch
2.15.0, transformers 5.25.0). The model runs in float32 on the CPU with the
eager attention, in eval mode; its parameters come from a fixed seed, so the
weight file is identical on every rerun, and `vit_io.safetensors` keeps its
stored values when a rerun agrees within `KEEP_ATOL` (see
`hf_fixtures.KeptIo`).

Two names per weight. transformers 5 renamed ViT's modules
(`vit.layers.0.attention.q_proj`, `mlp.fc1`, ...), but its
`save_pretrained` writes, and `from_pretrained` reads, the classic names
that checkpoints on the hub hold (`vit.encoder.layer.0.attention.attention.query`,
`intermediate.dense`, ...), converting with its `conversion_mapping`. The
fixtures use the file's names throughout: each in-memory name is mapped to
the file's by `revert_weight_conversion`, the function `save_pretrained`
calls, so the layout below is exactly what a saved file holds, listed in the
order of the model's modules (the file itself stores keys sorted).

Conventions of `vit_io.safetensors` (mirrored by the Rust test; change both
together), all computed from the committed weight file as `from_pretrained`
reads it:

- `tiny.pixel_values` f32 `[2, 3, 20, 20]` (`N(0, 1)`), `tiny.labels`
  int64 `[2]`;
- `tiny.logits` f32 `[2, 5]`; `tiny.last_hidden_state` f32 `[2, 26, 32]`
  (after the final `vit.layernorm`; 26 = the class token and 5 x 5 patches);
- `tiny.hidden_states.{i}` f32 `[2, 26, 32]` for `i` in `0..=2`
  (`output_hidden_states=True`): 0 is the embeddings' output (class token
  and patch projections plus position embeddings), `i >= 1` the raw output
  of layer `i - 1`, before the final layernorm;
- `tiny.attentions.{i}` f32 `[2, 4, 26, 26]` for `i` in `0..2`
  (`output_attentions=True`): layer `i`'s probabilities after the softmax;
- `tiny.loss` f32 `[]`: the loss `ViTForImageClassification` returns for
  `labels` (cross-entropy, mean over the batch), in eval mode;
- `tiny.grad.pixel_values` f32 `[2, 3, 20, 20]` and `tiny.grad.<key>` for
  the weights in `GRADS` (file names): the gradients of that loss.
"""
import json
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers import ViTConfig, ViTForImageClassification
from transformers.core_model_loading import revert_weight_conversion

from hf_fixtures import MODELS, KeptIo, put_intermediates, save_hf

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

GENERATOR = "tools/gen_vit_fixtures.py"

TINY_VIT = dict(
    image_size=20,
    patch_size=4,
    num_channels=3,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
    num_labels=5,
)
VIT_BASE_16 = dict(
    image_size=224,
    patch_size=16,
    num_channels=3,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
    num_labels=1000,
)
VIT_BASE_16_PARAMETERS = 86_567_656

# Gradients recorded beside the input's: every kind of weight, in both layers.
GRADS = [
    "vit.embeddings.cls_token",
    "vit.embeddings.position_embeddings",
    "vit.embeddings.patch_embeddings.projection.weight",
    "vit.embeddings.patch_embeddings.projection.bias",
    "vit.encoder.layer.0.attention.attention.query.weight",
    "vit.encoder.layer.0.attention.attention.value.bias",
    "vit.encoder.layer.0.layernorm_before.weight",
    "vit.encoder.layer.1.attention.output.dense.weight",
    "vit.encoder.layer.1.layernorm_after.bias",
    "vit.encoder.layer.1.intermediate.dense.weight",
    "vit.encoder.layer.1.output.dense.bias",
    "vit.layernorm.weight",
    "classifier.weight",
    "classifier.bias",
]

KEEP_ATOL = 1e-5


class Io(KeptIo):
    GENERATOR = GENERATOR
    KEEP_ATOL = KEEP_ATOL

    def __init__(self):
        super().__init__("models/vit_io", seed=20261206)


def file_names(model):
    """Each `state_dict()` key of `model` with the name `save_pretrained`
    writes it under, in the model's order."""
    names = {}
    for key, value in model.state_dict().items():
        (saved,) = revert_weight_conversion(model, {key: value})
        names[key] = saved
    return names


def build(cfg):
    return ViTForImageClassification(ViTConfig(**cfg, attn_implementation="eager")).eval()


def randomize(model, g):
    """Weights and biases `N(0, 0.2^2)`, LayerNorm scales `1 + N(0, 0.1^2)`:
    Hugging Face's init (std 0.02, zero biases, unit norms) would give
    near-flat logits and leave the biases and norm scales untested."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "layernorm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.2 * noise)


def loaded(path):
    """The written files read back by `from_pretrained` (which converts the
    file's names to the modules'), as the Rust side reads them."""
    with tempfile.TemporaryDirectory() as d:
        shutil.copyfile(path, Path(d) / "model.safetensors")
        shutil.copyfile(MODELS / "vit_tiny_config.json", Path(d) / "config.json")
        model, info = ViTForImageClassification.from_pretrained(
            d, attn_implementation="eager", output_loading_info=True
        )
    assert not any(info.values()), info
    return model.eval()


def tiny(io):
    torch.manual_seed(5)
    model = build(TINY_VIT)
    randomize(model, io.g)
    path = save_hf(model, "vit_tiny", GENERATOR)
    model.config.to_json_file(str(MODELS / "vit_tiny_config.json"))
    saved = load_file(str(path))
    names = file_names(model)
    assert set(saved) == set(names.values()), "every weight saved, under its file name"
    model = loaded(path)

    x = io.put("tiny.pixel_values", torch.randn(2, 3, 20, 20, generator=io.g))
    labels = io.put("tiny.labels", torch.randint(0, TINY_VIT["num_labels"], (2,), generator=io.g))
    with torch.no_grad():
        out = model(x, output_hidden_states=True, output_attentions=True)
        last = model.vit(x).last_hidden_state
    assert out.logits.abs().max() > 0.5, "logits far from zero"
    assert (out.logits[0] - out.logits[1]).abs().max() > 0.5, "the two images classified differently"
    assert torch.equal(out.logits, model.classifier(last[:, 0, :]))
    assert torch.allclose(model.vit.layernorm(out.hidden_states[-1]), last)
    io.put("tiny.logits", out.logits)
    io.put("tiny.last_hidden_state", last)
    put_intermediates(io, "tiny", out, TINY_VIT["num_hidden_layers"])

    xg = x.detach().clone().requires_grad_(True)
    ran = model(xg, labels=labels)
    assert torch.allclose(ran.loss, torch.nn.functional.cross_entropy(ran.logits, labels))
    ran.loss.backward()
    io.put("tiny.loss", ran.loss)
    io.put("tiny.grad.pixel_values", xg.grad)
    params = {names[k]: p for k, p in model.named_parameters()}
    for key in GRADS:
        io.put(f"tiny.grad.{key}", params[key].grad)


def layouts():
    with torch.device("meta"):
        model = ViTForImageClassification(ViTConfig(**VIT_BASE_16))
    params = sum(p.numel() for p in model.parameters())
    assert params == VIT_BASE_16_PARAMETERS, params
    names = file_names(model)
    sd = model.state_dict()
    doc = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generator": GENERATOR,
        "vit_base_patch16_224": {
            "config": VIT_BASE_16,
            "state_dict": [[names[k], list(v.shape)] for k, v in sd.items()],
            "num_parameters": params,
            # transformers' in-memory name of each file key.
            "module_names": {names[k]: k for k in sd},
        },
    }
    (MODELS / "vit_layouts.json").write_text(json.dumps(doc, indent=1) + "\n")


def main():
    MODELS.mkdir(parents=True, exist_ok=True)
    io = Io()
    tiny(io)
    io.save()
    layouts()


if __name__ == "__main__":
    main()
