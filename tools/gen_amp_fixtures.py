#!/usr/bin/env python3
"""Writes the PyTorch golden values of the mixed-precision suite
(`tests/suite/amp_parity.rs`): CPU autocast and GradScaler.

Run from the repository root:

    python3 tools/gen_amp_fixtures.py

Needs `torch`, `safetensors` and `numpy`. It writes
`tools/fixtures/amp.safetensors` (metadata: the torch version and this
generator) and prints its size.

Conventions (mirrored by the Rust tests; change both together). Every input
is f32; `<low>` is `bf16` or `f16`, the dtype of
`torch.autocast("cpu", dtype=...)`. Results of low-type tensors are stored
as f32 (exactly: each low value is an f32).

- `matmul.a` [3, 4, 40], `matmul.b` [3, 40, 6]; `matmul.<low>.out`:
  `(a @ b)` under autocast; `matmul.<low>.grad_a` / `grad_b`: the gradients
  of `(out * matmul.r).sum()` with `matmul.r` [3, 4, 6].
- `mlp.x` [8, 16], `mlp.t` [8, 4], `mlp.fc1.weight` [32, 16], `mlp.fc1.bias`,
  `mlp.fc2.weight` [4, 32], `mlp.fc2.bias`: `fc2(gelu(fc1(x)))`, the loss
  `mse_loss(out.float(), t)`; `mlp.<low>.out`, `mlp.<low>.loss` (scalar)
  and `mlp.<low>.grad.<param>` under autocast.
- `conv.x` [2, 3, 9, 9], `conv.weight` [8, 3, 3, 3], `conv.bias` [8]:
  `conv2d(x, w, b, padding=1)`; `conv.<low>.out`; `conv.<low>.grad_x`,
  `grad_weight`, `grad_bias` of `(out * conv.r).sum()`.
- `attn.q`, `attn.k`, `attn.v` [2, 2, 5, 8], `attn.r` [2, 2, 5, 8]:
  `scaled_dot_product_attention(q, k, v, is_causal=True)`; `attn.<low>.out`
  and `attn.<low>.grad_q/k/v` of `(out * r).sum()`.
- `nested.x` [4, 16] with the mlp's `fc1`: under bf16 autocast, `fc1(x)`
  inside `autocast(enabled=False)` gives `nested.inner` (f32 exact) and
  outside it `nested.outer` (bf16).
- `scaler.*`: a GradScaler run (init 2^16, growth 2 every 3 clean steps so
  growth is exercised in 100 steps, backoff 0.5) on the mlp in f32 with SGD
  (lr 0.01), batch `scaler.x` [8, 16] / `scaler.t` [8, 4]; at the steps
  listed in `scaler.inf_steps` (int64) the gradient of `fc1.weight[0, 0]` is
  set to inf (odd steps) or NaN (even steps) after backward.
  `scaler.scale` [100]: the scale after each `update()`;
  `scaler.skipped` [100] (1.0 when the step was skipped);
  `scaler.loss` [100]; `scaler.final.<param>`: the parameters at the end;
  `scaler.growth_tracker` (scalar): `_growth_tracker` at the end. The step
  clips the unscaled gradients to norm 1.0 (`unscale_`, then
  `clip_grad_norm_`, then `scaler.step`), as PyTorch's recipe says.
"""
import torch
import torch.nn.functional as F
from fixture_file import FixtureFile

F32 = torch.float32
F64 = torch.float64
LOWS = {"bf16": torch.bfloat16, "f16": torch.float16}

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class Amp(FixtureFile):
    GENERATOR = "tools/gen_amp_fixtures.py"

    def normal(self, shape, scale=1.0):
        return (torch.randn(shape, generator=self.g, dtype=F64) * scale).to(F32)


def leaf(t):
    return t.clone().requires_grad_(True)


def main():
    f = Amp("amp", seed=31)

    # matmul (batched, bmm-shaped)
    a, b, r = f.normal([3, 4, 40]), f.normal([3, 40, 6]), f.normal([3, 4, 6])
    f.put("matmul.a", a), f.put("matmul.b", b), f.put("matmul.r", r)
    for name, low in LOWS.items():
        la, lb = leaf(a), leaf(b)
        with torch.autocast("cpu", dtype=low):
            out = la @ lb
        assert out.dtype == low
        (out.float() * r).sum().backward()
        f.put(f"matmul.{name}.out", out.float())
        f.put(f"matmul.{name}.grad_a", la.grad)
        f.put(f"matmul.{name}.grad_b", lb.grad)

    # mlp: linear -> gelu -> linear, mse loss
    x, t = f.normal([8, 16]), f.normal([8, 4])
    params = {
        "fc1.weight": f.normal([32, 16], 0.25),
        "fc1.bias": f.normal([32], 0.1),
        "fc2.weight": f.normal([4, 32], 0.18),
        "fc2.bias": f.normal([4], 0.1),
    }
    f.put("mlp.x", x), f.put("mlp.t", t)
    for k, v in params.items():
        f.put(f"mlp.{k}", v)

    def mlp(p, x):
        h = F.linear(x, p["fc1.weight"], p["fc1.bias"])
        return F.linear(F.gelu(h), p["fc2.weight"], p["fc2.bias"])

    for name, low in LOWS.items():
        p = {k: leaf(v) for k, v in params.items()}
        with torch.autocast("cpu", dtype=low):
            out = mlp(p, x)
            loss = F.mse_loss(out.float(), t)
        assert out.dtype == low and loss.dtype == F32
        loss.backward()
        f.put(f"mlp.{name}.out", out.float())
        f.put(f"mlp.{name}.loss", loss.detach())
        for k, v in p.items():
            assert v.grad.dtype == F32
            f.put(f"mlp.{name}.grad.{k}", v.grad)

    # conv2d with bias
    cx, cw, cb = f.normal([2, 3, 9, 9]), f.normal([8, 3, 3, 3], 0.3), f.normal([8], 0.1)
    cr = f.normal([2, 8, 9, 9])
    f.put("conv.x", cx), f.put("conv.weight", cw), f.put("conv.bias", cb), f.put("conv.r", cr)
    for name, low in LOWS.items():
        lx, lw, lb = leaf(cx), leaf(cw), leaf(cb)
        with torch.autocast("cpu", dtype=low):
            out = F.conv2d(lx, lw, lb, padding=1)
        assert out.dtype == low
        (out.float() * cr).sum().backward()
        f.put(f"conv.{name}.out", out.float())
        f.put(f"conv.{name}.grad_x", lx.grad)
        f.put(f"conv.{name}.grad_weight", lw.grad)
        f.put(f"conv.{name}.grad_bias", lb.grad)

    # attention
    q, k, v, ar = (f.normal([2, 2, 5, 8]) for _ in range(4))
    for key, val in (("q", q), ("k", k), ("v", v), ("r", ar)):
        f.put(f"attn.{key}", val)
    for name, low in LOWS.items():
        lq, lk, lv = leaf(q), leaf(k), leaf(v)
        with torch.autocast("cpu", dtype=low):
            out = F.scaled_dot_product_attention(lq, lk, lv, is_causal=True)
        assert out.dtype == low
        (out.float() * ar).sum().backward()
        f.put(f"attn.{name}.out", out.float())
        for key, val in (("q", lq), ("k", lk), ("v", lv)):
            f.put(f"attn.{name}.grad_{key}", val.grad)

    # nested guards
    nx = f.normal([4, 16])
    f.put("nested.x", nx)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            inner = F.linear(nx, params["fc1.weight"], params["fc1.bias"])
        outer = F.linear(nx, params["fc1.weight"], params["fc1.bias"])
    assert inner.dtype == F32 and outer.dtype == torch.bfloat16
    f.put("nested.inner", inner)
    f.put("nested.outer", outer.float())

    # GradScaler over 100 steps with injected overflows
    sx, st = f.normal([8, 16]), f.normal([8, 4])
    f.put("scaler.x", sx), f.put("scaler.t", st)
    inf_steps = [0, 1, 2, 9, 17, 18, 40, 41, 70, 99]
    f.put("scaler.inf_steps", torch.tensor(inf_steps, dtype=torch.int64))
    p = {k: leaf(v) for k, v in params.items()}
    opt = torch.optim.SGD(p.values(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_factor=2.0,
                                  backoff_factor=0.5, growth_interval=3)
    scales, skipped, losses = [], [], []
    for step in range(100):
        opt.zero_grad()
        loss = F.mse_loss(mlp(p, sx), st)
        scaler.scale(loss).backward()
        if step in inf_steps:
            with torch.no_grad():
                p["fc1.weight"].grad[0, 0] = float("inf") if step % 2 else float("nan")
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        after = scaler.get_scale()
        skipped.append(1.0 if after < before else 0.0)
        scales.append(after)
        losses.append(loss.item())
    f.put("scaler.scale", torch.tensor(scales, dtype=F64))
    f.put("scaler.skipped", torch.tensor(skipped, dtype=F32))
    f.put("scaler.loss", torch.tensor(losses, dtype=F32))
    for k, v in p.items():
        f.put(f"scaler.final.{k}", v)
    f.put("scaler.growth_tracker", torch.tensor(float(scaler.state_dict()["_growth_tracker"]), dtype=F64))

    path = f.save()
    print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
