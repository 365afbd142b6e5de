"""Forma's CUDA bench beside PyTorch's on the same GPU.

Runs the same workloads as `benches/benches/cuda.rs` in PyTorch (cuBLAS
matmul TFLOP/s for f32, bf16, f16 at 4096 and 8192 with PyTorch's default
settings, i.e. no TF32 for f32; an MLP and a small CNN forward + backward
step), runs the Forma bench binary, and prints both side by side.

    python3 benches/cuda_bench.py                  # builds/runs the bench with cargo
    python3 benches/cuda_bench.py --forma BINARY   # a prebuilt bench binary (tools/gpu-check.sh)
"""

import argparse
import statistics
import subprocess
import time


def median_secs(fn, warmup, rounds, sync):
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def torch_figures():
    import torch

    if not torch.cuda.is_available():
        return {}, "no CUDA device for PyTorch"
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    out = {}
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    for n in (4096, 8192):
        for name, dt in dtypes.items():
            a = torch.randn(n, n, device=dev, dtype=dt)
            b = torch.randn(n, n, device=dev, dtype=dt)
            t = median_secs(lambda: a @ b, 2, 5 if n >= 8192 else 11, sync)
            out[f"matmul_{name}_{n}"] = (2 * n**3 / t / 1e12, "TFLOP/s")
    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(256, 784, device=dev, generator=g)
    ws = [
        (torch.randn(r, c, device=dev, generator=g) * 0.03).requires_grad_()
        for r, c in ((784, 1024), (1024, 1024), (1024, 10))
    ]

    def mlp():
        h = (x @ ws[0]).relu() @ ws[1]
        h = h.relu() @ ws[2]
        loss = -torch.log_softmax(h, 1).mean()
        loss.backward()
        for w in ws:
            w.grad = None

    out["mlp_step"] = (median_secs(mlp, 3, 21, sync) * 1e3, "ms")
    xc = torch.randn(128, 1, 28, 28, device=dev, generator=g)
    w1 = (torch.randn(32, 1, 3, 3, device=dev, generator=g) * 0.3).requires_grad_()
    w2 = (torch.randn(64, 32, 3, 3, device=dev, generator=g) * 0.05).requires_grad_()
    F = torch.nn.functional

    def cnn():
        y = F.max_pool2d(F.conv2d(xc, w1, padding=1).relu(), 2)
        y = F.max_pool2d(F.conv2d(y, w2, padding=1).relu(), 2)
        loss = y.square().mean()
        loss.backward()
        w1.grad = None
        w2.grad = None

    out["cnn_step"] = (median_secs(cnn, 3, 21, sync) * 1e3, "ms")
    return out, f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}"


def forma_figures(binary):
    cmd = [binary, "--bench"] if binary else [
        "cargo", "bench", "-p", "forma-benches", "--features", "cuda", "--bench", "cuda"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    out, notes = {}, []
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "RESULT":
            out[parts[1]] = (float(parts[2]), parts[3])
        elif line.strip():
            notes.append(line.strip())
    if res.returncode != 0:
        notes.append(f"bench exited with {res.returncode}: {res.stderr.strip()[-2000:]}")
    return out, notes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forma", help="prebuilt Forma bench binary (default: cargo bench)")
    args = ap.parse_args()
    fo, notes = forma_figures(args.forma)
    for n in notes:
        print(f"forma: {n}")
    try:
        to, tnote = torch_figures()
    except ImportError:
        to, tnote = {}, "PyTorch not installed"
    print(f"pytorch: {tnote}")
    keys = list(dict.fromkeys(list(to) + list(fo)))
    print(f"{'workload':<20} {'forma':>12} {'pytorch':>12} {'unit':<8} {'forma/pytorch':>14}")
    for k in keys:
        f, t = fo.get(k), to.get(k)
        unit = (f or t)[1]
        fs = f"{f[0]:.3f}" if f else "-"
        ts = f"{t[0]:.3f}" if t else "-"
        ratio = f"{f[0] / t[0]:.2f}" if f and t and t[0] else "-"
        print(f"{k:<20} {fs:>12} {ts:>12} {unit:<8} {ratio:>14}")


if __name__ == "__main__":
    main()
