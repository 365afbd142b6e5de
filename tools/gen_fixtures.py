#!/usr/bin/env python3
"""Writes the PyTorch golden values the `tests/suite/ops_*.rs` suites compare against.

Run from the repository root:

    python3 tools/gen_fixtures.py

Needs `torch`, `safetensors` and `numpy` (`pip install safetensors numpy`).
It writes one safetensors file per op family to `tools/fixtures/`:

    unary.safetensors    binary.safetensors   cmp.safetensors
    reduce.safetensors   softmax.safetensors  matmul.safetensors
    attention.safetensors  cumsum.safetensors   rearrange.safetensors
    sort.safetensors
    index.safetensors    shape.safetensors    conv.safetensors
    pool.safetensors     create.safetensors

and prints each file's size. Each file's metadata records
`{"torch": torch.__version__, "generator": "tools/gen_fixtures.py"}`.

Conventions (mirrored by the Rust tests; change both together):

- Keys are `<case>.in0`, `<case>.in1`, ... for inputs and `<case>.out` (or
  `<case>.out0`, ... for several results) for PyTorch's answer. Where many ops
  share one input (unary, binary, reduce, softmax), the input is stored once
  as `<input>.in0` and each result as `<op>.<input>[.<variant>].out`.
- Inputs are drawn in float64 from a generator seeded per family (fixed seeds,
  so a rerun writes identical files) and rounded to the test dtype; PyTorch then
  computes in the test dtype, so each `.out` is exactly what PyTorch returns
  for that dtype on the CPU.
- Inputs are stored contiguous. A non-contiguous case stores the base tensor
  and the comment says which view the test builds (e.g. `base.t()`); the
  generator computes on that same view.
- Op parameters (exponents, slopes, strides, ...) are written in this script
  and again in the Rust test for the case.
- f32 is the main dtype; cases named `*64*` are float64, `*f16*`/`*bf16*` are
  half types. Indices are int64, comparison results bool.

Total size is kept well under 1 MB (tensors of tens to hundreds of elements).
"""
import warnings

from pathlib import Path

import torch
import torch.nn.functional as F
from fixture_file import FixtureFile


NAN = float("nan")
INF = float("inf")

F32 = torch.float32
F64 = torch.float64

torch.manual_seed(0)
# var/std over one value (or none) are NaN on purpose; PyTorch warns about it.
warnings.filterwarnings("ignore", message=".*degrees of freedom is <= 0.*")
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class Family(FixtureFile):
    """The tensors of one fixture file."""

    GENERATOR = "tools/gen_fixtures.py"

    # Float64 master data, rounded to the test dtype.
    def uniform(self, shape, lo=-3.0, hi=3.0, dtype=F32):
        x = torch.rand(shape, generator=self.g, dtype=F64) * (hi - lo) + lo
        return x.to(dtype)

    def normal(self, shape, scale=1.0, dtype=F32):
        return (torch.randn(shape, generator=self.g, dtype=F64) * scale).to(dtype)

    def ints(self, shape, lo, hi, dtype=F32):
        """Small integers in [lo, hi) as floats (ties for comparisons/argmax)."""
        return torch.randint(lo, hi, shape, generator=self.g).to(F64).to(dtype)

    def index(self, shape, hi):
        return torch.randint(0, hi, shape, generator=self.g, dtype=torch.int64)



def t(values, dtype=F32):
    return torch.tensor(values, dtype=F64).to(dtype)


# 16 values that exercise NaN/Inf propagation, signed zeros and overflow.
SPECIAL = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-8, 100.0, -100.0, 1e30, -1e30, 3.0, 88.0]


# ---------------------------------------------------------------- unary
UNARY = {
    "neg": torch.neg,
    "exp": torch.exp,
    "log": torch.log,
    "log1p": torch.log1p,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "recip": torch.reciprocal,
    "square": torch.square,
    "abs": torch.abs,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "hardswish": F.hardswish,
    # Parameters: the Rust table uses the same values.
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "leaky_relu_default": lambda x: F.leaky_relu(x, 0.01),
    "pow_scalar": lambda x: torch.pow(x, 2.5),
    "pow_scalar_int": lambda x: torch.pow(x, 3.0),
    "pow_scalar_neg": lambda x: torch.pow(x, -1.5),
    "add_scalar": lambda x: x + 1.5,
    "mul_scalar": lambda x: x * -2.5,
    "div_scalar": lambda x: x / 3.0,
    "clamp": lambda x: torch.clamp(x, -0.5, 0.75),
    "clamp_min": lambda x: torch.clamp_min(x, -0.5),
    "clamp_max": lambda x: torch.clamp_max(x, 0.75),
}


def gen_unary():
    f = Family("unary", 1)
    inputs = {
        # typical values in (-3, 3)
        "any": f.put("any.in0", f.uniform((3, 4))),
        # positive values for log/sqrt/pow
        "pos": f.put("pos.in0", f.uniform((3, 4), 0.05, 5.0)),
        # NAN, +-Inf, +-0, tiny and huge values
        "special": f.put("special.in0", t(SPECIAL).reshape(4, 4)),
        # size-0 and size-1 dims
        "empty": f.put("empty.in0", torch.zeros(0, 3)),
        "one": f.put("one.in0", f.uniform((1, 3, 1))),
        "any64": f.put("any64.in0", f.uniform((3, 4), dtype=F64)),
        "special64": f.put("special64.in0", t(SPECIAL, F64).reshape(4, 4)),
        "f16": f.put("f16.in0", f.uniform((3, 4), dtype=torch.float16)),
        "bf16": f.put("bf16.in0", f.uniform((3, 4), dtype=torch.bfloat16)),
    }
    # non-contiguous: stored base [4, 3], the test applies the op to base.t()
    nc = f.put("nc.in0", f.uniform((4, 3)))
    inputs["nc"] = nc.t()
    # non-contiguous with an offset and a step: base [3, 8], view base[:, 1::2]
    ncs = f.put("ncs.in0", f.uniform((3, 8)))
    inputs["ncs"] = ncs[:, 1::2]
    for op, fn in UNARY.items():
        for name, x in inputs.items():
            f.put(f"{op}.{name}.out", fn(x))
    return f


# ---------------------------------------------------------------- binary
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

SPECIAL9 = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.5, -0.5]


def gen_binary():
    f = Family("binary", 2)
    pairs = {}

    def pair(name, a, b, view=None):
        f.put(f"{name}.in0", a)
        f.put(f"{name}.in1", b)
        pairs[name] = view(a, b) if view else (a, b)

    # same shape [3, 4]; b positive-ish so pow stays mostly finite
    pair("same", f.uniform((3, 4)), f.uniform((3, 4), 0.5, 2.0))
    # [2,3,4] op [3,1]: the size-1 dim is `One` on the Rust side
    pair("col", f.uniform((2, 3, 4)), f.uniform((3, 1), 0.5, 2.0))
    # [4] op [2,3,4]: lower rank on the left
    pair("row", f.uniform((4,), 0.5, 2.0), f.uniform((2, 3, 4), -2.0, 2.0))
    # [3,1] op [1,4]: `One` on both sides
    pair("outer", f.uniform((3, 1)), f.uniform((1, 4), 0.5, 2.0))
    # scalar-shaped (rank 0) operands on either side
    pair("scalar_r", f.uniform((2, 3)), f.uniform((), 0.5, 2.0))
    pair("scalar_l", f.uniform((), 0.5, 2.0), f.uniform((2, 3)))
    # every pair of special values: [9,1] op [1,9]
    pair("special", t(SPECIAL9).reshape(9, 1), t(SPECIAL9).reshape(1, 9))
    # non-contiguous: a stored [4,3] used as a.t(); b stored [3,8] used as b[:, 1::2]
    pair("nc", f.uniform((4, 3)), f.uniform((3, 8), 0.5, 2.0), lambda a, b: (a.t(), b[:, 1::2]))
    # size-0 dim: [0,4] op [1,4]
    pair("empty", torch.zeros(0, 4), f.uniform((1, 4)))
    # static size 1 on both sides (C<1>, not broadcasting): [1,3] op [1,3]
    pair("ones", f.uniform((1, 3)), f.uniform((1, 3), 0.5, 2.0))
    # Dyn-typed operands that broadcast at run time: [3,1] op [1,4]
    pair("dyn", f.uniform((3, 1)), f.uniform((1, 4), 0.5, 2.0))
    # float64
    pair("same64", f.uniform((3, 4), dtype=F64), f.uniform((3, 4), 0.5, 2.0, dtype=F64))
    pair("col64", f.uniform((2, 3, 4), dtype=F64), f.uniform((3, 1), 0.5, 2.0, dtype=F64))
    pair("special64", t(SPECIAL9, F64).reshape(9, 1), t(SPECIAL9, F64).reshape(1, 9))
    for op, fn in BINARY.items():
        for name, (a, b) in pairs.items():
            f.put(f"{op}.{name}.out", fn(a, b))
    return f


# ---------------------------------------------------------------- cmp
CMP = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge}


def gen_cmp():
    f = Family("cmp", 3)
    pairs = {}

    def pair(name, a, b, view=None):
        f.put(f"{name}.in0", a)
        f.put(f"{name}.in1", b)
        pairs[name] = view(a, b) if view else (a, b)

    # small integers so that ties occur
    pair("same", f.ints((3, 4), -2, 3), f.ints((3, 4), -2, 3))
    pair("col", f.ints((3, 1), -2, 3), f.ints((4,), -2, 3))
    pair("special", t(SPECIAL9).reshape(9, 1), t(SPECIAL9).reshape(1, 9))
    # a stored [4,3] used as a.t()
    pair("nc", f.ints((4, 3), -2, 3), f.ints((3, 4), -2, 3), lambda a, b: (a.t(), b))
    pair("empty", torch.zeros(0, 4), f.ints((4,), -2, 3))
    pair("same64", f.ints((3, 4), -2, 3, F64), f.ints((3, 4), -2, 3, F64))
    for op, fn in CMP.items():
        for name, (a, b) in pairs.items():
            f.put(f"{op}.{name}.out", fn(a, b))

    # masked_fill: x [3,4] with NAN/Inf inside
    x = f.put("mf.x.in0", t([[1.0, NAN, 3.0, -4.0], [INF, 6.0, -INF, 8.0], [9.0, 10.0, 11.0, 12.0]]))
    m = f.put("mf.full.in1", torch.rand((3, 4), generator=f.g) < 0.5)
    f.put("mf.full.out", x.masked_fill(m, -1e9))
    m = f.put("mf.row.in1", torch.tensor([True, False, True, False]))  # [4] broadcast to [3,4]
    f.put("mf.row.out", x.masked_fill(m, 2.5))
    m = f.put("mf.col.in1", torch.tensor([[False], [True], [False]]))  # [3,1] (One) broadcast
    f.put("mf.col.out", x.masked_fill(m, NAN))
    f.put("mf.inf.out", x.masked_fill(pairs["same"][0] > 0, -INF))  # mask = same.in0 > 0
    # non-contiguous x: stored [4,3] used as .t()
    xb = f.put("mf.nc.in0", f.uniform((4, 3)))
    m = f.put("mf.nc.in1", torch.rand((3, 4), generator=f.g) < 0.5)
    f.put("mf.nc.out", xb.t().masked_fill(m, 0.0))
    x64 = f.put("mf.x64.in0", f.uniform((3, 4), dtype=F64))
    f.put("mf.x64.out", x64.masked_fill(f.tensors["mf.full.in1"], -0.125))

    # where(cond, a, b)
    c = f.put("where.full.in0", torch.rand((3, 4), generator=f.g) < 0.5)
    a = f.put("where.full.in1", t([[NAN, 1.0, 2.0, 3.0], [4.0, INF, 6.0, 7.0], [8.0, 9.0, -INF, 11.0]]))
    b = f.put("where.full.in2", f.uniform((4,)))  # [4] broadcast against [3,4]
    f.put("where.full.out", torch.where(c, a, b))
    # cond [3,1] (One), a [1,4] (One), b [3,1] (One): everything broadcasts
    c = f.put("where.bcast.in0", torch.tensor([[True], [False], [True]]))
    a = f.put("where.bcast.in1", f.uniform((1, 4)))
    b = f.put("where.bcast.in2", f.uniform((3, 1)))
    f.put("where.bcast.out", torch.where(c, a, b))
    # non-contiguous a: stored [4,3] used as .t()
    c = f.put("where.nc.in0", torch.rand((3, 4), generator=f.g) < 0.5)
    a = f.put("where.nc.in1", f.uniform((4, 3)))
    b = f.put("where.nc.in2", f.uniform((3, 4)))
    f.put("where.nc.out", torch.where(c, a.t(), b))
    c = f.put("where.f64.in0", torch.rand((3, 4), generator=f.g) < 0.5)
    a = f.put("where.f64.in1", f.uniform((3, 4), dtype=F64))
    b = f.put("where.f64.in2", f.uniform((3, 4), dtype=F64))
    f.put("where.f64.out", torch.where(c, a, b))
    # empty
    c = f.put("where.empty.in0", torch.zeros((0, 4), dtype=torch.bool))
    a = f.put("where.empty.in1", torch.zeros(0, 4))
    b = f.put("where.empty.in2", f.uniform((4,)))
    f.put("where.empty.out", torch.where(c, a, b))
    return f


# ---------------------------------------------------------------- reduce
def reductions(x, dim, keepdim=False):
    """Every float reduction of `x` along `dim` (None: all elements)."""
    kw = {} if dim is None else {"dim": dim, "keepdim": keepdim}
    dims = list(range(x.dim())) if dim is None else dim
    out = {
        "sum": x.sum(**kw),
        "mean": x.mean(**kw),
        "prod": x.prod(**kw) if dim is not None else x.prod(),
        "logsumexp": torch.logsumexp(x, dim=dims, keepdim=keepdim),
        "var_u": x.var(**kw, correction=1),
        "var_b": x.var(**kw, correction=0),
        "std_u": x.std(**kw, correction=1),
        "std_b": x.std(**kw, correction=0),
    }
    if (dim is None and x.numel() > 0) or (dim is not None and x.shape[dim] > 0):
        out["max"] = x.amax(**kw) if dim is not None else x.max()
        out["min"] = x.amin(**kw) if dim is not None else x.min()
    if dim is not None and x.shape[dim] > 0:
        out["argmax"] = x.argmax(dim, keepdim=keepdim)
        out["argmin"] = x.argmin(dim, keepdim=keepdim)
    if dim is None and x.numel() > 0:
        out["argmax"] = x.argmax()
        out["argmin"] = x.argmin()
    return out


def gen_reduce():
    f = Family("reduce", 4)

    def case(name, x, variants):
        for var, (dim, keep) in variants.items():
            for op, y in reductions(x, dim, keep).items():
                f.put(f"{op}.{name}.{var}.out", y)

    axes3 = {"ax0": (0, False), "ax1": (1, False), "ax2": (2, False), "ax1k": (1, True), "all": (None, False)}
    x = f.put("x.in0", f.normal((3, 4, 5)))
    case("x", x, axes3)
    # non-contiguous: stored [5,4,3], the test reduces base.permute(2,1,0) ([3,4,5])
    nc = f.put("nc.in0", f.normal((5, 4, 3)))
    case("nc", nc.permute(2, 1, 0), {"ax1": (1, False), "ax2": (2, False), "all": (None, False)})
    # NAN / Inf rows and extreme magnitudes, reduced along each axis
    special = f.put(
        "special.in0",
        t(
            [
                [NAN, 1.0, 2.0, 3.0],
                [INF, 1.0, 2.0, 3.0],
                [-INF, -INF, -INF, -INF],
                [INF, -INF, 0.0, 1.0],
                [1000.0, 1000.0, 999.0, -1000.0],
            ]
        ),
    )
    case("special", special, {"ax0": (0, False), "ax1": (1, False)})
    # ties: argmax/argmin return the first extreme
    ties = f.put("ties.in0", t([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, -1.0, -1.0, 5.0]]))
    case("ties", ties, {"ax0": (0, False), "ax1": (1, False)})
    # size-0 dim: [0,3] along 0 (empty reduction) and along 1 (empty result)
    empty = f.put("empty.in0", torch.zeros(0, 3))
    case("empty", empty, {"ax0": (0, False), "ax1": (1, False), "all": (None, False)})
    # size-1 axis: [4,1] along 1 (unbiased var of one value is NAN)
    one = f.put("one.in0", f.normal((4, 1)))
    case("one", one, {"ax1": (1, False), "ax1k": (1, True)})
    x64 = f.put("x64.in0", f.normal((3, 4, 5), dtype=F64))
    case("x64", x64, {"ax2": (2, False), "ax0k": (0, True), "all": (None, False)})
    return f


# ---------------------------------------------------------------- softmax
def gen_softmax():
    f = Family("softmax", 5)

    def case(name, x, dims):
        for d in dims:
            f.put(f"softmax.{name}.ax{d}.out", torch.softmax(x, d))
            f.put(f"log_softmax.{name}.ax{d}.out", torch.log_softmax(x, d))

    case("x", f.put("x.in0", f.normal((3, 4), 2.0)), [0, 1])
    case("x3", f.put("x3.in0", f.normal((2, 3, 4), 2.0)), [0, 1, 2])
    # non-contiguous: stored [4,3], the test uses base.t()
    case("nc", f.put("nc.in0", f.normal((4, 3), 2.0)).t(), [0, 1])
    extreme = [
        [1000.0, 1000.0, -INF],
        [-1000.0, -1000.0, -1000.0],
        [-INF, -INF, -INF],
        [INF, 0.0, 1.0],
        [NAN, 1.0, 2.0],
        [1000.0, 0.0, -1000.0],
        [88.0, 89.0, 90.0],
    ]
    case("extreme", f.put("extreme.in0", t(extreme)), [1])
    case("empty", f.put("empty.in0", torch.zeros(0, 4)), [0, 1])
    case("empty_ax", f.put("empty_ax.in0", torch.zeros(2, 0)), [1])
    case("one", f.put("one.in0", f.normal((3, 1))), [1])
    case("x64", f.put("x64.in0", f.normal((3, 4), 2.0, F64)), [0, 1])
    case("extreme64", f.put("extreme64.in0", t(extreme, F64)), [1])
    return f


# ---------------------------------------------------------------- matmul
def gen_matmul():
    f = Family("matmul", 6)

    def case(name, a, b, view=None):
        f.put(f"{name}.in0", a)
        f.put(f"{name}.in1", b)
        if view:
            a, b = view(a, b)
        f.put(f"{name}.out", torch.matmul(a, b))

    case("mm", f.normal((3, 4)), f.normal((4, 5)))
    case("vm", f.normal((4,)), f.normal((4, 5)))  # vector @ matrix
    case("mv", f.normal((3, 4)), f.normal((4,)))  # matrix @ vector
    case("vv", f.normal((4,)), f.normal((4,)))  # dot product, rank-0 result
    case("bmm", f.normal((2, 3, 4)), f.normal((2, 4, 5)))
    case("bcast", f.normal((2, 1, 3, 4)), f.normal((3, 4, 5)))  # batch [2,1] x [3]
    case("b3_2", f.normal((2, 3, 4)), f.normal((4, 5)))  # matrix broadcast over the batch
    case("b2_3", f.normal((3, 4)), f.normal((2, 4, 5)))
    case("v_b", f.normal((4,)), f.normal((2, 4, 5)))  # vector @ batch
    case("b_v", f.normal((2, 3, 4)), f.normal((4,)))  # batch @ vector
    # non-contiguous: a stored [4,3] used as a.t(); b stored [5,4] used as b.t()
    case("nc", f.normal((4, 3)), f.normal((5, 4)), lambda a, b: (a.t(), b.t()))
    # batched non-contiguous: a stored [3,2,4] used as a.permute(1,0,2); b stored [2,5,4] as b.transpose(1,2)
    case("nc3", f.normal((3, 2, 4)), f.normal((2, 5, 4)), lambda a, b: (a.permute(1, 0, 2), b.transpose(1, 2)))
    case("empty_m", torch.zeros(0, 4), f.normal((4, 5)))  # [0,4] @ [4,5] -> [0,5]
    case("empty_k", torch.zeros(3, 0), torch.zeros(0, 5))  # k = 0 -> zeros [3,5]
    case("ones", f.normal((1, 4)), f.normal((4, 1)))
    # NAN/Inf propagate through the products (b is positive, so no inf - inf)
    case("special", t([[NAN, 1.0], [INF, 1.0], [1.0, 2.0]]), t([[1.0, 2.0], [3.0, 4.0]]))
    case("mm64", f.normal((3, 4), dtype=F64), f.normal((4, 5), dtype=F64))
    case("bmm64", f.normal((2, 3, 4), dtype=F64), f.normal((2, 4, 5), dtype=F64))
    # larger inner dimension for the sum-of-products tolerance
    case("wide", f.normal((4, 64)), f.normal((64, 6)))
    return f


# ---------------------------------------------------------------- index
def gen_index():
    f = Family("index", 7)
    x = f.put("is.x.in0", f.normal((4, 5)))
    i0 = f.put("is.ax0.in1", torch.tensor([3, 0, 3], dtype=torch.int64))
    f.put("is.ax0.out", x.index_select(0, i0))
    i1 = f.put("is.ax1.in1", torch.tensor([4, 1, 1, 0], dtype=torch.int64))
    f.put("is.ax1.out", x.index_select(1, i1))
    ie = f.put("is.empty.in1", torch.zeros(0, dtype=torch.int64))
    f.put("is.empty.out", x.index_select(1, ie))
    # non-contiguous: stored [4,3,2] used as base.permute(2,1,0) ([2,3,4]), select along 1
    nb = f.put("is.nc.in0", f.normal((4, 3, 2)))
    ni = f.put("is.nc.in1", torch.tensor([2, 0], dtype=torch.int64))
    f.put("is.nc.out", nb.permute(2, 1, 0).index_select(1, ni))
    xn = f.put("is.nan.in0", t([[NAN, 1.0], [INF, -INF], [0.0, 2.0]]))
    inan = f.put("is.nan.in1", torch.tensor([1, 0, 1], dtype=torch.int64))
    f.put("is.nan.out", xn.index_select(0, inan))
    x64 = f.put("is.x64.in0", f.normal((4, 5), dtype=F64))
    f.put("is.x64.out", x64.index_select(0, i0))

    # gather
    gx = f.put("gather.x.in0", f.normal((3, 4)))
    g1 = f.put("gather.ax1.in1", f.index((3, 2), 4))
    f.put("gather.ax1.out", torch.gather(gx, 1, g1))
    g0 = f.put("gather.ax0.in1", f.index((2, 4), 3))
    f.put("gather.ax0.out", torch.gather(gx, 0, g0))
    gs = f.put("gather.small.in1", f.index((2, 2), 4))  # index smaller than x on axis 0
    f.put("gather.small.out", torch.gather(gx, 1, gs))
    gb = f.put("gather.nc.in0", f.normal((4, 3)))  # used as .t()
    gn = f.put("gather.nc.in1", f.index((3, 4), 4))
    f.put("gather.nc.out", torch.gather(gb.t(), 1, gn))
    g3 = f.put("gather.x3.in0", f.normal((2, 3, 4)))
    g3i = f.put("gather.x3.in1", f.index((2, 3, 2), 4))
    f.put("gather.x3.out", torch.gather(g3, 2, g3i))
    g64 = f.put("gather.x64.in0", f.normal((3, 4), dtype=F64))
    f.put("gather.x64.out", torch.gather(g64, 1, g1))

    # scatter_add (duplicates accumulate)
    sx = f.put("sa.x.in0", f.normal((3, 4)))
    si0 = f.put("sa.ax0.in1", torch.tensor([[0, 1, 2, 0], [0, 1, 0, 2]], dtype=torch.int64))
    ss0 = f.put("sa.ax0.in2", f.normal((2, 4)))
    f.put("sa.ax0.out", sx.scatter_add(0, si0, ss0))
    si1 = f.put("sa.ax1.in1", torch.tensor([[3, 3, 0], [1, 2, 1], [0, 0, 0]], dtype=torch.int64))
    ss1 = f.put("sa.ax1.in2", f.normal((3, 3)))
    f.put("sa.ax1.out", sx.scatter_add(1, si1, ss1))
    sb = f.put("sa.nc.in0", f.normal((4, 3)))  # used as .t()
    f.put("sa.nc.out", sb.t().scatter_add(0, si0, ss0))
    s64 = f.put("sa.x64.in0", f.normal((3, 4), dtype=F64))
    ss64 = f.put("sa.x64.in2", f.normal((2, 4), dtype=F64))
    f.put("sa.x64.out", s64.scatter_add(0, si0, ss64))

    # embedding: table [6,3]
    w = f.put("emb.w.in0", f.normal((6, 3)))
    e2 = f.put("emb.idx2.in1", f.index((2, 4), 6))
    f.put("emb.idx2.out", F.embedding(e2, w))
    e1 = f.put("emb.idx1.in1", torch.tensor([5, 0, 0, 2, 5], dtype=torch.int64))
    f.put("emb.idx1.out", F.embedding(e1, w))

    # one_hot: 4 classes, as float32
    o1 = f.put("oh.idx1.in0", torch.tensor([0, 3, 1, 3, 2], dtype=torch.int64))
    f.put("oh.idx1.out", F.one_hot(o1, 4).to(F32))
    o2 = f.put("oh.idx2.in0", f.index((2, 3), 4))
    f.put("oh.idx2.out", F.one_hot(o2, 4).to(F32))
    return f


# ---------------------------------------------------------------- shape (views)
def gen_shape():
    f = Family("shape", 8)
    x = f.put("x.in0", f.normal((2, 3, 4)))
    f.put("transpose02.out", x.transpose(0, 2))
    f.put("t.out", x[0].t())
    f.put("permute201.out", x.permute(2, 0, 1))
    f.put("permute120.out", x.permute(1, 2, 0))
    f.put("narrow1.out", x.narrow(1, 1, 2))
    f.put("narrow_empty.out", x.narrow(2, 4, 0))
    f.put("slice2.out", x[:, :, 1:4:2])
    f.put("slice0.out", x[1:2, :, :])
    for i, p in enumerate(x.split(3, dim=2)):
        f.put(f"split.ax2.out{i}", p)
    for i, p in enumerate(x.chunk(2, dim=1)):
        f.put(f"chunk.ax1.out{i}", p)
    y = f.put("y.in0", f.normal((6, 2)))
    for i, p in enumerate(y.chunk(4, dim=0)):  # PyTorch returns 3 chunks of 2
        f.put(f"chunk4.out{i}", p)
    e = f.put("e.in0", f.normal((3, 1)))
    f.put("expand.out", e.expand(2, 3, 4))
    f.put("unsqueeze1.out", x.unsqueeze(1))
    f.put("unsqueeze3.out", x.unsqueeze(3))
    f.put("reshape.out", x.reshape(4, 6))
    # reshape of a non-contiguous view copies
    f.put("reshape_nc.out", x.transpose(0, 2).reshape(6, 4))
    f.put("flatten.out", x.flatten(1))
    f.put("flatten_nc.out", x.transpose(1, 2).flatten(1))
    f.put("contiguous_nc.out", x.permute(2, 0, 1).contiguous())
    # views of views: x.transpose(0,2)[1:3].permute(...) etc.
    f.put("chain.out", x.transpose(0, 2)[1:4:2].narrow(2, 1, 1).permute(2, 0, 1))
    # cat / stack
    c = f.put("c.in0", f.normal((2, 2, 4)))
    f.put("cat.ax1.out", torch.cat([x, c, x[:, :0, :]], dim=1))
    z = f.put("z.in0", f.normal((2, 3, 4)))
    f.put("cat.ax0.out", torch.cat([x, z], dim=0))
    f.put("cat.ax2.out", torch.cat([x, z, x], dim=2))
    f.put("cat.nc.out", torch.cat([x.transpose(0, 2), z.transpose(0, 2)], dim=1))
    s = [f.put(f"s{i}.in0", f.normal((2, 3))) for i in range(3)]
    f.put("stack.ax0.out", torch.stack(s, 0))
    f.put("stack.ax1.out", torch.stack(s, 1))
    f.put("stack.ax2.out", torch.stack(s, 2))
    f.put("stack.nc.out", torch.stack([p.t() for p in s], 0))
    x64 = f.put("x64.in0", f.normal((2, 3, 4), dtype=F64))
    f.put("x64.reshape_nc.out", x64.transpose(0, 2).reshape(6, 4))
    f.put("x64.cat.out", torch.cat([x64, x64.narrow(1, 0, 1)], dim=1))
    return f


# ---------------------------------------------------------------- conv
def gen_conv():
    f = Family("conv", 9)

    def case(name, x, w, view=None, **kw):
        f.put(f"{name}.in0", x)
        f.put(f"{name}.in1", w)
        if view:
            x = view(x)
        f.put(f"{name}.out", F.conv2d(x, w, **kw))

    case("basic", f.normal((2, 3, 5, 5)), f.normal((4, 3, 3, 3)))
    case("stride_pad", f.normal((1, 2, 6, 7)), f.normal((3, 2, 3, 3)), stride=2, padding=1)
    case("dilation", f.normal((1, 2, 7, 7)), f.normal((2, 2, 3, 3)), padding=2, dilation=2)
    case("groups", f.normal((1, 4, 5, 5)), f.normal((6, 2, 3, 3)), groups=2)
    case("depthwise", f.normal((2, 3, 5, 5)), f.normal((3, 1, 3, 3)), padding=1, groups=3)
    case("asym", f.normal((1, 2, 5, 6)), f.normal((2, 2, 2, 3)), stride=(1, 2), padding=(2, 0))
    case("k1", f.normal((2, 3, 4, 4)), f.normal((5, 3, 1, 1)))
    # non-contiguous: x stored [2,5,5,3] (NHWC) used as x.permute(0,3,1,2)
    case("nc", f.normal((2, 5, 5, 3)), f.normal((4, 3, 3, 3)), view=lambda x: x.permute(0, 3, 1, 2), padding=1)
    xn = f.normal((1, 2, 5, 5))
    xn[0, 1, 2, 2] = NAN
    xn[0, 0, 0, 4] = INF
    case("nan", xn, f.uniform((2, 2, 3, 3), 0.1, 1.0))
    case("empty", torch.zeros(0, 3, 5, 5), f.normal((4, 3, 3, 3)))
    case("f64", f.normal((1, 2, 5, 5), dtype=F64), f.normal((3, 2, 3, 3), dtype=F64), padding=1)
    # bias: F.conv2d(x, w, b) == add_channel_bias(conv2d(x, w), b)
    x = f.put("bias.in0", f.normal((2, 3, 4, 4)))
    w = f.put("bias.in1", f.normal((4, 3, 3, 3)))
    b = f.put("bias.in2", f.normal((4,)))
    f.put("bias.out", F.conv2d(x, w, b, padding=1))
    # conv1d
    x1 = f.put("c1.x.in0", f.normal((2, 3, 10)))
    w1 = f.put("c1.x.in1", f.normal((4, 3, 3)))
    f.put("c1.x.out", F.conv1d(x1, w1, stride=2, padding=1))
    w1d = f.put("c1.dil.in1", f.normal((2, 3, 3)))
    f.put("c1.dil.out", F.conv1d(x1, w1d, padding=2, dilation=2))
    x1g = f.put("c1.groups.in0", f.normal((1, 4, 8)))
    w1g = f.put("c1.groups.in1", f.normal((2, 2, 3)))
    f.put("c1.groups.out", F.conv1d(x1g, w1g, groups=2))
    return f


# ---------------------------------------------------------------- pool
def gen_pool():
    f = Family("pool", 10)

    def both(name, x, view=None, **kw):
        """max and avg pooling with the same window options (avg ignores dilation)."""
        f.put(f"{name}.in0", x)
        if view:
            x = view(x)
        f.put(f"max.{name}.out", F.max_pool2d(x, **kw))
        kw.pop("dilation", None)
        f.put(f"avg.{name}.out", F.avg_pool2d(x, **kw))

    x = f.normal((2, 3, 6, 6))
    both("k2", x, kernel_size=2)
    both("k3s2p1", f.normal((1, 2, 7, 7)), kernel_size=3, stride=2, padding=1)
    both("ceil", f.normal((1, 2, 7, 7)), kernel_size=3, stride=2, padding=1, ceil_mode=True)
    both("asym", f.normal((1, 1, 5, 7)), kernel_size=(2, 3), stride=(1, 2), padding=(1, 0))
    # non-contiguous: stored [2,6,6,3] used as x.permute(0,3,1,2)
    both("nc", f.normal((2, 6, 6, 3)), view=lambda x: x.permute(0, 3, 1, 2), kernel_size=2)
    xs = f.normal((1, 1, 4, 4))
    xs[0, 0, 0, 0] = NAN
    xs[0, 0, 1, 3] = INF
    xs[0, 0, 3, 0] = -INF
    xs[0, 0, 2:4, 2:4] = -INF
    both("special", xs, kernel_size=2)
    both("empty", torch.zeros(0, 2, 4, 4), kernel_size=2)
    both("f64", f.normal((1, 2, 6, 6), dtype=F64), kernel_size=3, stride=1, padding=1)
    # max only: dilation
    xd = f.put("dil.in0", f.normal((1, 2, 7, 7)))
    f.put("max.dil.out", F.max_pool2d(xd, kernel_size=3, stride=1, padding=1, dilation=2))
    # avg only: count_include_pad=False
    xp = f.put("nopad.in0", f.normal((1, 2, 5, 5)))
    f.put("avg.nopad.out", F.avg_pool2d(xp, kernel_size=3, stride=2, padding=1, count_include_pad=False))
    f.put("avg.nopad_ceil.out", F.avg_pool2d(xp, 2, 2, 1, ceil_mode=True, count_include_pad=False))
    f.put("avg.pad_ceil.out", F.avg_pool2d(xp, 2, 2, 1, ceil_mode=True, count_include_pad=True))
    # 1-d pooling: [2,3,10]
    x1 = f.put("p1.in0", f.normal((2, 3, 10)))
    f.put("max1.k3s2p1.out", F.max_pool1d(x1, 3, 2, 1))
    f.put("avg1.k3s2p1.out", F.avg_pool1d(x1, 3, 2, 1))
    f.put("max1.k2.out", F.max_pool1d(x1, 2, 2, 0))
    f.put("avg1.k2.out", F.avg_pool1d(x1, 2, 2, 0))
    return f


# ---------------------------------------------------------------- create / cast
def gen_create():
    f = Family("create", 11)
    f.put("zeros.out", torch.zeros(2, 3))
    f.put("ones.out", torch.ones(2, 3))
    f.put("full.out", torch.full((2, 3), 2.5))
    f.put("zeros_empty.out", torch.zeros(0, 3))
    f.put("full64.out", torch.full((2, 3), 0.1, dtype=F64))
    # arange(start, end, step): the Rust test repeats the arguments
    f.put("arange.a.out", torch.arange(0.0, 5.0, 1.0))
    f.put("arange.b.out", torch.arange(1.0, 2.5, 0.5))
    f.put("arange.c.out", torch.arange(-1.0, 1.0, 0.3))
    f.put("arange.d.out", torch.arange(10.0, 0.0, -3.0))
    f.put("arange.e.out", torch.arange(0.0, 0.0, 1.0))
    f.put("arange.f.out", torch.arange(0.0, 1.0, 0.1))
    f.put("arange.g64.out", torch.arange(0.0, 1.0, 0.1, dtype=F64))
    # linspace(start, end, steps)
    f.put("linspace.a.out", torch.linspace(0.0, 1.0, 5))
    f.put("linspace.b.out", torch.linspace(-1.0, 1.0, 7))
    f.put("linspace.c.out", torch.linspace(0.0, 1.0, 1))
    f.put("linspace.d.out", torch.linspace(2.0, 3.0, 0))
    f.put("linspace.e.out", torch.linspace(0.0, 10.0, 4))
    f.put("linspace.f.out", torch.linspace(3.0, -2.0, 11))
    f.put("linspace.g64.out", torch.linspace(0.0, 1.0, 7, dtype=F64))
    # eye
    f.put("eye.3x4.out", torch.eye(3, 4))
    f.put("eye.4x2.out", torch.eye(4, 2))
    f.put("eye.3x3_64.out", torch.eye(3, dtype=F64))

    # casts: float32 source with rounding ties, overflow, subnormals and specials
    src = t(
        [
            1.0,
            1.0 + 2.0**-11,  # f16 tie -> 1.0 (even)
            1.0 + 3 * 2.0**-11,  # f16 tie -> up (even)
            1.0 + 2.0**-8,  # bf16 tie -> 1.0 (even)
            1.0 + 3 * 2.0**-8,  # bf16 tie -> up (even)
            0.1,
            -0.1,
            1.0 / 3.0,
            65504.0,  # f16 max
            65519.0,  # rounds down to 65504 in f16
            65520.0,  # overflows to inf in f16
            70000.0,
            1e-7,  # f16 subnormal
            1e-8,  # f16 underflow to 0
            3.0e38,  # bf16 rounds to inf? (largest bf16 is ~3.39e38)
            -2.7,
            2.5,
            -0.0,
            NAN,
            INF,
            -INF,
            1e-40,  # f32 subnormal
            123456.789,
            -65536.5,
        ]
    )
    f.put("cast.f32.in0", src)
    f.put("cast.f32_f16.out", src.to(torch.float16))
    f.put("cast.f32_bf16.out", src.to(torch.bfloat16))
    f.put("cast.f32_f64.out", src.to(F64))
    f.put("cast.f16_f32.out", src.to(torch.float16).to(F32))
    f.put("cast.bf16_f32.out", src.to(torch.bfloat16).to(F32))
    finite = src[torch.isfinite(src)]
    f.put("cast.f32_finite.in0", finite)
    f.put("cast.f32_i64.out", finite.clamp(-1e9, 1e9).to(torch.int64))  # truncation toward zero
    f.put("cast.f32_bool.out", src.to(torch.bool))  # NAN is true
    src64 = t(
        [
            0.1,
            1.0 / 3.0,
            1e-40,
            1e300,
            -1e300,
            1.0 + 2.0**-24,  # f32 tie -> 1.0
            1.0 + 3 * 2.0**-24,  # f32 tie -> up
            # f16/bf16 double-rounding probes: just above a half-type tie, but
            # within f32 precision of it. PyTorch converts float64 to half types
            # through float32, so these round to the even neighbour (down).
            1.0 + 2.0**-11 + 2.0**-40,
            1.0 + 2.0**-8 + 2.0**-40,
        ],
        F64,
    )
    f.put("cast.f64.in0", src64)
    f.put("cast.f64_f32.out", src64.to(F32))
    f.put("cast.f64_f16.out", src64.to(torch.float16))
    f.put("cast.f64_bf16.out", src64.to(torch.bfloat16))
    # 2**62 + 2**38 + 1 lies just above a float32 tie; int64 -> float32 rounds it
    # once (up), while going through float64 first would land on the tie (down).
    ints = [-3, 0, 7, 2**40, 2**53 + 1, 2**62 + 2**38 + 1]
    idx = f.put("cast.i64.in0", torch.tensor(ints, dtype=torch.int64))
    f.put("cast.i64_f32.out", idx.to(F32))
    f.put("cast.i64_f64.out", idx.to(F64))
    mask = f.put("cast.bool.in0", torch.tensor([True, False, True]))
    f.put("cast.bool_f32.out", mask.to(F32))
    return f


# ---------------------------------------------------------------- attention
def gen_attention():
    f = Family("attention", 12)
    q = f.put("q.in0", f.normal((2, 3, 4, 8)))
    k = f.put("k.in0", f.normal((2, 3, 5, 8)))
    v = f.put("v.in0", f.normal((2, 3, 5, 6)))
    sdpa = F.scaled_dot_product_attention
    f.put("plain.out", sdpa(q, k, v))
    # is_causal with 4 queries over 5 keys: key j is hidden from query i when j > i.
    f.put("causal.out", sdpa(q, k, v, is_causal=True))
    f.put("scale.out", sdpa(q, k, v, scale=0.3))
    # An additive [4, 5] mask broadcast over batch and heads, -inf hiding some keys.
    mask = f.normal((4, 5))
    mask[0, 1] = -INF
    mask[2, 0] = -INF
    mask[2, 4] = -INF
    f.put("mask.in0", mask)
    f.put("mask.out", sdpa(q, k, v, attn_mask=mask))
    f.put("mask_causal.out", sdpa(q, k, v, attn_mask=mask + torch.zeros(4, 5).masked_fill(
        torch.ones(4, 5, dtype=torch.bool).triu(1), -INF)))
    # Self-attention heads as views of one packed projection [2, 4, 3 * 24]:
    # the test splits it as q, k, v = y.narrow(2, i * 24, 24).reshape(2, 4, 3, 8).transpose(1, 2).
    y = f.put("packed.in0", f.normal((2, 4, 72)))
    qs, ks, vs = (y.narrow(2, i * 24, 24).reshape(2, 4, 3, 8).transpose(1, 2) for i in range(3))
    f.put("packed.out", sdpa(qs, ks, vs))
    f.put("packed_causal.out", sdpa(qs, ks, vs, is_causal=True))
    # Gradients of (out * g).sum() with respect to q, k, v and the mask.
    qg, kg, vg, mg = (x.clone().requires_grad_() for x in (q, k, v, mask))
    g = f.put("grad.in0", f.normal((2, 3, 4, 6)))
    (sdpa(qg, kg, vg, attn_mask=mg) * g).sum().backward()
    for name, x in (("q", qg), ("k", kg), ("v", vg), ("mask", mg)):
        f.put(f"grad.{name}.out", x.grad)
    # float64
    q64, k64, v64 = (f.put(f"{n}64.in0", f.normal(s, 1.0, F64)) for n, s in
                     (("q", (1, 2, 3, 4)), ("k", (1, 2, 6, 4)), ("v", (1, 2, 6, 5))))
    f.put("f64.out", sdpa(q64, k64, v64))
    f.put("f64_causal.out", sdpa(q64, k64, v64, is_causal=True))
    return f


# ---------------------------------------------------------------- cumsum
def gen_cumsum():
    f = Family("cumsum", 13)

    def case(name, x, dims):
        for d in dims:
            f.put(f"cumsum.{name}.ax{d}.out", torch.cumsum(x, d))

    case("x", f.put("x.in0", f.normal((3, 4), 2.0)), [0, 1])
    case("x3", f.put("x3.in0", f.normal((2, 3, 4), 2.0)), [0, 1, 2])
    # non-contiguous: stored [4,3], the test uses base.t()
    case("nc", f.put("nc.in0", f.normal((4, 3), 2.0)).t(), [0, 1])
    # Inf and NaN propagate along the lane only.
    case("special", f.put("special.in0", t([[1.0, INF, -INF, 2.0], [NAN, 1.0, 2.0, 3.0]])), [1])
    case("empty", f.put("empty.in0", torch.zeros(0, 3)), [0, 1])
    case("x64", f.put("x64.in0", f.normal((3, 5), 2.0, F64)), [1])
    # Long lanes in half types: PyTorch's CPU kernel accumulates in float32.
    case("f16", f.put("f16.in0", f.uniform((2, 300), 0.0, 2.0, torch.float16)), [1])
    case("bf16", f.put("bf16.in0", f.uniform((2, 300), 0.0, 2.0, torch.bfloat16)), [1])
    # Gradient of sum(cumsum(x, d) * w) for each axis of x3.
    x3 = f.tensors["x3.in0"]
    w = f.put("grad.in1", f.normal((2, 3, 4)))
    for d in range(3):
        xg = x3.clone().requires_grad_()
        (torch.cumsum(xg, d) * w).sum().backward()
        f.put(f"grad.ax{d}.out", xg.grad)
    return f


# ---------------------------------------------------------------- rearrange
def gen_rearrange():
    """tril/triu, roll, repeat_interleave, pad, pixel_shuffle/unshuffle and
    interpolate: outputs, and the gradient of `sum(y * w)` for a fixed
    random `w` (key `<case>.grad`, w stored as `<case>.w`)."""
    f = Family("rearrange", 14)

    def case(name, x, fn):
        xg = x.clone().requires_grad_()
        y = fn(xg)
        f.put(f"{name}.out", y.detach())
        w = f.put(f"{name}.w", f.normal(tuple(y.shape)))
        (y * w).sum().backward()
        f.put(f"{name}.grad", xg.grad)

    m = f.put("m.in0", f.normal((2, 3, 4)))
    for k in (-1, 0, 2):
        case(f"tril.k{k}", m, lambda x: torch.tril(x, k))
        case(f"triu.k{k}", m, lambda x: torch.triu(x, k))
    # NaN and Inf above the diagonal become 0.
    sp = f.put("special.in0", t([[1.0, NAN, INF], [2.0, 3.0, -INF], [NAN, 4.0, 5.0]]))
    f.put("tril.special.out", torch.tril(sp))
    f.put("triu.special.out", torch.triu(sp, 1))
    v = f.put("v.in0", f.normal((3, 5)))
    for shift in (2, -1, 7, 0):
        case(f"roll.ax1.s{shift}", v, lambda x: torch.roll(x, shift, 1))
    case("roll.ax0.s1", v, lambda x: torch.roll(x, 1, 0))
    case("repeat.ax1.r3", v, lambda x: torch.repeat_interleave(x, 3, 1))
    case("repeat.ax0.each", v, lambda x: torch.repeat_interleave(x, torch.tensor([2, 0, 1]), 0))
    img = f.put("img.in0", f.normal((2, 3, 4, 5)))
    for mode in ("constant", "reflect", "replicate", "circular"):
        kw = {"value": 1.5} if mode == "constant" else {}
        # F.pad lists the last axis first: (left, right, top, bottom)
        case(f"pad.{mode}", img, lambda x: F.pad(x, (2, 3, 1, 2), mode=mode, **kw))
    ps = f.put("ps.in0", f.normal((2, 8, 3, 2)))
    case("pixel_shuffle.r2", ps, lambda x: F.pixel_shuffle(x, 2))
    pu = f.put("pu.in0", f.normal((2, 2, 4, 6)))
    case("pixel_unshuffle.r2", pu, lambda x: F.pixel_unshuffle(x, 2))
    # interpolate: sizes up and down, scale factors (integer and not),
    # bilinear with and without align_corners.
    modes = {
        "nearest": dict(mode="nearest"),
        "nearest_exact": dict(mode="nearest-exact"),
        "bilinear": dict(mode="bilinear", align_corners=False),
        "bilinear_ac": dict(mode="bilinear", align_corners=True),
    }
    for mname, kw in modes.items():
        case(f"interp.{mname}.size_up", img, lambda x: F.interpolate(x, size=(7, 9), **kw))
        case(f"interp.{mname}.size_down", img, lambda x: F.interpolate(x, size=(3, 2), **kw))
        case(f"interp.{mname}.scale2", img, lambda x: F.interpolate(x, scale_factor=2.0, **kw))
        case(f"interp.{mname}.scale1_7", img, lambda x: F.interpolate(x, scale_factor=(1.7, 0.6), **kw))
    return f


# ---------------------------------------------------------------- sort
def gen_sort():
    """sort/argsort (stable) and topk along each axis, NaN and ties, and the
    gradient of `sum(values * w)` (`<case>.grad`, w stored as `<case>.w`)."""
    f = Family("sort", 15)
    x = f.put("x.in0", f.normal((3, 4, 5)))
    for d in range(3):
        for desc in (False, True):
            name = f"sort.ax{d}.{'desc' if desc else 'asc'}"
            xg = x.clone().requires_grad_()
            v, i = torch.sort(xg, dim=d, descending=desc, stable=True)
            f.put(f"{name}.values", v.detach())
            f.put(f"{name}.indices", i)
            w = f.put(f"{name}.w", f.normal(tuple(v.shape)))
            (v * w).sum().backward()
            f.put(f"{name}.grad", xg.grad)
    for k, largest in ((2, True), (3, False), (5, True)):
        name = f"topk.k{k}.{'largest' if largest else 'smallest'}"
        xg = x.clone().requires_grad_()
        v, i = torch.topk(xg, k, dim=2, largest=largest, sorted=True)
        f.put(f"{name}.values", v.detach())
        f.put(f"{name}.indices", i)
        w = f.put(f"{name}.w", f.normal(tuple(v.shape)))
        (v * w).sum().backward()
        f.put(f"{name}.grad", xg.grad)
    # NaN sorts above every number; ties keep their order (stable).
    sp = f.put("special.in0", t([[2.0, NAN, -1.0, INF, 2.0, -INF, 0.0, NAN], [1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 3.0, -2.0]]))
    for desc in (False, True):
        v, i = torch.sort(sp, dim=1, descending=desc, stable=True)
        tag = "desc" if desc else "asc"
        f.put(f"special.{tag}.values", v)
        f.put(f"special.{tag}.indices", i)
    return f


def gen_einsum():
    """einsum of one and two operands: `<case>.out`, and the gradients of
    `sum(out * w)` (`<case>.w`) as `<case>.grad0` / `<case>.grad1`."""
    f = Family("einsum", 16)
    cases = [
        ("matmul", "ij,jk->ik", [(3, 4), (4, 5)]),
        ("bmm", "bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("scores", "bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),
        ("rowdot", "ij,ij->i", [(3, 4), (3, 4)]),
        ("outer", "i,j->ij", [(3,), (4,)]),
        ("summed_first", "bij,jk->bk", [(2, 3, 4), (4, 5)]),
        ("implicit", "ij,jk", [(3, 4), (4, 5)]),
        ("reorder", "ijk,kj->kij", [(2, 3, 4), (4, 3)]),
        ("transpose", "ij->ji", [(3, 4)]),
        ("reduce", "ijk->j", [(2, 3, 4)]),
        ("total", "ij->", [(3, 4)]),
        ("permute", "abc->cab", [(2, 3, 4)]),
    ]
    for name, eq, shapes in cases:
        xs = [f.put(f"{name}.in{i}", f.normal(sh)).clone().requires_grad_() for i, sh in enumerate(shapes)]
        out = torch.einsum(eq, *xs)
        f.put(f"{name}.out", out.detach())
        w = f.put(f"{name}.w", f.normal(tuple(out.shape)))
        (out * w).sum().backward()
        for i, x in enumerate(xs):
            f.put(f"{name}.grad{i}", x.grad)
    return f


def gen_int_reduce():
    """int64 sum, prod, amax and amin along each axis, keepdim and over
    everything, with values near the int64 limits (exact, and the sum and
    product wrap as PyTorch's do)."""
    f = Family("int_reduce", 17)
    x = f.put("x.in0", torch.randint(-50, 50, (3, 4, 5), generator=f.g, dtype=torch.int64))
    big = f.put("big.in0", torch.tensor([[2**62, 2**62, 3], [-(2**63), -1, 2**53 + 1]], dtype=torch.int64))
    small = f.put("small.in0", torch.randint(-3, 4, (2, 3, 4), generator=f.g, dtype=torch.int64))
    for name, v in (("x", x), ("big", big), ("small", small)):
        for op in ("sum", "prod", "amax", "amin"):
            fn = getattr(torch, op)
            for d in range(v.dim()):
                f.put(f"{name}.{op}.ax{d}", fn(v, dim=d))
                f.put(f"{name}.{op}.ax{d}.keep", fn(v, dim=d, keepdim=True))
            f.put(f"{name}.{op}.all", fn(v) if op in ("sum", "prod") else fn(v, dim=tuple(range(v.dim()))))
    return f


def main():
    families = [
        gen_unary,
        gen_binary,
        gen_cmp,
        gen_reduce,
        gen_softmax,
        gen_cumsum,
        gen_rearrange,
        gen_sort,
        gen_einsum,
        gen_int_reduce,
        gen_attention,
        gen_matmul,
        gen_index,
        gen_shape,
        gen_conv,
        gen_pool,
        gen_create,
    ]
    total = 0
    for gen in families:
        fam = gen()
        path = fam.save()
        size = path.stat().st_size
        total += size
        print(f"{path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}: "
              f"{len(fam.tensors)} tensors, {size} bytes")
    print(f"total {total} bytes (torch {torch.__version__})")
    assert total < 1_000_000, "fixtures should stay well under 1 MB"


if __name__ == "__main__":
    main()
