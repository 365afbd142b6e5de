#!/usr/bin/env python3
"""Writes the torchvision golden values that
`examples/models/tests/resnet_tv.rs` compares Forma's ResNet
(`forma_models::resnet`) against:

- `tools/fixtures/models/resnet_layouts.json`: the `state_dict()` keys and
  shapes, in order, of torchvision's full-size `resnet18()` and `resnet50()`
  (built on the `meta` device, so nothing is allocated or shipped), with
  their parameter counts;
- `tools/fixtures/models/resnet18_w8.safetensors` and
  `resnet50_w4.safetensors`: the `state_dict()` of narrow twins of those two
  networks (see "Narrow twins" below), as a torchvision checkpoint converted
  to safetensors holds it (BatchNorm buffers included);
- `tools/fixtures/models/resnet_io.safetensors`: a fixed input and each
  twin's outputs, running statistics and gradients (see "Conventions").

Run from the repository root (needs torch, torchvision and safetensors;
written against torch 2.15.0, torchvision 0.29.2):

    python3 tools/gen_resnet_fixtures.py

Narrow twins. The full networks are 45 MB (ResNet-18) and 100 MB
(ResNet-50) of f32: too big to commit. torchvision's `ResNet.__init__`
hard-codes the stem width 64 and the stage widths 64/128/256/512 (its
`width_per_group` only widens a Bottleneck's 3x3 convolution, and
`BasicBlock` refuses it), so `Narrow` below subclasses `ResNet` and replaces
`__init__` alone with the same body, every 64 replaced by a `width` (stage
widths `width, 2*width, 4*width, 8*width`, fc input `8*width*expansion`).
Everything else is torchvision's own: `BasicBlock`, `Bottleneck`,
`ResNet._make_layer` (which builds the blocks and their `downsample`) and
`ResNet.forward`. The generator checks that `Narrow` at width 64 has exactly
`resnet18()`'s / `resnet50()`'s keys and shapes, so the only difference from
torchvision's networks is the width. The twins: ResNet-18 at width 8 (178,582
numbers, 0.7 MB) and ResNet-50 at width 4 (100,155 numbers, 0.4 MB), both
with 10 classes.

Weights: torchvision's initialisation under `torch.manual_seed` (Kaiming
normal convolutions, default Linear), then BatchNorm scales `1 + N(0, 0.1^2)`
and shifts `N(0, 0.1^2)` (the default ones and zeros would leave those paths
untested), then running statistics calibrated as in real checkpoints: two
training-mode forwards of random batches with `momentum=None` (a cumulative
average), so `running_mean`/`running_var` are the average batch statistics
and `num_batches_tracked` is 2. Momentum is then set back to 0.1.

Conventions of `resnet_io.safetensors` (mirrored by the Rust test; change
both together), for `<m>` in `resnet18_w8`, `resnet50_w4`. Every result is
torch's in float64 (the model and input converted with `.double()`), so
Forma's f64 run can be held to float64 rounding and its f32 run to its own
float32 error, not to torch's:

- `x` f32 `[2, 3, 48, 48]` (shared by both models), `target` int64 `[2]`;
- `<m>.eval.logits` f64 `[2, 10]`: the model in eval mode on `x`;
- `<m>.train.logits` f64 `[2, 10]`: the model (fresh from the file) in
  training mode on `x`: BatchNorm normalises with the batch's statistics;
- `<m>.train.loss` f64 `[]`: `F.cross_entropy(train.logits, target)`;
- `<m>.train.state.<key>` for every BatchNorm buffer `<key>` of the model
  (`running_mean`, `running_var` f64, `num_batches_tracked` int64): its
  value after that one training forward (momentum 0.1; unbiased variance
  in `running_var`; `num_batches_tracked` 3);
- `<m>.grad.x` f64 `[2, 3, 48, 48]` and `<m>.grad.<param>` for the params
  in `GRADS[<m>]`: gradients of that loss;
- `<m>.f32_tolerance.<key>` f64 `[]` for each float entry `<m>.<key>`
  above: the bound on Forma's float32 result, relative to the entry's
  largest value: `F32_FACTOR` times torch's own float32 error on it (the
  same run in float32, against the float64 result), at least `F32_FLOOR`.
  The narrow ResNet-50 is poorly conditioned in training mode (4-channel
  convolutions, BatchNorm over 8 values per channel in `layer4`): torch's
  own float32 gradients stray by up to 5e-4 there, against 1e-5 for the
  ResNet-18 twin. Forma's float32 errors measured 0.5 to 5.6 times
  torch's (torch accumulates BatchNorm statistics in double on the CPU).

Reruns are byte-identical on this machine (seeded, one thread,
deterministic algorithms).
"""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from safetensors.torch import save_file
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet, resnet18, resnet50

from fixture_file import OUT, FixtureFile, canonical_header, layout

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

MODELS = OUT / "models"
GENERATOR = "tools/gen_resnet_fixtures.py"
CLASSES = 10
# Forma's float32 results may stray from the float64 reference by
# F32_FACTOR times torch's own float32 error on the same tensors, and at
# least F32_FLOOR (both relative to the largest value of each tensor).
F32_FACTOR = 10
F32_FLOOR = 1e-5

TWINS = {
    "resnet18_w8": dict(block=BasicBlock, layers=[2, 2, 2, 2], width=8, seed=18),
    "resnet50_w4": dict(block=Bottleneck, layers=[3, 4, 6, 3], width=4, seed=50),
}

# Gradients recorded beside the input's: the stem, a BatchNorm scale inside a
# block, a projection shortcut (conv and norm), a last-stage weight, the head.
GRADS = {
    "resnet18_w8": [
        "conv1.weight",
        "bn1.weight",
        "layer1.0.conv1.weight",
        "layer1.0.bn1.weight",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.weight",
        "layer2.0.downsample.1.bias",
        "layer4.1.bn2.bias",
        "fc.weight",
        "fc.bias",
    ],
    "resnet50_w4": [
        "conv1.weight",
        "bn1.weight",
        "layer1.0.conv3.weight",
        "layer1.0.bn1.weight",
        "layer1.0.downsample.0.weight",
        "layer3.0.downsample.1.weight",
        "layer3.5.conv2.weight",
        "layer4.2.bn3.bias",
        "fc.weight",
        "fc.bias",
    ],
}


class Narrow(ResNet):
    """torchvision's `ResNet` with its hard-coded width 64 made a parameter:
    `ResNet.__init__`'s body with every 64 replaced by `width` (and 128, 256,
    512 by its multiples). `_make_layer`, the blocks and `forward` are
    torchvision's."""

    def __init__(self, block, layers, width, num_classes=1000):
        nn.Module.__init__(self)
        norm_layer = nn.BatchNorm2d
        self._norm_layer = norm_layer
        self.inplanes = width
        self.dilation = 1
        self.groups = 1
        self.base_width = 64  # the Bottleneck's 3x3 width is then `planes`
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = norm_layer(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, 2 * width, layers[1], stride=2)
        self.layer3 = self._make_layer(block, 4 * width, layers[2], stride=2)
        self.layer4 = self._make_layer(block, 8 * width, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width * block.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


class Io(FixtureFile):
    GENERATOR = GENERATOR


def layouts():
    """Keys and shapes of the full-size networks, from the `meta` device;
    and the check that `Narrow` at width 64 is those networks."""
    doc = {"torch": torch.__version__, "torchvision": torchvision.__version__, "generator": GENERATOR}
    with torch.device("meta"):
        for name, make, block, layers, params in [
            ("resnet18", resnet18, BasicBlock, [2, 2, 2, 2], 11_689_512),
            ("resnet50", resnet50, Bottleneck, [3, 4, 6, 3], 25_557_032),
        ]:
            tv = make()
            assert layout(Narrow(block, layers, 64)) == layout(tv), f"Narrow(width=64) is not {name}"
            n = sum(p.numel() for p in tv.parameters())
            assert n == params, (name, n)
            doc[name] = {"parameters": n, "state_dict": layout(tv)}
    (MODELS / "resnet_layouts.json").write_text(json.dumps(doc, indent=1) + "\n")


def twin(name, spec):
    torch.manual_seed(spec["seed"])
    model = Narrow(spec["block"], spec["layers"], spec["width"], CLASSES)
    g = torch.Generator().manual_seed(spec["seed"] + 1000)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                m.momentum = None
        model.train()
        for _ in range(2):
            model(torch.randn(4, 3, 48, 48, generator=g))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    path = MODELS / f"{name}.safetensors"
    save_file(sd, str(path), metadata={"torch": torch.__version__, "torchvision": torchvision.__version__, "generator": GENERATOR})
    canonical_header(path)
    return sd


def fresh(name, spec, sd, dtype):
    model = Narrow(spec["block"], spec["layers"], spec["width"], CLASSES)
    model.load_state_dict(sd, strict=True)
    return model.to(dtype)


def rel(got, want):
    """The largest difference, relative to the largest value of `want`."""
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()


def run(name, spec, sd, x, target, dtype):
    """Everything the test compares, computed in `dtype`: the eval logits,
    and one training forward's logits, loss, BatchNorm buffers and
    gradients."""
    out = {}
    model = fresh(name, spec, sd, dtype).eval()
    with torch.no_grad():
        out["eval.logits"] = model(x.to(dtype))
    model = fresh(name, spec, sd, dtype).train()
    xg = x.detach().clone().to(dtype).requires_grad_(True)
    logits = model(xg)
    loss = F.cross_entropy(logits, target)
    loss.backward()
    out["train.logits"] = logits.detach()
    out["train.loss"] = loss.detach()
    for k, v in model.named_buffers():
        out[f"train.state.{k}"] = v
        if k.endswith("num_batches_tracked"):
            assert v.item() == 3, (k, v)
    out["grad.x"] = xg.grad
    params = dict(model.named_parameters())
    for k in GRADS[name]:
        out[f"grad.{k}"] = params[k].grad
    return out


def main():
    MODELS.mkdir(parents=True, exist_ok=True)
    layouts()
    io = Io("models/resnet_io", seed=20261204)
    x = io.put("x", torch.randn(2, 3, 48, 48, generator=io.g))
    target = io.put("target", torch.randint(0, CLASSES, (2,), generator=io.g))
    for name, spec in TWINS.items():
        sd = twin(name, spec)
        exact = run(name, spec, sd, x, target, torch.float64)
        single = run(name, spec, sd, x, target, torch.float32)
        assert exact["eval.logits"].abs().max() > 0.1, "logits far from zero"
        for k, v in exact.items():
            io.put(f"{name}.{k}", v)
        # torch's own float32 error on each tensor sets the test's f32 bound for it.
        worst = (0.0, None)
        for k, v in exact.items():
            if v.is_floating_point():
                err = rel(single[k], v)
                worst = max(worst, (err, k))
                io.put(f"{name}.f32_tolerance.{k}", torch.tensor(max(F32_FLOOR, F32_FACTOR * err), dtype=torch.float64))
        print(f"{name}: torch's float32 results stray from float64 by at most {worst[0]:.2e} ({worst[1]})")
    io.save()


if __name__ == "__main__":
    main()
