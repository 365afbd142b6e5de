"""Checkpoint interop fixtures: a zoo of PyTorch models whose safetensors
checkpoints must load strictly into their Forma twins and give PyTorch's
outputs, and the reverse check on files saved by Forma.

Writes:
  tools/fixtures/zoo/<model>.safetensors   each model's state_dict, as PyTorch saves it
  tools/fixtures/zoo_io.safetensors        `<model>.input` and `<model>.output` (PyTorch's forward)
  tools/fixtures/zoo_from_forma.safetensors
      for every file in tools/fixtures/zoo_forma/ (written by Forma: run
      `FORMA_WRITE_ZOO=1 cargo test -p forma-ui-tests --test checkpoint_zoo` first),
      the file is loaded into the PyTorch twin with `load_state_dict(strict=True)`
      and `<model>.output` records PyTorch's forward on `<model>.input` from zoo_io.
  tools/fixtures/bn_no_num_batches_tracked.safetensors
      a `BatchNorm2d(3)`'s state_dict without `num_batches_tracked`:
      `weight`, `bias`, `running_mean`, `running_var`, f32 [3]
  tools/fixtures/bn_no_num_batches_tracked_seq.safetensors
      the same for `Sequential(Conv2d(1, 3, 3), BatchNorm2d(3))`: `0.weight`
      [3, 1, 3, 3], `0.bias` [3], `1.weight`, `1.bias`, `1.running_mean`,
      `1.running_var` [3] (no `1.num_batches_tracked`)
  tools/fixtures/bn_no_num_batches_tracked_io.safetensors
      `bn.input` f32 [2, 3, 4, 4], `bn.output` [2, 3, 4, 4], `seq.input`
      [2, 1, 6, 6], `seq.output` [2, 3, 4, 4]: the eval-mode forward of a fresh
      model after `load_state_dict(load_file(<file>), strict=True)`;
      `bn.num_batches_tracked`, `seq.num_batches_tracked` int64 []: that
      buffer after the load (0). Its metadata records the torch version, that
      the strict load succeeded, and PyTorch's behaviour (checked by asserts
      in `bn_without_num_batches_tracked`): a missing `num_batches_tracked` is
      filled in only when the module's state_dict version metadata is absent
      (as for any dict read from a safetensors file) or below 2, and then with
      the module's *current* value (0 for a fresh module, not reset to 0 if it
      had counted batches); with version 2 metadata (the `_metadata` that
      `state_dict()` attaches) the strict load fails with the key missing.

Rerun: python3 tools/gen_checkpoint_fixtures.py [zoo] [bn_no_num_batches_tracked]
(no argument: both). Byte-identical on rerun on one machine; the float outputs
of the zoo may move by an ulp on another CPU, so regenerate only the part you
change.
"""
import math
import sys
from pathlib import Path

import torch
from torch import nn
from safetensors.torch import load_file, save_file

from fixture_file import OUT, FixtureFile, canonical_header

GEN = "tools/gen_checkpoint_fixtures.py"


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 10)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


class LeNet5(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool2 = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.pool1(self.act(self.conv1(x)))
        x = self.pool2(self.act(self.conv2(x)))
        x = self.flatten(x)
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


class BasicBlock(nn.Module):
    """torchvision's basic block; a projection shortcut when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 `Conv1D`: a linear layer with its weight stored [in, out]."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, n, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(3 * n, n)
        self.c_proj = Conv1D(n, n)

    def forward(self, x):
        b, t, n = x.shape
        q, k, v = self.c_attn(x).split(n, dim=2)
        split = lambda y: y.view(b, t, self.heads, n // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        scores = q @ k.transpose(-1, -2) / math.sqrt(n // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, n)
        return self.c_proj(y)


class GPT2MLP(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.c_fc = Conv1D(4 * n, n)
        self.c_proj = Conv1D(n, 4 * n)
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class GPT2Block(nn.Module):
    """One GPT-2 block with Hugging Face's key layout (`ln_1`, `attn.c_attn`, ...)."""

    def __init__(self, n=64, heads=4):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n)
        self.attn = GPT2Attention(n, heads)
        self.ln_2 = nn.LayerNorm(n)
        self.mlp = GPT2MLP(n)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Lstm(nn.Module):
    """`nn.LSTM` returning only its output sequence."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0]


def zoo():
    """name -> (constructor, input shape)"""
    return {
        "mlp": (Mlp, (4, 784)),
        "lenet5": (LeNet5, (2, 1, 28, 28)),
        "resnet_stack": (lambda: nn.Sequential(BasicBlock(16, 32, 2), BasicBlock(32, 32, 1)), (2, 16, 8, 8)),
        "encoder_layer": (
            lambda: nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True),
            (2, 5, 64),
        ),
        "gpt2_block": (GPT2Block, (2, 6, 64)),
        "lstm": (Lstm, (2, 5, 8)),
    }


def randomise(model, g):
    """Every parameter and float buffer random, so a wrong mapping shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 / math.sqrt(max(1, p.shape[-1]))))
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("num_batches_tracked"):
                b.fill_(7)


def save_sd(model, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, str(path), metadata={"format": "pt", "torch": torch.__version__, "generator": GEN})
    canonical_header(path)


def zoo_files():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    io = FixtureFile("zoo_io", 99)
    io.GENERATOR = GEN
    models = {}
    for name, (ctor, shape) in zoo().items():
        model = ctor().eval()
        randomise(model, g)
        x = torch.randn(shape, generator=g)
        with torch.no_grad():
            y = model(x)
        save_sd(model, OUT / "zoo" / f"{name}.safetensors")
        io.put(f"{name}.input", x)
        io.put(f"{name}.output", y)
        models[name] = model
    io.save()

    forma_dir = OUT / "zoo_forma"
    back = FixtureFile("zoo_from_forma", 7)
    back.GENERATOR = GEN
    found = sorted(forma_dir.glob("*.safetensors")) if forma_dir.exists() else []
    for path in found:
        name = path.stem
        model = zoo()[name][0]().eval()
        missing, unexpected = model.load_state_dict(load_file(str(path)), strict=True)
        assert not missing and not unexpected
        with torch.no_grad():
            back.put(f"{name}.output", model(io.tensors[f"{name}.input"]))
        print(f"{name}: Forma's file loaded strictly into PyTorch")
    if found:
        back.save()
    else:
        print("no Forma-saved files yet: run the Rust zoo test with FORMA_WRITE_ZOO=1, then rerun")


BN = "bn_no_num_batches_tracked"


def bn_without_num_batches_tracked():
    """BatchNorm checkpoints that lack `num_batches_tracked` (as written by
    exporters that skip integer buffers, or by PyTorch before the buffer
    existed), with what PyTorch does when loading them."""
    g = torch.Generator().manual_seed(5150)
    cases = {
        # name -> (constructor, input shape, checkpoint file, the BatchNorm's key prefix)
        "bn": (lambda: nn.BatchNorm2d(3), (2, 3, 4, 4), BN, ""),
        "seq": (lambda: nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3)), (2, 1, 6, 6), f"{BN}_seq", "1."),
    }
    io = {}
    for name, (ctor, shape, file, prefix) in cases.items():
        nbt = prefix + "num_batches_tracked"
        src = ctor().eval()
        randomise(src, g)  # its num_batches_tracked is 7
        sd = {k: v.detach().clone().contiguous() for k, v in src.state_dict().items() if k != nbt}
        assert len(sd) == len(src.state_dict()) - 1
        path = OUT / f"{file}.safetensors"
        save_file(sd, str(path), metadata={"format": "pt", "torch": torch.__version__, "generator": GEN})
        canonical_header(path)

        # The file as any reader gives it back: a plain dict, no `_metadata`.
        loaded = load_file(str(path))
        assert not hasattr(loaded, "_metadata") and nbt not in loaded
        model = ctor().eval()
        result = model.load_state_dict(loaded, strict=True)
        assert not result.missing_keys and not result.unexpected_keys, result
        buffers = dict(model.named_buffers())
        assert buffers[nbt].dtype == torch.int64 and buffers[nbt].shape == () and buffers[nbt].item() == 0
        for k, v in sd.items():
            assert torch.equal(model.state_dict()[k], v), k
        x = torch.randn(shape, generator=g)
        with torch.no_grad():
            y = model(x)
            assert torch.equal(y, src(x)), "eval mode does not read num_batches_tracked"
        io[f"{name}.input"] = x
        io[f"{name}.output"] = y
        io[f"{name}.num_batches_tracked"] = buffers[nbt].clone()

        # The fill is the module's current value, not a reset to 0.
        counted = ctor().eval()
        dict(counted.named_buffers())[nbt].fill_(5)
        assert not any(counted.load_state_dict(load_file(str(path)), strict=True))
        assert dict(counted.named_buffers())[nbt].item() == 5

        # With `state_dict()`'s version metadata (BatchNorm's is 2) the key is required.
        versioned = ctor().state_dict()
        del versioned[nbt]
        assert versioned._metadata[prefix.rstrip(".")]["version"] == 2
        try:
            ctor().load_state_dict(versioned, strict=True)
            raise AssertionError("a version-2 state_dict without num_batches_tracked loaded strictly")
        except RuntimeError as e:
            assert f'Missing key(s) in state_dict: "{nbt}"' in str(e), e
        result = ctor().load_state_dict(versioned, strict=False)
        assert result.missing_keys == [nbt] and not result.unexpected_keys, result
        # Version 1 (older PyTorch) is filled in like no version at all.
        versioned._metadata[prefix.rstrip(".")]["version"] = 1
        old = ctor()
        assert not any(old.load_state_dict(versioned, strict=True))
        assert dict(old.named_buffers())[nbt].item() == 0
        print(f"{file}.safetensors: loads strictly, num_batches_tracked = 0 afterwards")

    path = OUT / f"{BN}_io.safetensors"
    meta = {
        "torch": torch.__version__,
        "generator": GEN,
        "load_state_dict": "strict=True succeeds: missing_keys=[] unexpected_keys=[]",
        "num_batches_tracked_after_load": "0",
        "pytorch_behaviour": (
            "BatchNorm (_version 2) fills a missing num_batches_tracked only when the state_dict's version "
            "metadata for the module is absent (a plain dict, e.g. read from safetensors) or < 2, and then "
            "with the module's current value (a fresh module: 0; one that had counted 5 batches keeps 5); "
            "with version 2 metadata (state_dict()'s _metadata) strict=True raises 'Missing key(s) in "
            "state_dict' and strict=False lists it in missing_keys"
        ),
    }
    save_file(io, str(path), metadata=meta)
    canonical_header(path)


PARTS = {"zoo": zoo_files, BN: bn_without_num_batches_tracked}


def main():
    parts = sys.argv[1:] or list(PARTS)
    unknown = [p for p in parts if p not in PARTS]
    assert not unknown, f"unknown part(s) {unknown}; choose from {list(PARTS)}"
    for part in parts:
        PARTS[part]()


if __name__ == "__main__":
    main()
