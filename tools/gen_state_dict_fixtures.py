#!/usr/bin/env python3
"""Writes the PyTorch module layouts the `nn` state-dict and repr tests compare
against: which keys `state_dict()` has, in which order, with which shapes and
dtypes, and what `print(model)` shows.

Run from the repository root:

    python3 tools/gen_state_dict_fixtures.py

Needs `torch` only. It writes `tools/fixtures/state_dicts.json` and prints
each model's key count. The file records `torch_version` (`torch.__version__`)
and `generator` ("tools/gen_state_dict_fixtures.py"), and under `models` one
entry per model:

    keys              [[key, [shape...], dtype], ...] in state_dict() order;
                      dtype is PyTorch's name without the `torch.` prefix
                      ("float32", "int64"), as `DType::torch_name` prints it
    named_parameters  [key, ...] in named_parameters() order
    named_buffers     [key, ...] in named_buffers() order
    num_parameters    sum of numel() over parameters()
    repr              str(model)

Only layouts are stored, no values, so the file is small. Every list keeps
PyTorch's order and the JSON objects are written in a fixed key order, so a
rerun writes identical bytes. The JSON is indented by two, with one
`[key, [shape...], dtype]` row per line.

The class and attribute names below are part of the fixture (they are the
state-dict keys and the repr's type names): the Rust side declares the same
structs with the same field names, in the same order. Change both together.
"""
import json
from pathlib import Path

import torch
from torch import nn

OUT = Path(__file__).resolve().parent / "fixtures" / "state_dicts.json"
GENERATOR = "tools/gen_state_dict_fixtures.py"


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 512)
        self.fc2 = nn.Linear(512, 512)
        self.fc3 = nn.Linear(512, 10)
        self.act = nn.ReLU()


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


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock, with a 1x1 strided projection shortcut."""

    def __init__(self, inplanes=64, planes=128, stride=2):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = nn.Sequential(
            nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
            nn.BatchNorm2d(planes),
        )


def models():
    return {
        "mlp": Mlp(),
        "lenet5": LeNet5(),
        "basic_block": BasicBlock(64, 128, 2),
        "encoder_block": nn.TransformerEncoderLayer(
            d_model=64, nhead=4, dim_feedforward=128, dropout=0.1, batch_first=True
        ),
        "mha": nn.MultiheadAttention(64, 4, batch_first=True),
        "layer_norm": nn.LayerNorm(64),
        "batch_norm": nn.BatchNorm2d(8),
    }


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def layout(model):
    return {
        "keys": [[k, list(t.shape), dtype_name(t.dtype)] for k, t in model.state_dict().items()],
        "named_parameters": [k for k, _ in model.named_parameters()],
        "named_buffers": [k for k, _ in model.named_buffers()],
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "repr": str(model),
    }


def to_json(value, indent=""):
    """`json.dumps(value, indent=2)`, except that a list inside a list (a
    `keys` row) is written on one line."""
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" if items else "{}"
    if isinstance(value, list):
        if not value:
            return "[]"
        rows = [json.dumps(v) if isinstance(v, list) else to_json(v, inner) for v in value]
        return "[\n" + ",\n".join(inner + r for r in rows) + "\n" + indent + "]"
    return json.dumps(value)


def main():
    data = {
        "torch_version": torch.__version__,
        "generator": GENERATOR,
        "models": {name: layout(m) for name, m in models().items()},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(to_json(data) + "\n")
    assert json.loads(OUT.read_text()) == data
    for name, entry in data["models"].items():
        print(f"{name}: {len(entry['keys'])} keys, {entry['num_parameters']} parameters")
    print(f"{OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}: "
          f"{OUT.stat().st_size} bytes (torch {torch.__version__})")


if __name__ == "__main__":
    main()
