#!/usr/bin/env python3
"""Writes the PyTorch golden values that `tests/suite/nn_layer_parity.rs` compares
the nn layers against, to `tools/fixtures/layers.safetensors`.

Run from the repository root:

    python3 tools/gen_layer_fixtures.py

Needs `torch` and `safetensors`. Every module runs in float64 on the CPU with
parameters (and running statistics) drawn from a fixed seed, so reruns write
byte-identical files.

Conventions (mirrored by the Rust test; change both together). For a case `c`:

- `c.sd.<key>`: the module's `state_dict()` before the forward (float64, and
  int64 for `num_batches_tracked`); the test loads it with `load_state_dict`,
  which also checks the key names and shapes.
- `c.x` (or `c.x1`, `c.x2`): the input, float64; `c.idx`: int64 indices.
- `c.gy`: a fixed random tensor of the output's shape; the loss is
  `(module(x) * gy).sum()`.
- `c.y`: the output; `c.grad.<input>`: the loss's gradient with respect to
  each float input; `c.grad.<param>`: with respect to every parameter, named
  as in `named_parameters()`.
- `c.after.<key>`: the `state_dict()` after the forward, for modules whose
  buffers change in training mode (BatchNorm).
- metadata `c.repr`: `str(module)`; metadata `c.keys`: the `state_dict()`
  keys and shapes in order, `key:d0xd1;key2:d0` (an empty shape for a scalar).

The Rust test states each case's module type, options and input shapes again.
"""
import torch
import torch.nn as nn
from safetensors.torch import save_file

from fixture_file import OUT, FixtureFile, canonical_header

F64 = torch.float64
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class Layers(FixtureFile):
    GENERATOR = "tools/gen_layer_fixtures.py"

    def __init__(self):
        super().__init__("layers", seed=20240611)
        self.meta = {}

    def normal(self, *shape, scale=1.0):
        return torch.randn(shape, generator=self.g, dtype=F64) * scale

    def uniform(self, *shape, lo=-1.0, hi=1.0):
        return torch.rand(shape, generator=self.g, dtype=F64) * (hi - lo) + lo

    def randomize(self, module, positive=()):
        """Replaces every parameter and float buffer with seeded values, so
        that ones/zeros defaults cannot hide a wrong gradient; buffers named in
        `positive` (variances) are drawn in [0.5, 1.5]."""
        with torch.no_grad():
            for name, t in list(module.named_parameters()) + list(module.named_buffers()):
                if not t.is_floating_point():
                    continue
                if name in positive:
                    t.copy_(self.uniform(*t.shape, lo=0.5, hi=1.5))
                else:
                    t.copy_(self.normal(*t.shape))
        return module

    def case(self, name, module, inputs, idx=None):
        """Runs `module` on `inputs` (a dict of float tensors, passed in order)
        and records everything the Rust test checks."""
        module = module.to(F64)
        self.meta[f"{name}.repr"] = str(module)
        self.meta[f"{name}.keys"] = ";".join(
            f"{k}:{'x'.join(str(d) for d in v.shape)}" for k, v in module.state_dict().items()
        )
        for k, v in module.state_dict().items():
            self.put(f"{name}.sd.{k}", v)
        xs = {}
        for k, v in inputs.items():
            self.put(f"{name}.{k}", v)
            xs[k] = v.clone().requires_grad_(True)
        args = list(xs.values())
        if idx is not None:
            self.put(f"{name}.idx", idx)
            args = [idx] + args
        y = module(*args)
        gy = self.normal(*y.shape)
        self.put(f"{name}.gy", gy)
        self.put(f"{name}.y", y)
        params = dict(module.named_parameters())
        wrt = list(xs.values()) + list(params.values())
        if wrt:
            grads = torch.autograd.grad((y * gy).sum(), wrt, allow_unused=True)
            for k, g in zip(list(xs) + list(params), grads):
                if g is None:
                    g = torch.zeros_like(xs[k] if k in xs else params[k])
                self.put(f"{name}.grad.{k}", g)
        if any(b.is_floating_point() for b in module.buffers()) and module.training:
            for k, v in module.state_dict().items():
                self.put(f"{name}.after.{k}", v)

    def save(self):
        """Like `FixtureFile.save`, with the reprs and key lists as metadata."""
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{self.name}.safetensors"
        meta = {"torch": torch.__version__, "generator": self.GENERATOR, **self.meta}
        save_file(self.tensors, str(path), metadata=meta)
        canonical_header(path)
        return path


def main():
    f = Layers()
    n, u = f.normal, f.uniform
    torch.manual_seed(0)

    # Linear, Bilinear
    f.case("linear", nn.Linear(5, 3), {"x": n(4, 5)})
    f.case("linear_nobias", nn.Linear(5, 3, bias=False), {"x": n(2, 3, 5)})
    f.case("bilinear", nn.Bilinear(3, 4, 2), {"x1": n(5, 3), "x2": n(5, 4)})
    f.case("bilinear_nobias", nn.Bilinear(3, 4, 2, bias=False), {"x1": n(2, 3, 3), "x2": n(2, 3, 4)})

    # Convolutions
    f.case("conv1d", nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2), {"x": n(2, 4, 11)})
    f.case("conv1d_plain", nn.Conv1d(3, 2, 3, bias=False), {"x": n(2, 3, 7)})
    f.case("conv2d", nn.Conv2d(3, 4, 3, stride=2, padding=1), {"x": n(2, 3, 7, 7)})
    f.case("conv2d_groups", nn.Conv2d(4, 6, 3, dilation=2, groups=2, bias=False), {"x": n(1, 4, 8, 8)})
    f.case(
        "convt",
        nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
        {"x": n(2, 4, 4, 4)},
    )
    # output_padding (1) not below the stride (1) but below the dilation (2)
    f.case(
        "convt_dilated",
        nn.ConvTranspose2d(2, 3, 3, output_padding=1, dilation=2, bias=False),
        {"x": n(1, 2, 4, 4)},
    )
    f.case("convt_plain", nn.ConvTranspose2d(3, 2, 2), {"x": n(2, 3, 3, 3)})

    # Pooling (continuous random inputs: no ties in a max window)
    f.case("maxpool2d", nn.MaxPool2d(2), {"x": n(2, 3, 6, 6)})
    f.case("maxpool2d_pad", nn.MaxPool2d(3, 2, 1), {"x": n(1, 2, 7, 7)})
    f.case("avgpool2d", nn.AvgPool2d(2), {"x": n(2, 3, 6, 6)})
    f.case("avgpool2d_pad", nn.AvgPool2d(3, 2, 1), {"x": n(1, 2, 7, 7)})
    f.case("maxpool1d", nn.MaxPool1d(2), {"x": n(2, 3, 8)})
    f.case("maxpool1d_pad", nn.MaxPool1d(3, 2, 1), {"x": n(2, 3, 9)})
    f.case("avgpool1d", nn.AvgPool1d(2), {"x": n(2, 3, 8)})
    f.case("avgpool1d_pad", nn.AvgPool1d(3, 2, 1), {"x": n(2, 3, 9)})
    f.case("adaptive", nn.AdaptiveAvgPool2d((3, 2)), {"x": n(2, 3, 7, 5)})
    f.case("adaptive_up", nn.AdaptiveAvgPool2d((4, 3)), {"x": n(1, 2, 3, 2)})
    f.case("adaptive_div", nn.AdaptiveAvgPool2d((2, 2)), {"x": n(1, 2, 6, 4)})
    f.case("adaptive_global", nn.AdaptiveAvgPool2d((1, 1)), {"x": n(2, 3, 5, 5)})

    # Normalisation
    var = ("running_var",)
    f.case("bn2d_train", f.randomize(nn.BatchNorm2d(3), var), {"x": n(4, 3, 3, 3, scale=2.0) + 1.0})
    f.case("bn2d_eval", f.randomize(nn.BatchNorm2d(3), var).eval(), {"x": n(2, 3, 3, 3)})
    f.case("bn1d_train", f.randomize(nn.BatchNorm1d(4), var), {"x": n(6, 4, scale=3.0) - 1.0})
    f.case("bn1d_train_3d", f.randomize(nn.BatchNorm1d(4), var), {"x": n(3, 4, 5)})
    f.case("bn1d_eval", f.randomize(nn.BatchNorm1d(4), var).eval(), {"x": n(6, 4)})
    f.case("bn1d_eval_3d", f.randomize(nn.BatchNorm1d(4), var).eval(), {"x": n(3, 4, 5)})
    f.case("layernorm", f.randomize(nn.LayerNorm(6)), {"x": n(2, 3, 6)})
    f.case("groupnorm", f.randomize(nn.GroupNorm(2, 6)), {"x": n(2, 6, 3, 3)})
    f.case("groupnorm_3d", f.randomize(nn.GroupNorm(3, 6)), {"x": n(2, 6, 4)})
    f.case("groupnorm_plain", nn.GroupNorm(2, 4, affine=False), {"x": n(3, 4)})
    f.case("rmsnorm", f.randomize(nn.RMSNorm(6)), {"x": n(2, 3, 6)})
    f.case("rmsnorm_eps", f.randomize(nn.RMSNorm(5, eps=1e-6)), {"x": n(4, 5)})
    # eps=None is float64's machine epsilon: visible next to a tiny mean square
    f.case("rmsnorm_tiny", nn.RMSNorm(3), {"x": n(2, 3, scale=1e-8)})

    # Embedding: repeated indices accumulate; the padding row (given random
    # values here) is read by the forward but gets no gradient
    idx = torch.tensor([[1, 2, 7, 2, 9], [0, 2, 2, 5, 1], [9, 9, 3, 4, 2]], dtype=torch.int64)
    f.case("embedding", f.randomize(nn.Embedding(10, 4)), {}, idx=idx)
    f.case("embedding_pad", f.randomize(nn.Embedding(10, 4, padding_idx=2)), {}, idx=idx)

    # Activations, Flatten, Dropout (eval)
    x = n(3, 4, 5)
    f.case("relu", nn.ReLU(), {"x": x})
    f.case("gelu", nn.GELU(), {"x": x})
    f.case("gelu_tanh", nn.GELU(approximate="tanh"), {"x": x})
    f.case("tanh", nn.Tanh(), {"x": x})
    f.case("sigmoid", nn.Sigmoid(), {"x": x})
    f.case("silu", nn.SiLU(), {"x": x})
    f.case("identity", nn.Identity(), {"x": x})
    f.case("leaky_relu", nn.LeakyReLU(), {"x": x})
    f.case("leaky_relu_02", nn.LeakyReLU(0.2), {"x": x})
    f.case("softmax_last", nn.Softmax(dim=-1), {"x": x})
    f.case("softmax_1", nn.Softmax(dim=1), {"x": x})
    f.case("log_softmax_1", nn.LogSoftmax(dim=1), {"x": x})
    f.case("log_softmax_last", nn.LogSoftmax(dim=-1), {"x": x})
    f.case("flatten", nn.Flatten(), {"x": n(2, 3, 4, 5)})
    f.case("dropout_eval", nn.Dropout(0.3).eval(), {"x": n(4, 5)})
    # Train mode is random; the test checks its keep rate, and that its
    # repr and (empty) state_dict match this module's.
    drop = nn.Dropout(0.25)
    f.meta["dropout_train.repr"] = str(drop)
    f.meta["dropout_train.keys"] = ""

    # Pooling options (drawn last, so the cases above keep their values):
    # dilation and ceil_mode for max pooling, ceil_mode and
    # count_include_pad=False for average pooling.
    f.case("maxpool2d_dil_ceil", nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True), {"x": n(1, 2, 8, 9)})
    f.case("avgpool2d_ceil_nopad", nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
           {"x": n(1, 2, 6, 7)})

    # Embedding max_norm (drawn last): the rows read are rescaled in place
    # before the lookup; `after.weight` is the table the forward left.
    for name, emb in (("embedding_maxnorm", nn.Embedding(10, 4, max_norm=1.5)),
                      ("embedding_maxnorm_l1", nn.Embedding(10, 4, max_norm=2.0, norm_type=1.0))):
        f.case(name, f.randomize(emb), {}, idx=idx)
        f.put(f"{name}.after.weight", emb.weight.detach().clone())

    # Norm options (drawn last): BatchNorm without affine parameters, without
    # a bias, with a cumulative average (momentum=None, three batches already
    # counted, so the new one weighs 1/4) and without running statistics (the
    # batch's are used in eval mode too); LayerNorm without affine parameters
    # and without a bias.
    bn = f.randomize(nn.BatchNorm2d(3, affine=False), var)
    f.case("bn2d_noaffine_train", bn, {"x": n(4, 3, 3, 3, scale=2.0) + 1.0})
    bn = f.randomize(nn.BatchNorm2d(3, bias=False), var).eval()
    f.case("bn2d_nobias_eval", bn, {"x": n(2, 3, 3, 3)})
    bn = f.randomize(nn.BatchNorm1d(4, momentum=None), var)
    bn.num_batches_tracked.fill_(3)
    f.case("bn1d_cma_train", bn, {"x": n(6, 4, scale=3.0) - 1.0})
    bn = f.randomize(nn.BatchNorm2d(3, track_running_stats=False)).eval()
    f.case("bn2d_nostats_eval", bn, {"x": n(2, 3, 3, 3)})
    bn = nn.BatchNorm1d(4, momentum=None, affine=False, track_running_stats=False)
    f.case("bn1d_plain_train", bn, {"x": n(3, 4, 5)})
    f.case("layernorm_plain", nn.LayerNorm(6, elementwise_affine=False), {"x": n(2, 3, 6)})
    f.case("layernorm_nobias", f.randomize(nn.LayerNorm(6, bias=False)), {"x": n(4, 6)})

    # Convolution padding modes (drawn last)
    for mode in ("reflect", "replicate", "circular"):
        conv = nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode=mode)
        f.case(f"conv2d_{mode}", conv, {"x": n(2, 3, 7, 6)})
    conv = nn.Conv1d(2, 3, 5, padding=2, dilation=2, bias=False, padding_mode="reflect")
    f.case("conv1d_reflect", conv, {"x": n(2, 2, 9)})

    # Max pooling with indices, and MaxUnpool2d on them (drawn last): the
    # indices, the unpooled map and the input's gradient through both. The
    # overlapping windows (3, stride 2) share maxima, so some indices repeat.
    for name, k, s_, p_, shape, size in (
        ("unpool", 2, 2, 0, (2, 3, 6, 6), None),
        ("unpool_overlap", 3, 2, 1, (1, 2, 5, 5), [5, 5]),
        ("unpool_size", 2, 2, 0, (1, 2, 5, 5), [5, 5]),
    ):
        pool = nn.MaxPool2d(k, s_, p_, return_indices=True)
        unpool = nn.MaxUnpool2d(k, s_, p_)
        x = n(*shape).requires_grad_(True)
        y, idx = pool(x)
        # PyTorch calls max_unpool2d nondeterministic (repeated indices); its
        # CPU kernel writes in order, so the last value wins.
        torch.use_deterministic_algorithms(False)
        u = unpool(y, idx, output_size=size)
        torch.use_deterministic_algorithms(True)
        gu = n(*u.shape)
        (gx,) = torch.autograd.grad((u * gu).sum(), [x])
        f.meta[f"{name}.repr"] = str(unpool)
        for key, v in (("x", x), ("y", y), ("idx", idx), ("u", u), ("gu", gu), ("grad.x", gx)):
            f.put(f"{name}.{key}", v.detach())

    # Non-square convolutions (drawn last): a kernel, stride, padding and
    # dilation per axis; and a tall kernel with reflected padding in groups.
    conv = nn.Conv2d(3, 4, (1, 3), stride=(2, 1), padding=(0, 1), dilation=(1, 2))
    f.case("conv2d_rect", conv, {"x": n(2, 3, 7, 6)})
    conv = nn.Conv2d(2, 4, (3, 1), padding=(1, 0), groups=2, bias=False, padding_mode="reflect")
    f.case("conv2d_rect_reflect", conv, {"x": n(1, 2, 5, 4)})

    path = f.save()
    print(f"{path}: {path.stat().st_size} bytes, {len(f.tensors)} tensors")


if __name__ == "__main__":
    main()
