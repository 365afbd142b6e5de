"""Writes the PyTorch checkpoint that example 05 (`05-checkpoints-pytorch`)
loads: a small CNN's `state_dict` saved with `safetensors.torch.save_file`,
exactly as a PyTorch user would save one, and beside it an input and the
model's output on it in eval mode.

    python tools/gen_example_fixtures.py

writes tools/fixtures/examples/small_cnn.safetensors (the weights: PyTorch's
keys, BatchNorm's running statistics and `num_batches_tracked` included) and
tools/fixtures/examples/small_cnn_io.safetensors (`input`, `output`), each
recording the torch version in its metadata. Reruns are byte-identical.
"""
from pathlib import Path

import torch
from torch import nn
from safetensors.torch import save_file

from fixture_file import canonical_header

OUT = Path(__file__).resolve().parent / "fixtures" / "examples"


class SmallCnn(nn.Module):
    """The model example 05 declares as a Forma struct with the same fields."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(x, 1))


def save(tensors, name):
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.safetensors"
    tensors = {k: v.detach().clone().contiguous() for k, v in tensors.items()}
    save_file(tensors, str(path), metadata={"torch": torch.__version__,
                                            "generator": "tools/gen_example_fixtures.py"})
    canonical_header(path)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


def main():
    torch.manual_seed(0)
    model = SmallCnn()
    # A few batches in train mode give BatchNorm running statistics that are
    # not its initial zeros and ones, so the example checks they load too.
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 1, 16, 16) * 2 + 0.5)
    model.eval()
    x = torch.randn(3, 1, 16, 16)
    with torch.no_grad():
        y = model(x)
    save(model.state_dict(), "small_cnn")
    save({"input": x, "output": y}, "small_cnn_io")


if __name__ == "__main__":
    main()
