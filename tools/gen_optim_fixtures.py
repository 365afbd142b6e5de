#!/usr/bin/env python3
"""Writes the PyTorch golden values of the optimizer, gradient-clipping,
scheduler and training suites (`tests/suite/nn_optim_parity.rs`,
`tests/suite/nn_train_parity.rs`).

Run from the repository root:

    python3 tools/gen_optim_fixtures.py

Needs `torch`, `safetensors` and `numpy`. It writes
`tools/fixtures/optim.safetensors` (metadata: the torch version and this
generator) and prints its size.

Conventions (mirrored by the Rust tests; change both together):

- The small model is `Linear(4, 3) -> tanh -> Linear(3, 2)` with fields
  `fc1`, `fc2`; its initial parameters are `model.<name>` (f32), the input
  `data.x` [5, 4] and the target `data.t` [5, 2]; the loss is
  `((model(x) - t) ** 2).mean()`.
- `optim.<case>.params` [10, 23]: every parameter, flattened in state_dict
  order (fc1.weight, fc1.bias, fc2.weight, fc2.bias) and concatenated, after
  each of 10 steps (zero_grad, loss, backward, step); `optim.<case>.loss`
  [10]: the loss before each step. The options of each case are in `CASES`
  below and again in the Rust test.
- `clip.grads` [23]: the gradients of one backward from the initial
  parameters; `clip.<case>.total` (scalar) and `clip.<case>.grads` [23]
  after `clip_grad_norm_` / `clip_grad_value_`.
- `sched.<case>.lr` [31, 2] (f64): both groups' learning rates after
  construction and after each of 30 scheduler steps (initial lrs 0.1 and
  0.05); `sched.<case>.momentum` [31, 2] for the 1cycle cases (SGD's
  `momentum` or Adam's `beta1`).
- `train.*`: a full run of an MLP 8 -> 16 -> ReLU -> 3 (fields `fc1`, `fc2`)
  on `train.x` [96, 8] / `train.y` [96] (int64 classes) with cross-entropy,
  minibatches of 16 in the order `train.perm` [5, 96] (one permutation per
  epoch), 5 epochs; `train.<opt>.epoch_loss` [5]: the mean of the batch
  losses of each epoch; `train.<opt>.final.<name>`: the parameters at the end.

Everything runs in float32 on the CPU with the default single-tensor
(`foreach=False`) optimizer path, one thread.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from fixture_file import FixtureFile

F32 = torch.float32
F64 = torch.float64

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class Optim(FixtureFile):
    GENERATOR = "tools/gen_optim_fixtures.py"

    def normal(self, shape, scale=1.0):
        return (torch.randn(shape, generator=self.g, dtype=F64) * scale).to(F32)

    def uniform(self, shape, bound):
        return ((torch.rand(shape, generator=self.g, dtype=F64) * 2 - 1) * bound).to(F32)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model):
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()])


def load(model, init):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])


# Each case: the optimizer class and its options; a list of options means
# two groups (fc1's parameters, then fc2's).
CASES = {
    "sgd_plain": (torch.optim.SGD, dict(lr=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "sgd_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "sgd_dampening": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.3)),
    "sgd_weight_decay": (torch.optim.SGD, dict(lr=0.1, momentum=0.5, weight_decay=0.01)),
    "sgd_maximize": (torch.optim.SGD, dict(lr=0.05, momentum=0.5, maximize=True)),
    "adam_plain": (torch.optim.Adam, dict(lr=0.01)),
    "adam_amsgrad": (torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    "adam_weight_decay": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
    "adam_betas": (torch.optim.Adam, dict(lr=0.02, betas=(0.5, 0.9), eps=1e-6)),
    "adamw": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    "adamw_amsgrad": (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.05, amsgrad=True, betas=(0.8, 0.99))),
    "rmsprop_plain": (torch.optim.RMSprop, dict(lr=0.01)),
    "rmsprop_centered": (torch.optim.RMSprop, dict(lr=0.01, centered=True)),
    "rmsprop_momentum": (torch.optim.RMSprop, dict(lr=0.01, momentum=0.9)),
    "rmsprop_all": (torch.optim.RMSprop, dict(lr=0.005, alpha=0.9, centered=True, momentum=0.5, weight_decay=0.01)),
    "adagrad_plain": (torch.optim.Adagrad, dict(lr=0.1)),
    "adagrad_all": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1)),
    "sgd_groups": (torch.optim.SGD, [dict(lr=0.1, momentum=0.9, weight_decay=0.01), dict(lr=0.05, momentum=0.9)]),
    "adam_groups": (torch.optim.Adam, [dict(lr=0.01, weight_decay=0.1), dict(lr=0.03)]),
}


def gen_optim(fx):
    model = Small()
    init = {
        "fc1.weight": fx.uniform((3, 4), 0.5),
        "fc1.bias": fx.uniform((3,), 0.5),
        "fc2.weight": fx.uniform((2, 3), 0.6),
        "fc2.bias": fx.uniform((2,), 0.6),
    }
    x = fx.normal((5, 4))
    t = fx.normal((5, 2))
    for k, v in init.items():
        fx.put(f"model.{k}", v)
    fx.put("data.x", x)
    fx.put("data.t", t)

    def loss_of(m):
        return ((m(x) - t) ** 2).mean()

    for case, (cls, opts) in CASES.items():
        load(model, init)
        if isinstance(opts, list):
            groups = [
                dict(params=list(model.fc1.parameters()), **opts[0]),
                dict(params=list(model.fc2.parameters()), **opts[1]),
            ]
            opt = cls(groups, foreach=False)
        else:
            opt = cls(model.parameters(), foreach=False, **opts)
        params, losses = [], []
        for _ in range(10):
            opt.zero_grad()
            loss = loss_of(model)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            params.append(flat_params(model))
        fx.put(f"optim.{case}.params", torch.stack(params))
        fx.put(f"optim.{case}.loss", torch.stack(losses))

    # Gradient clipping, from one backward at the initial parameters.
    def fresh_grads():
        load(model, init)
        model.zero_grad()
        loss_of(model).backward()

    fresh_grads()
    fx.put("clip.grads", flat_grads(model))
    for case, max_norm, norm_type in [
        ("norm2", 0.5, 2.0),
        ("inf", 0.1, float("inf")),
        ("p1_5", 0.3, 1.5),
        ("unclipped", 100.0, 2.0),
    ]:
        fresh_grads()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type, foreach=False)
        fx.put(f"clip.{case}.total", total)
        fx.put(f"clip.{case}.grads", flat_grads(model))
    fresh_grads()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.05, foreach=False)
    fx.put("clip.value.grads", flat_grads(model))


def sched_optimizer(cls=torch.optim.SGD, **extra):
    a = torch.zeros(1, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    return cls([dict(params=[a], lr=0.1), dict(params=[b], lr=0.05)], foreach=False, **extra)


def gen_sched(fx):
    S = torch.optim.lr_scheduler

    def run(case, opt, step, track_momentum=None, steps=30):
        lrs = [list(map(float, [g["lr"] for g in opt.param_groups]))]
        moms = [track_momentum(opt)] if track_momentum else None
        for _ in range(steps):
            opt.step()
            step()
            lrs.append([float(g["lr"]) for g in opt.param_groups])
            if track_momentum:
                moms.append(track_momentum(opt))
        fx.put(f"sched.{case}.lr", torch.tensor(lrs, dtype=F64))
        if track_momentum:
            fx.put(f"sched.{case}.momentum", torch.tensor(moms, dtype=F64))

    def single(case, make, **kw):
        opt = sched_optimizer(**kw.pop("opt", {}))
        s = make(opt)
        run(case, opt, s.step, **kw)
        # get_last_lr() agrees with the groups.
        assert s.get_last_lr() == [g["lr"] for g in opt.param_groups]

    single("step", lambda o: S.StepLR(o, step_size=7, gamma=0.5))
    single("multistep", lambda o: S.MultiStepLR(o, milestones=[5, 12, 12, 20], gamma=0.3))
    single("exponential", lambda o: S.ExponentialLR(o, gamma=0.9))
    single("cosine", lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=0.001))
    single("linear", lambda o: S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=8))
    single("linear_decay", lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=12))
    sgd_momentum = lambda o: [float(g["momentum"]) for g in o.param_groups]
    adam_beta1 = lambda o: [float(g["betas"][0]) for g in o.param_groups]
    single(
        "onecycle",
        lambda o: S.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=30),
        opt=dict(momentum=0.9),
        track_momentum=sgd_momentum,
    )
    single(
        "onecycle_three_phase",
        lambda o: S.OneCycleLR(
            o, max_lr=0.8, total_steps=30, pct_start=0.25, anneal_strategy="linear",
            div_factor=10.0, final_div_factor=100.0, three_phase=True,
            base_momentum=0.8, max_momentum=0.9,
        ),
        opt=dict(cls=torch.optim.Adam),
        track_momentum=adam_beta1,
    )
    single(
        "onecycle_no_momentum",
        lambda o: S.OneCycleLR(o, max_lr=0.3, total_steps=30, pct_start=0.4, cycle_momentum=False),
    )

    def warmup_cosine(o):
        return S.SequentialLR(
            o,
            [S.LinearLR(o, start_factor=0.1, total_iters=5), S.CosineAnnealingLR(o, T_max=20, eta_min=0.0)],
            milestones=[5],
        )

    single("warmup_cosine", warmup_cosine)

    def three(o):
        return S.SequentialLR(
            o,
            [S.LinearLR(o, start_factor=0.5, end_factor=1.0, total_iters=4), S.ExponentialLR(o, gamma=0.9), S.StepLR(o, step_size=3, gamma=0.5)],
            milestones=[4, 15],
        )

    single("sequential_three", three)

    # Two chainable schedulers on one optimizer, stepped one after the other.
    opt = sched_optimizer()
    a = S.StepLR(opt, step_size=4, gamma=0.5)
    b = S.ExponentialLR(opt, gamma=0.95)

    def both():
        a.step()
        b.step()

    run("chained", opt, both)


def gen_train(fx):
    n, epochs, batch = 96, 5, 16
    x = fx.normal((n, 8))
    teacher = fx.normal((8, 3))
    y = (x.to(F64) @ teacher.to(F64) + 0.5 * torch.randn((n, 3), generator=fx.g, dtype=F64)).argmax(1)
    perm = torch.stack([torch.randperm(n, generator=fx.g) for _ in range(epochs)])
    init = {
        "fc1.weight": fx.uniform((16, 8), 8 ** -0.5),
        "fc1.bias": fx.uniform((16,), 8 ** -0.5),
        "fc2.weight": fx.uniform((3, 16), 16 ** -0.5),
        "fc2.bias": fx.uniform((3,), 16 ** -0.5),
    }
    fx.put("train.x", x)
    fx.put("train.y", y)
    fx.put("train.perm", perm)
    for k, v in init.items():
        fx.put(f"train.init.{k}", v)
    for name, make in [
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False)),
        ("adam", lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False)),
    ]:
        model = Mlp()
        load(model, init)
        opt = make(model.parameters())
        epoch_loss = []
        for e in range(epochs):
            total = 0.0
            for b in range(n // batch):
                idx = perm[e, b * batch:(b + 1) * batch]
                opt.zero_grad()
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                opt.step()
                total += float(loss.detach())
            epoch_loss.append(total / (n // batch))
        fx.put(f"train.{name}.epoch_loss", torch.tensor(epoch_loss, dtype=F32))
        for k, p in model.named_parameters():
            fx.put(f"train.{name}.final.{k}", p.detach())


def main():
    fx = Optim("optim", seed=20240)
    gen_optim(fx)
    gen_sched(fx)
    gen_train(fx)
    path = fx.save()
    print(f"{path}: {path.stat().st_size} bytes, {len(fx.tensors)} tensors")


if __name__ == "__main__":
    main()
