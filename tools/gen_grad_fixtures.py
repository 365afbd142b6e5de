#!/usr/bin/env python3
"""Writes the PyTorch gradients the autograd suites compare against.

Run from the repository root:

    python3 tools/gen_grad_fixtures.py

Needs `torch`, `safetensors` and `numpy` (`pip install safetensors numpy`).
It writes two files to `tools/fixtures/` and prints their sizes:

    grad_ops.safetensors        read by tests/suite/grad_ops.rs (one case per op/variant)
    grad_composite.safetensors  read by tests/suite/grad_composite.rs (MLP, attention)

Each file's metadata records
`{"torch": torch.__version__, "generator": "tools/gen_grad_fixtures.py"}`.

Conventions (mirrored by the Rust tests; change both together):

- Everything is float64 (indices int64, masks bool). Inputs are drawn from a
  generator seeded per family, so a rerun writes identical files.
- A case `<family>.<op>.<variant>` stores its differentiable inputs as
  `<case>.in0`, `<case>.in1`, ..., the forward result as `<case>.out`, a fixed
  random upstream gradient (same shape as the output) as `<case>.gout`, and
  PyTorch's gradients `torch.autograd.grad(out, inputs, gout)` as
  `<case>.grad0`, `<case>.grad1`, ... (same order as the inputs).
  Non-differentiable operands (indices, masks) are `<case>.idx`,
  `<case>.cond`, `<case>.mask`.
- Op parameters (exponents, axes, strides, ...) are written here and again in
  the Rust test for the case. Non-contiguous views are built from the stored
  (contiguous) input in the same way on both sides: the comment names the view.
- Inputs avoid kinks (relu/abs at 0, ties of max/min, clamp bounds) except in
  the cases named `*.kink*`, `*.ties*` and `*.zeros*`, which pin PyTorch's
  conventions there: relu/abs/leaky_relu/clamp at their kinks, ties of
  maximum/minimum split the gradient in half, ties of amax/amin/max share it
  evenly, prod with zeros.
- grad_composite: `mlp.*` is a 8-16-4 MLP with ReLU and cross-entropy over
  class indices (weights in PyTorch's `Linear` layout [out, in]); `attn.*` is a
  single-head attention block softmax(q k^T / sqrt(d)) v with q, k, v linear
  projections (with bias) of one input. Gradients are stored as
  `<model>.grad.<param>`.

Total size stays small (tensors of tens to hundreds of elements).
"""
import math

from pathlib import Path

import torch
import torch.nn.functional as F
from fixture_file import FixtureFile

NAN = float("nan")

F64 = torch.float64

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class Family(FixtureFile):
    """The tensors of one fixture file."""

    GENERATOR = "tools/gen_grad_fixtures.py"

    # ---------------------------------------------------------- input domains
    def uniform(self, shape, lo=-2.0, hi=2.0):
        return torch.rand(shape, generator=self.g, dtype=F64) * (hi - lo) + lo

    def nonzero(self, shape, lo=0.2, hi=2.0):
        """Magnitudes in [lo, hi] with random signs: away from 0."""
        mag = self.uniform(shape, lo, hi)
        sign = torch.randint(0, 2, shape, generator=self.g).to(F64) * 2 - 1
        return mag * sign

    def grid(self, shape, offset=0.0, step=0.2, span=15):
        """Values offset + k * step for k in [-span, span): distinct enough
        that an `offset=0` grid and an `offset=step/2` grid never tie."""
        k = torch.randint(-span, span, shape, generator=self.g).to(F64)
        return k * step + offset

    def distinct(self, shape, step=0.13):
        """A shuffled arithmetic sequence: no two elements tie."""
        n = math.prod(shape)
        perm = torch.randperm(n, generator=self.g).to(F64)
        return ((perm - n / 2) * step + 0.01).reshape(shape)

    def index(self, shape, hi):
        return torch.randint(0, hi, shape, generator=self.g, dtype=torch.int64)

    def mask(self, shape):
        return torch.randint(0, 2, shape, generator=self.g).bool()

    # ---------------------------------------------------------- cases
    def case(self, name, fn, inputs, **consts):
        """Stores inputs, `fn(*inputs)`, an upstream gradient and the gradients."""
        for k, v in consts.items():
            self.put(f"{name}.{k}", v)
        leaves = [x.detach().clone().to(F64).requires_grad_(True) for x in inputs]
        out = fn(*leaves)
        gout = self.uniform(out.shape, -1.0, 1.0)
        grads = torch.autograd.grad(out, leaves, gout, materialize_grads=True)
        for i, x in enumerate(leaves):
            self.put(f"{name}.in{i}", x)
            self.put(f"{name}.grad{i}", grads[i])
        self.put(f"{name}.out", out)
        self.put(f"{name}.gout", gout)



def t(values):
    return torch.tensor(values, dtype=F64)


# ===================================================================== ops
# (name, function, domain) on a [3, 4] input.
UNARY = [
    ("neg", torch.neg, "any"),
    ("exp", torch.exp, "any"),
    ("log", torch.log, "pos"),
    ("log1p", torch.log1p, "gt-1"),
    ("sqrt", torch.sqrt, "pos"),
    ("rsqrt", torch.rsqrt, "pos"),
    ("recip", torch.reciprocal, "nz"),
    ("square", torch.square, "any"),
    ("abs", torch.abs, "nz"),
    ("sin", torch.sin, "any"),
    ("cos", torch.cos, "any"),
    ("tanh", torch.tanh, "any"),
    ("sigmoid", torch.sigmoid, "any"),
    ("relu", F.relu, "nz"),
    ("gelu", F.gelu, "any"),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), "any"),
    ("silu", F.silu, "any"),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.2), "nz"),
    ("leaky_relu_default", F.leaky_relu, "nz"),
    ("pow_scalar", lambda x: x.pow(2.5), "pos"),
    ("pow_scalar_int", lambda x: x.pow(3.0), "any"),
    ("pow_scalar_neg", lambda x: x.pow(-1.5), "pos"),
    ("add_scalar", lambda x: x + 1.5, "any"),
    ("mul_scalar", lambda x: x * -2.5, "any"),
    ("div_scalar", lambda x: x / 3.0, "any"),
    ("clamp", lambda x: x.clamp(-0.5, 0.75), "any"),
    ("clamp_min", lambda x: x.clamp_min(-0.5), "any"),
    ("clamp_max", lambda x: x.clamp_max(0.75), "any"),
]

# Exact kinks: 0, -0, the clamp bounds.
KINK = t([[-2.0, -0.5, -0.0, 0.0], [0.5, 0.75, 1.0, 2.0], [-1.0, 0.75, -0.5, 0.0]])
KINK_OPS = ["relu", "abs", "leaky_relu", "clamp", "clamp_min", "clamp_max", "pow_scalar_int", "square"]


def gen_unary(f):
    ops = {name: fn for name, fn, _ in UNARY}
    for name, fn, dom in UNARY:
        shape = (3, 4)
        x = {
            "any": lambda: f.uniform(shape),
            "pos": lambda: f.uniform(shape, 0.2, 3.0),
            "gt-1": lambda: f.uniform(shape, -0.8, 3.0),
            "nz": lambda: f.nonzero(shape),
        }[dom]()
        f.case(f"unary.{name}.x", fn, [x])
    for name in KINK_OPS:
        f.case(f"unary.{name}.kink", ops[name], [KINK])


# Operand shapes per variant: same sizes, a row vector, a keepdim-style [2, 1]
# (Rust: (C<2>, One)), an outer broadcast [3, 1] x [4] (Rust: (C<3>, One)),
# and a 3-d one stretching both operands, [2, 1, 4] x [3, 1] -> [2, 3, 4]
# (Rust: (C<2>, One, C<4>) and (C<3>, One)).
BINARY_VARIANTS = {
    "same": ((3, 4), (3, 4)),
    "bcast": ((2, 3), (3,)),
    "keepdim": ((2, 3), (2, 1)),
    "outer": ((3, 1), (4,)),
    "3d": ((2, 1, 4), (3, 1)),
}

BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "pow": torch.pow,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmax": torch.fmax,
    "fmin": torch.fmin,
}


def binary_inputs(f, op, sa, sb):
    if op == "div":
        return f.uniform(sa), f.nonzero(sb, 0.5, 2.0)
    if op == "pow":
        return f.uniform(sa, 0.3, 2.5), f.uniform(sb, -2.0, 2.0)
    if op in ("maximum", "minimum", "fmax", "fmin"):
        # Interleaved grids: never equal, even after broadcasting.
        return f.grid(sa), f.grid(sb, offset=0.1)
    return f.uniform(sa), f.uniform(sb)


def gen_binary(f):
    for op, fn in BINARY.items():
        for var, (sa, sb) in BINARY_VARIANTS.items():
            a, b = binary_inputs(f, op, sa, sb)
            f.case(f"binary.{op}.{var}", fn, [a, b])
    # Ties: the gradient is split in half between the operands.
    a = f.grid((3, 4))
    b = torch.where(f.mask((3, 4)), a, f.grid((3, 4), offset=0.1))
    f.case("binary.maximum.ties", torch.maximum, [a, b])
    f.case("binary.minimum.ties", torch.minimum, [a, b])
    f.case("binary.fmax.ties", torch.fmax, [a, b])
    f.case("binary.fmin.ties", torch.fmin, [a, b])
    # NaN on either side, or both: the gradient goes to the other operand.
    a = t([[NAN, 1.0, NAN, 2.0], [0.5, NAN, -1.0, 3.0], [1.0, 1.0, NAN, -2.0]])
    b = t([[1.0, NAN, NAN, 2.0], [0.5, -1.0, NAN, NAN], [2.0, 0.0, 4.0, -3.0]])
    f.case("binary.fmax.nan", torch.fmax, [a, b])
    f.case("binary.fmin.nan", torch.fmin, [a, b])
    # pow at a zero base (the exponent's gradient is 0 there for b >= 0, and the
    # base's is 0 for b == 0) and at a negative base (NaN for d/db).
    a = t([[0.0, 0.0, 0.0, 0.0], [0.0, -2.0, -2.0, 1.5], [2.0, 0.0, -0.5, 1.0]])
    b = t([[0.0, 1.0, 2.0, 3.0], [0.5, 3.0, 2.0, 0.0], [-1.0, 1.5, 2.0, -2.0]])
    f.case("binary.pow.kink", torch.pow, [a, b])


# Reductions over a [2, 3, 4] input: axes 0, 1, 2, keepdim on axis 1, all.
REDUCE = {
    "sum": (lambda x, d, k: x.sum(d, keepdim=k), lambda x: x.sum(), "any"),
    "mean": (lambda x, d, k: x.mean(d, keepdim=k), lambda x: x.mean(), "any"),
    "max": (lambda x, d, k: x.amax(d, keepdim=k), lambda x: x.max(), "distinct"),
    "min": (lambda x, d, k: x.amin(d, keepdim=k), lambda x: x.min(), "distinct"),
    "prod": (lambda x, d, k: x.prod(d, keepdim=k), lambda x: x.prod(), "nz"),
    "logsumexp": (
        lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
        lambda x: torch.logsumexp(x.reshape(-1), 0),
        "any",
    ),
}


def reduce_input(f, dom, shape=(2, 3, 4)):
    return {
        "any": lambda: f.uniform(shape),
        "distinct": lambda: f.distinct(shape),
        "nz": lambda: f.nonzero(shape, 0.5, 1.5),
    }[dom]()


def gen_reduce(f):
    for op, (axis_fn, all_fn, dom) in REDUCE.items():
        for d in range(3):
            f.case(f"reduce.{op}.ax{d}", lambda x, d=d: axis_fn(x, d, False), [reduce_input(f, dom)])
        f.case(f"reduce.{op}.keep1", lambda x: axis_fn(x, 1, True), [reduce_input(f, dom)])
        f.case(f"reduce.{op}.all", all_fn, [reduce_input(f, dom)])
    # var/std: (variant, axis or None, keepdim, unbiased)
    for op in ("var", "std"):
        fn = getattr(torch, op)
        for var, d, keep, unbiased in [
            ("ax1", 1, False, True),
            ("ax0b", 0, False, False),
            ("keep2", 2, True, True),
            ("all", None, False, True),
            ("allb", None, False, False),
        ]:
            corr = 1 if unbiased else 0
            if d is None:
                g = lambda x, corr=corr: fn(x, correction=corr)
            else:
                g = lambda x, d=d, keep=keep, corr=corr: fn(x, d, keepdim=keep, correction=corr)
            f.case(f"reduce.{op}.{var}", g, [f.uniform((2, 3, 4))])
    # Ties share the gradient evenly; small integers tie often.
    ties = f.grid((2, 3, 4), step=1.0, span=2)
    f.case("reduce.max.ties1", lambda x: x.amax(1), [ties])
    f.case("reduce.min.ties2", lambda x: x.amin(2), [ties])
    f.case("reduce.max.tiesall", lambda x: x.max(), [ties])
    f.case("reduce.min.tiesall", lambda x: x.min(), [ties])
    # prod with zeros: one zero in lane [0, 0, :], two in lane [1, 2, :].
    z = f.nonzero((2, 3, 4), 0.5, 1.5)
    z[0, 0, 1] = 0.0
    z[1, 2, 0] = 0.0
    z[1, 2, 3] = 0.0
    f.case("reduce.prod.zeros2", lambda x: x.prod(2), [z])
    z1 = f.nonzero((2, 3), 0.5, 1.5)
    z1[1, 1] = 0.0
    f.case("reduce.prod.zerosall", lambda x: x.prod(), [z1])


def gen_softmax(f):
    for op in ("softmax", "log_softmax"):
        for d in range(3):
            f.case(f"softmax.{op}.ax{d}", lambda x, d=d, op=op: getattr(torch, op)(x, d), [f.uniform((2, 3, 4), -3, 3)])
        # Large logits: the max is subtracted first.
        f.case(f"softmax.{op}.big", lambda x, op=op: getattr(torch, op)(x, 1), [f.uniform((3, 4), 990, 1010)])


def gen_matmul(f):
    u = f.uniform
    f.case("matmul.mm", torch.matmul, [u((2, 3)), u((3, 4))])
    f.case("matmul.vm", torch.matmul, [u((3,)), u((3, 4))])
    f.case("matmul.mv", torch.matmul, [u((2, 3)), u((3,))])
    f.case("matmul.vv", torch.matmul, [u((3,)), u((3,))])
    f.case("matmul.bmm", torch.matmul, [u((2, 2, 3)), u((2, 3, 4))])
    f.case("matmul.bcast_right", torch.matmul, [u((2, 2, 3)), u((3, 4))])
    f.case("matmul.bcast_left", torch.matmul, [u((2, 3)), u((2, 3, 4))])
    f.case("matmul.bcast_one", torch.matmul, [u((1, 2, 3)), u((2, 3, 4))])
    # in0 is stored [3, 2]; the op is in0.t() @ in1 (a transposed view).
    f.case("matmul.t_left", lambda a, b: a.t() @ b, [u((3, 2)), u((3, 4))])
    # in1 is stored [4, 3]; the op is in0 @ in1.t().
    f.case("matmul.t_right", lambda a, b: a @ b.t(), [u((2, 3)), u((4, 3))])


def gen_index(f):
    u = f.uniform
    idx = t([2, 0, 2, 3, 2]).long()
    f.case("index.index_select0", lambda x: x.index_select(0, idx), [u((4, 3))], idx=idx)
    idx = t([1, 1, 3]).long()
    f.case("index.index_select1", lambda x: x.index_select(1, idx), [u((3, 4))], idx=idx)
    idx = f.index((3, 5), 4)
    f.case("index.gather1", lambda x: x.gather(1, idx), [u((3, 4))], idx=idx)
    idx = f.index((3, 2), 4)
    f.case("index.gather0", lambda x: x.gather(0, idx), [u((4, 3))], idx=idx)
    idx = f.index((3, 3), 4)
    f.case("index.scatter_add0", lambda x, s: x.scatter_add(0, idx, s), [u((4, 3)), u((3, 3))], idx=idx)
    idx = f.index((2, 5), 4)
    f.case("index.scatter_add1", lambda x, s: x.scatter_add(1, idx, s), [u((3, 4)), u((2, 5))], idx=idx)
    idx = t([[1, 4, 1, 0], [3, 3, 1, 2]]).long()
    f.case("index.embedding", lambda w: F.embedding(idx, w), [u((5, 3))], idx=idx)


def gen_cat(f):
    u = f.uniform
    f.case("cat.cat0", lambda a, b, c: torch.cat([a, b, c], 0), [u((1, 3)), u((2, 3)), u((3, 3))])
    f.case("cat.cat1", lambda a, b: torch.cat([a, b], 1), [u((2, 2)), u((2, 3))])
    f.case("cat.stack0", lambda a, b, c: torch.stack([a, b, c], 0), [u((2, 3)), u((2, 3)), u((2, 3))])
    f.case("cat.stack1", lambda a, b: torch.stack([a, b], 1), [u((2, 3)), u((2, 3))])
    f.case("cat.stack2", lambda a, b: torch.stack([a, b], 2), [u((2, 3)), u((2, 3))])


def gen_view(f):
    u = f.uniform
    f.case("view.transpose", lambda x: x.transpose(0, 2), [u((2, 3, 4))])
    f.case("view.t", lambda x: x.t(), [u((3, 4))])
    f.case("view.permute", lambda x: x.permute(2, 0, 1), [u((2, 3, 4))])
    f.case("view.unsqueeze", lambda x: x.unsqueeze(1), [u((3, 4))])
    f.case("view.squeeze", lambda x: x.squeeze(1), [u((3, 1, 4))])
    f.case("view.narrow", lambda x: x.narrow(1, 1, 3), [u((3, 5))])
    f.case("view.narrow_static", lambda x: x.narrow(1, 2, 2), [u((3, 5))])
    f.case("view.slice1", lambda x: x[:, 1:5:2], [u((4, 5))])
    f.case("view.slice0", lambda x: x[0:7:3], [u((7, 2))])
    f.case("view.expand", lambda x: x.expand(2, 3, 4), [u((3, 1))])
    f.case("view.reshape", lambda x: x.reshape(3, 4), [u((2, 6))])
    # in0 is stored [4, 3]; the op reshapes the non-contiguous in0.t().
    f.case("view.reshape_nc", lambda x: x.t().reshape(2, 6), [u((4, 3))])
    f.case("view.flatten", lambda x: x.flatten(1), [u((2, 3, 4))])
    f.case("view.flatten_all", lambda x: x.flatten(), [u((2, 3))])
    # Pieces reordered, one dropped: zeros where a piece is unused.
    f.case("view.split", lambda x: (lambda p: torch.cat([p[2], p[0]], 1))(x.split(2, 1)), [u((3, 5))])
    f.case("view.chunk", lambda x: (lambda p: torch.cat([p[1], p[0]], 0))(x.chunk(2, 0)), [u((5, 3))])
    f.case("view.contiguous", lambda x: x.t().contiguous(), [u((3, 4))])


def gen_twice(f):
    u = f.uniform
    f.case("twice.mul_sin", lambda x: x * torch.sin(x), [u((3, 4))])
    f.case("twice.add_t", lambda x: x + x.t(), [u((3, 3))])
    f.case("twice.matmul_self", lambda x: x @ x, [u((3, 3))])
    f.case("twice.div_sum_keepdim", lambda x: x / x.sum(1, keepdim=True), [u((3, 4), 0.5, 2.0)])
    f.case("twice.sub_mean_keepdim", lambda x: x - x.mean(0, keepdim=True), [u((3, 4))])
    f.case("twice.split_mul", lambda x: (lambda p: p[0] * p[1])(x.split(2, 0)), [u((4, 3))])


def gen_cmp(f):
    u = f.uniform
    cond = f.mask((3, 4))
    f.case("cmp.where", lambda a, b: torch.where(cond, a, b), [u((3, 4)), u((3, 4))], cond=cond)
    cond = f.mask((4,))
    f.case("cmp.where_bcast", lambda a, b: torch.where(cond, a, b), [u((3, 4)), u((4,))], cond=cond)
    mask = f.mask((3, 4))
    f.case("cmp.masked_fill", lambda x: x.masked_fill(mask, -1.5), [u((3, 4))], mask=mask)
    mask = f.mask((4,))
    f.case("cmp.masked_fill_bcast", lambda x: x.masked_fill(mask, 2.0), [u((3, 4))], mask=mask)


def gen_conv(f):
    u = f.uniform
    f.case("conv.conv2d", lambda x, w: F.conv2d(x, w), [u((2, 3, 6, 6)), u((4, 3, 3, 3))])
    f.case("conv.conv2d_s2p1", lambda x, w: F.conv2d(x, w, stride=2, padding=1), [u((1, 2, 7, 7)), u((3, 2, 3, 3))])
    f.case("conv.conv2d_dil", lambda x, w: F.conv2d(x, w, padding=1, dilation=2), [u((1, 2, 7, 7)), u((2, 2, 3, 3))])
    f.case("conv.conv2d_groups", lambda x, w: F.conv2d(x, w, padding=1, groups=2), [u((1, 4, 5, 5)), u((6, 2, 3, 3))])
    f.case("conv.conv1d", lambda x, w: F.conv1d(x, w, padding=1), [u((2, 3, 8)), u((4, 3, 3))])
    f.case(
        "conv.conv1d_s2d2g2",
        lambda x, w: F.conv1d(x, w, stride=2, dilation=2, groups=2),
        [u((1, 2, 9)), u((2, 1, 3))],
    )
    f.case("conv.bias", lambda x, b: x + b[None, :, None, None], [u((2, 3, 4, 4)), u((3,))])
    # Pooling: continuous random inputs, so windows have no ties.
    f.case("pool.max2", lambda x: F.max_pool2d(x, 2), [u((2, 2, 6, 6))])
    f.case("pool.max3s2p1", lambda x: F.max_pool2d(x, 3, 2, 1), [u((1, 2, 7, 7))])
    f.case("pool.avg2", lambda x: F.avg_pool2d(x, 2), [u((2, 2, 6, 6))])
    f.case("pool.avg3s2p1", lambda x: F.avg_pool2d(x, 3, 2, 1), [u((1, 2, 7, 7))])
    f.case("pool.avg3s2p1_nopad", lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [u((1, 2, 7, 7))])
    f.case("pool.avg_ceil", lambda x: F.avg_pool2d(x, 2, 2, ceil_mode=True), [u((1, 1, 5, 5))])
    f.case("pool.max1d", lambda x: F.max_pool1d(x, 2), [u((2, 3, 8))])
    f.case("pool.avg1d", lambda x: F.avg_pool1d(x, 3, 2, 1), [u((2, 3, 8))])


def gen_added(f):
    """Ops added after the file was first written: drawn last, so that the
    cases before them keep their inputs."""
    f.case("unary.hardswish.x", F.hardswish, [f.uniform((3, 4), -4.0, 4.0)])
    # The kinks at -3 and 3 (PyTorch's derivative there: -0.5 and 1.5).
    f.case("unary.hardswish.kink", F.hardswish, [t([[-3.0, 3.0, -4.0, 4.0], [-2.5, 0.0, 2.5, 3.5], [-3.0, 3.0, -1.0, 1.0]])])


def gen_ops():
    f = Family("grad_ops", 20240)
    for gen in (gen_unary, gen_binary, gen_reduce, gen_softmax, gen_matmul, gen_index, gen_cat, gen_view, gen_twice, gen_cmp, gen_conv, gen_added):
        gen(f)
    return f


# ===================================================================== composites
def gen_composite():
    f = Family("grad_composite", 20241)

    # (a) MLP 8-16-4, ReLU, cross-entropy over class indices (mean over the batch).
    n = 6
    x = f.uniform((n, 8), -1.0, 1.0)
    w1 = f.uniform((16, 8), -0.5, 0.5)
    b1 = f.uniform((16,), -0.1, 0.1)
    w2 = f.uniform((4, 16), -0.5, 0.5)
    b2 = f.uniform((4,), -0.1, 0.1)
    target = t([0, 3, 1, 3, 2, 0]).long()
    leaves = [p.clone().requires_grad_(True) for p in (x, w1, b1, w2, b2)]
    lx, lw1, lb1, lw2, lb2 = leaves
    h = F.relu(lx @ lw1.t() + lb1)
    logits = h @ lw2.t() + lb2
    loss = F.cross_entropy(logits, target)
    # The Rust side writes cross-entropy out; check the two forms agree here.
    manual = -(torch.log_softmax(logits, 1).gather(1, target[:, None])).mean()
    assert torch.allclose(loss, manual, rtol=0, atol=1e-15)
    gout = t(0.75)
    grads = torch.autograd.grad(loss, leaves, gout)
    for k, v in zip(("x", "w1", "b1", "w2", "b2"), leaves):
        f.put(f"mlp.{k}", v)
    f.put("mlp.target", target)
    f.put("mlp.logits", logits)
    f.put("mlp.loss", loss)
    f.put("mlp.gout", gout)
    for k, g in zip(("x", "w1", "b1", "w2", "b2"), grads):
        f.put(f"mlp.grad.{k}", g)

    # (b) single-head attention over a batch of 2 sequences of length 5, width 8,
    # head width 6: softmax(q k^T / sqrt(6)) v with q/k/v = x W^T + b.
    x = f.uniform((2, 5, 8), -1.0, 1.0)
    params = {}
    for p in ("q", "k", "v"):
        params[f"w{p}"] = f.uniform((6, 8), -0.5, 0.5)
        params[f"b{p}"] = f.uniform((6,), -0.1, 0.1)
    names = ["x"] + list(params)
    leaves = [v.clone().requires_grad_(True) for v in [x] + list(params.values())]
    lv = dict(zip(names, leaves))
    q = lv["x"] @ lv["wq"].t() + lv["bq"]
    k = lv["x"] @ lv["wk"].t() + lv["bk"]
    v = lv["x"] @ lv["wv"].t() + lv["bv"]
    scores = q @ k.transpose(1, 2) / math.sqrt(6)
    att = torch.softmax(scores, 2)
    out = att @ v
    gout = f.uniform(out.shape, -1.0, 1.0)
    grads = torch.autograd.grad(out, leaves, gout)
    for k_, l in lv.items():
        f.put(f"attn.{k_}", l)
    f.put("attn.att", att)
    f.put("attn.out", out)
    f.put("attn.gout", gout)
    for k_, g in zip(names, grads):
        f.put(f"attn.grad.{k_}", g)
    return f


def main():
    for fam in (gen_ops(), gen_composite()):
        path = fam.save()
        print(f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}: "
              f"{path.stat().st_size} bytes, {len(fam.tensors)} tensors")


if __name__ == "__main__":
    main()
