#!/usr/bin/env python3
"""Writes the PyTorch values the loss and init suites compare against.

Run from the repository root:

    python3 tools/gen_loss_fixtures.py

Needs `torch` and `safetensors`. It writes two files to `tools/fixtures/`:

    losses.safetensors  read by tests/suite/nn_loss_parity.rs (one case per loss/options/reduction)
    init.safetensors    read by tests/suite/nn_init.rs (fans and gains from torch.nn.init)

Each file's metadata records
`{"torch": torch.__version__, "generator": "tools/gen_loss_fixtures.py"}`.

Conventions of losses.safetensors (mirrored by the Rust test; change both together):

- Everything is float64 (class indices int64). Inputs come from a generator
  with a fixed seed, so a rerun writes identical files.
- A case is named `<loss>.<variant>.<reduction>`: `<loss>` is one of
  `cross_entropy`, `cross_entropy_probs`, `nll_loss`, `mse_loss`, `l1_loss`,
  `smooth_l1_loss`, `huber_loss`, `binary_cross_entropy`,
  `binary_cross_entropy_with_logits`, `kl_div`; `<reduction>` is `mean`,
  `sum`, `none` or (kl_div only) `batchmean`.
- `<case>.input` and `<case>.target` are the operands (the target is int64
  for class indices), `<case>.out` the loss, `<case>.gout` the upstream
  gradient (ones of the output's shape for a scalar loss, random otherwise),
  `<case>.grad_input` the gradient `torch.autograd.grad(out, input, gout)`
  and, where PyTorch differentiates the target, `<case>.grad_target`.
- Options are stored beside the case, so the Rust test reads them rather than
  repeating them: `<case>.weight`, `<case>.pos_weight` (tensors),
  `<case>.ignore_index` (int64 scalar), `<case>.label_smoothing`,
  `<case>.beta`, `<case>.delta` (float64 scalars), `<case>.log_target`
  (bool scalar). An absent key means PyTorch's default.
- `*.kink.*` cases put inputs exactly on a kink (l1/smooth_l1/huber with
  `input == target` or `|input - target| == beta/delta`, BCE-with-logits at
  logit 0, BCE at probability 0 and 1), pinning PyTorch's conventions there.
- `*.f32.*` cases hold the float64 values of inputs that the Rust test rounds
  to f32 before running the loss in f32 (compared within 1e-5 relative).
"""
import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn import init
from fixture_file import FixtureFile

F64 = torch.float64
I64 = torch.int64

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
# kl_div's reduction="mean" is deprecated in favour of "batchmean"; the
# fixtures pin both, so the warning says nothing new.
warnings.filterwarnings("ignore", message="reduction: 'mean' divides the total loss")

REDUCTIONS = ("mean", "sum", "none")


class Losses(FixtureFile):
    GENERATOR = "tools/gen_loss_fixtures.py"

    def uniform(self, shape, lo=-2.0, hi=2.0):
        return torch.rand(shape, generator=self.g, dtype=F64) * (hi - lo) + lo

    def classes(self, shape, n):
        return torch.randint(0, n, shape, generator=self.g, dtype=I64)

    def probs(self, shape, dim=1):
        return torch.softmax(self.uniform(shape, -2.0, 2.0), dim=dim)

    def case(self, name, fn, inp, target, grad_target=True, **opts):
        """Runs `fn(input, target)` and stores operands, options, the loss, the
        upstream gradient and the gradients."""
        for k, v in opts.items():
            if v is None:
                continue
            if isinstance(v, bool):
                v = torch.tensor(v)
            elif isinstance(v, int):
                v = torch.tensor(v, dtype=I64)
            elif isinstance(v, float):
                v = torch.tensor(v, dtype=F64)
            self.put(f"{name}.{k}", v)
        x = inp.detach().clone().requires_grad_(True)
        diff_target = grad_target and target.dtype == F64
        y = target.detach().clone().requires_grad_(diff_target)
        out = fn(x, y)
        gout = torch.ones_like(out) if out.dim() == 0 else self.uniform(out.shape, -1.0, 1.0)
        leaves = [x, y] if diff_target else [x]
        grads = torch.autograd.grad(out, leaves, gout, materialize_grads=True)
        self.put(f"{name}.input", x)
        self.put(f"{name}.target", y)
        self.put(f"{name}.out", out)
        self.put(f"{name}.gout", gout)
        self.put(f"{name}.grad_input", grads[0])
        if diff_target:
            self.put(f"{name}.grad_target", grads[1])


def with_ignored(target, ignore_index, every=3):
    t = target.clone()
    t.view(-1)[::every] = ignore_index
    return t


def gen_class(f):
    # cross_entropy with class indices: every option, alone and together.
    c = 4
    w = f.uniform((c,), 0.2, 2.0)
    variants = [
        # (variant, input shape, options, ignore positions)
        ("plain", (5, c), {}, False),
        ("weight", (5, c), {"weight": w}, False),
        ("ignore", (6, c), {}, True),
        ("ignore_custom", (6, c), {"ignore_index": 2}, False),
        ("smooth", (5, c), {"label_smoothing": 0.1}, False),
        ("weight_smooth", (5, c), {"weight": w, "label_smoothing": 0.25}, False),
        ("all", (6, c), {"weight": w, "label_smoothing": 0.2}, True),
        ("all_custom", (6, c), {"weight": w, "label_smoothing": 0.2, "ignore_index": 1}, False),
        ("d1", (3, c, 5), {"weight": w, "label_smoothing": 0.1}, True),
        ("d2", (2, c, 3, 2), {"label_smoothing": 0.3}, True),
        ("d2_plain", (2, c, 3, 2), {}, False),
    ]
    for var, shape, opts, ignore in variants:
        tshape = (shape[0],) + shape[2:]
        for red in REDUCTIONS:
            x = f.uniform(shape, -3.0, 3.0)
            t = f.classes(tshape, c)
            if ignore:
                t = with_ignored(t, opts.get("ignore_index", -100))
            kw = dict(opts)
            f.case(f"cross_entropy.{var}.{red}",
                   lambda a, b: F.cross_entropy(a, b, reduction=red, **kw), x, t, **kw)
    # Every target ignored: the mean is 0/0 = NaN in PyTorch.
    x = f.uniform((3, c), -3.0, 3.0)
    t = torch.full((3,), -100, dtype=I64)
    for red in REDUCTIONS:
        f.case(f"cross_entropy.all_ignored.{red}", lambda a, b: F.cross_entropy(a, b, reduction=red), x, t)

    # cross_entropy with class probabilities (differentiable in the target too).
    pvariants = [
        ("plain", (5, c), {}),
        ("smooth", (5, c), {"label_smoothing": 0.15}),
        ("weight", (5, c), {"weight": w}),
        ("weight_smooth", (5, c), {"weight": w, "label_smoothing": 0.3}),
        ("d1", (3, c, 4), {"weight": w, "label_smoothing": 0.1}),
    ]
    for var, shape, opts in pvariants:
        for red in REDUCTIONS:
            x = f.uniform(shape, -3.0, 3.0)
            t = f.probs(shape)
            kw = dict(opts)
            f.case(f"cross_entropy_probs.{var}.{red}",
                   lambda a, b: F.cross_entropy(a, b, reduction=red, **kw), x, t, **kw)

    # nll_loss on log-probabilities (any values work; log-softmax outputs here).
    nvariants = [
        ("plain", (5, c), {}, False),
        ("weight", (5, c), {"weight": w}, False),
        ("ignore", (6, c), {}, True),
        ("weight_ignore", (6, c), {"weight": w}, True),
        ("weight_ignore_custom", (6, c), {"weight": w, "ignore_index": 3}, False),
        ("d1", (3, c, 5), {"weight": w}, True),
    ]
    for var, shape, opts, ignore in nvariants:
        tshape = (shape[0],) + shape[2:]
        for red in REDUCTIONS:
            x = torch.log_softmax(f.uniform(shape, -3.0, 3.0), dim=1)
            t = f.classes(tshape, c)
            if ignore:
                t = with_ignored(t, -100)
            kw = dict(opts)
            f.case(f"nll_loss.{var}.{red}",
                   lambda a, b: F.nll_loss(a, b, reduction=red, **kw), x, t, **kw)

    # f32: the same losses on f32-representable inputs.
    x = f.uniform((5, c), -3.0, 3.0).float().double()
    t = f.classes((5,), c)
    f.case("cross_entropy.f32.mean", lambda a, b: F.cross_entropy(a, b, weight=w.float().double(), label_smoothing=0.1),
           x, t, weight=w.float().double(), label_smoothing=0.1)


def gen_regression(f):
    shape = (4, 3)
    for red in REDUCTIONS:
        f.case(f"mse_loss.plain.{red}", lambda a, b: F.mse_loss(a, b, reduction=red),
               f.uniform(shape), f.uniform(shape))
        f.case(f"l1_loss.plain.{red}", lambda a, b: F.l1_loss(a, b, reduction=red),
               f.uniform(shape), f.uniform(shape))
        for beta in (1.0, 0.5, 0.0):
            tag = f"beta{str(beta).replace('.', '_')}"
            f.case(f"smooth_l1_loss.{tag}.{red}",
                   lambda a, b: F.smooth_l1_loss(a, b, reduction=red, beta=beta),
                   f.uniform(shape), f.uniform(shape), beta=beta)
        for delta in (1.0, 2.0, 0.5):
            tag = f"delta{str(delta).replace('.', '_')}"
            f.case(f"huber_loss.{tag}.{red}",
                   lambda a, b: F.huber_loss(a, b, reduction=red, delta=delta),
                   f.uniform(shape, -3.0, 3.0), f.uniform(shape, -3.0, 3.0), delta=delta)
    # Kinks: equal operands, and differences exactly +-beta/delta.
    base = torch.tensor([[0.5, -1.0, 2.0], [0.25, 1.5, -0.75]], dtype=F64)
    diff = torch.tensor([[0.0, 0.0, 0.5], [-0.5, 1.0, -1.0]], dtype=F64)
    f.case("l1_loss.kink.sum", lambda a, b: F.l1_loss(a, b, reduction="sum"), base + diff, base)
    f.case("smooth_l1_loss.kink.sum",
           lambda a, b: F.smooth_l1_loss(a, b, reduction="sum", beta=0.5), base + diff, base, beta=0.5)
    f.case("huber_loss.kink.sum",
           lambda a, b: F.huber_loss(a, b, reduction="sum", delta=1.0), base + diff, base, delta=1.0)
    f.case("mse_loss.f32.mean", F.mse_loss, f.uniform(shape).float().double(), f.uniform(shape).float().double())


def gen_binary(f):
    shape = (4, 3)
    w_full = f.uniform(shape, 0.2, 2.0)
    w_row = f.uniform((3,), 0.2, 2.0)
    pw = f.uniform((3,), 0.5, 3.0)
    for red in REDUCTIONS:
        x = f.uniform(shape, 0.02, 0.98)
        y = f.uniform(shape, 0.0, 1.0)
        f.case(f"binary_cross_entropy.plain.{red}", lambda a, b: F.binary_cross_entropy(a, b, reduction=red), x, y)
        x = f.uniform(shape, 0.02, 0.98)
        y = (f.uniform(shape, 0.0, 1.0) > 0.5).to(F64)
        f.case(f"binary_cross_entropy.weight.{red}",
               lambda a, b: F.binary_cross_entropy(a, b, weight=w_full, reduction=red), x, y, weight=w_full)
        x = f.uniform(shape, 0.02, 0.98)
        y = f.uniform(shape, 0.0, 1.0)
        f.case(f"binary_cross_entropy.weight_row.{red}",
               lambda a, b: F.binary_cross_entropy(a, b, weight=w_row, reduction=red), x, y, weight=w_row)
        for var, kw in [("plain", {}), ("weight", {"weight": w_row}), ("pos_weight", {"pos_weight": pw}),
                        ("both", {"weight": w_full, "pos_weight": pw})]:
            x = f.uniform(shape, -6.0, 6.0)
            y = f.uniform(shape, 0.0, 1.0)
            f.case(f"binary_cross_entropy_with_logits.{var}.{red}",
                   lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction=red, **kw), x, y, **kw)
    # Saturated probabilities: log clamped at -100, the gradient's 1e-12 floor.
    x = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1e-300, 0.5]], dtype=F64)
    y = torch.tensor([[0.0, 1.0, 0.3], [0.7, 1.0, 0.5]], dtype=F64)
    f.case("binary_cross_entropy.kink.sum", lambda a, b: F.binary_cross_entropy(a, b, reduction="sum"), x, y)
    # Logits at 0 (where |x| and max(-x, 0) have kinks) and far out in both tails.
    x = torch.tensor([[0.0, 0.0, -0.0], [40.0, -40.0, 800.0], [-800.0, 1e-8, -1e-8]], dtype=F64)
    y = torch.tensor([[0.0, 1.0, 0.25], [0.0, 1.0, 0.5], [0.5, 1.0, 0.0]], dtype=F64)
    f.case("binary_cross_entropy_with_logits.kink.sum",
           lambda a, b: F.binary_cross_entropy_with_logits(a, b, reduction="sum", pos_weight=pw), x, y, pos_weight=pw)
    x = f.uniform(shape, -6.0, 6.0).float().double()
    y = f.uniform(shape, 0.0, 1.0).float().double()
    f.case("binary_cross_entropy_with_logits.f32.mean",
           lambda a, b: F.binary_cross_entropy_with_logits(a, b, pos_weight=pw.float().double()),
           x, y, pos_weight=pw.float().double())


def gen_kl(f):
    shape = (4, 5)
    for red in REDUCTIONS + ("batchmean",):
        x = torch.log_softmax(f.uniform(shape), dim=1)
        y = f.probs(shape)
        f.case(f"kl_div.plain.{red}", lambda a, b: F.kl_div(a, b, reduction=red), x, y)
        x = torch.log_softmax(f.uniform(shape), dim=1)
        y = torch.log_softmax(f.uniform(shape), dim=1)
        f.case(f"kl_div.log_target.{red}", lambda a, b: F.kl_div(a, b, reduction=red, log_target=True),
               x, y, log_target=True)
    # Zero target probabilities contribute 0 (xlogy); only the input's gradient
    # is compared (PyTorch's target gradient there is 0 * log 0).
    x = torch.log_softmax(f.uniform(shape), dim=1)
    y = f.probs(shape)
    y[0, 1] = 0.0
    y[2, 3] = 0.0
    f.case("kl_div.zeros.sum", lambda a, b: F.kl_div(a, b, reduction="sum"), x, y, grad_target=False)


def gen_unbatched(f):
    """One sample: input [C] and a 0-d class index (drawn last, so the
    cases before keep their values)."""
    c = 4
    w = f.uniform((c,), 0.2, 2.0)
    uvariants = [
        ("unbatched", {}, 2),
        ("unbatched_weight_smooth", {"weight": w, "label_smoothing": 0.2}, 1),
        ("unbatched_ignored", {"weight": w}, -100),
    ]
    for var, opts, cls in uvariants:
        for red in REDUCTIONS:
            x = f.uniform((c,), -3.0, 3.0)
            t = torch.tensor(cls, dtype=I64)
            kw = dict(opts)
            f.case(f"cross_entropy.{var}.{red}",
                   lambda a, b: F.cross_entropy(a, b, reduction=red, **kw), x, t, **kw)
            if "label_smoothing" not in kw:
                lp = torch.log_softmax(x, dim=0)
                f.case(f"nll_loss.{var}.{red}",
                       lambda a, b: F.nll_loss(a, b, reduction=red, **kw), lp, t, **kw)


def gen_init():
    """Fans and gains from torch.nn.init, keyed by what was asked."""
    out = Losses("init", seed=0)
    shapes = {"linear": (7, 3), "conv1d": (8, 4, 5), "conv2d": (16, 3, 5, 5), "conv3d": (4, 2, 3, 3, 3),
              "zero_receptive": (5, 6, 0), "wide": (2, 9)}
    for name, shape in shapes.items():
        fi, fo = init._calculate_fan_in_and_fan_out(torch.empty(shape))
        out.put(f"fan.{name}", torch.tensor([fi, fo], dtype=I64))
    gains = {
        "linear": init.calculate_gain("linear"),
        "conv2d": init.calculate_gain("conv2d"),
        "sigmoid": init.calculate_gain("sigmoid"),
        "tanh": init.calculate_gain("tanh"),
        "relu": init.calculate_gain("relu"),
        "leaky_relu": init.calculate_gain("leaky_relu"),
        "leaky_relu_0_2": init.calculate_gain("leaky_relu", 0.2),
        "leaky_relu_sqrt5": init.calculate_gain("leaky_relu", math.sqrt(5)),
        "selu": init.calculate_gain("selu"),
    }
    for name, g in gains.items():
        out.put(f"gain.{name}", torch.tensor(g, dtype=F64))
    return out


def main():
    f = Losses("losses", seed=20240)
    gen_class(f)
    gen_regression(f)
    gen_binary(f)
    gen_kl(f)
    gen_unbatched(f)
    for fam in (f, gen_init()):
        path = fam.save()
        print(f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}: "
              f"{path.stat().st_size} bytes, {len(fam.tensors)} tensors")


if __name__ == "__main__":
    main()
