"""PyTorch's side of the MLP step benchmark (benches/mlp_step.sh runs both)."""
import time

import torch

torch.manual_seed(0)
torch.set_num_threads(2)
batch = 128
model = torch.nn.Sequential(
    torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
)
x = torch.randn(batch, 784)
y = torch.arange(batch) % 10


def step():
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.item()


for _ in range(3):
    step()
times = []
for _ in range(21):
    s = time.perf_counter()
    step()
    times.append(time.perf_counter() - s)
times.sort()
print(f"torch  MLP 784-512-512-10 batch {batch} forward+backward: {times[len(times) // 2] * 1e3:.3f} ms (median of 21, torch {torch.__version__})")
