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

Rerun: python3 tools/gen_checkpoint_fixtures.py   (byte-identical on rerun)
"""
import math
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


def main():
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


if __name__ == "__main__":
    main()
