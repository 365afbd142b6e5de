"""PyTorch's side of the side-by-side suite. Each workload mirrors the Rust
one: same sizes, same warm-up and repetition counts. Prints one line per
workload: `key<TAB>v1,v2,...` in the workload's unit (ms per call, GFLOP/s,
GB/s, MB).

    python3 benches/suite.py --threads 2 --keys "matmul 512,mlp step"
    python3 benches/suite.py --threads 2 --serve   # keys read from stdin
    python3 benches/suite.py --rss mlp     # a child process for peak RSS (mlp-bf16, resnet, lstm)

benches/benches/suite.rs starts it once with `--serve` and asks for one
workload at a time, right after measuring the same workload in Forma, so
both sides of a row are measured within seconds of each other.
"""
import argparse
import io
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


# The least time a measurement spends in warm-up calls, as in
# benches/src/lib.rs (WARMUP_SECS).
WARMUP_SECS = 0.05


def timed(warmup, reps, f):
    start = time.perf_counter()
    calls = 0
    while calls < warmup or time.perf_counter() - start < WARMUP_SECS:
        f()
        calls += 1
    out = []
    for _ in range(reps):
        s = time.perf_counter()
        f()
        out.append((time.perf_counter() - s) * 1e3)
    return out


def peak_rss_mb():
    """This process's peak resident set size in MB (`VmHWM`, as suite.rs
    reads it). Not `ru_maxrss`: Linux keeps that across `execve`, so a child
    started by a large server process would report the server's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) / 1024.0
    return float("nan")


def rate(ms, work):
    return [work / (t / 1e3) for t in ms]


def matmul(m, k, n):
    a = torch.randn(m, k)
    b = torch.randn(k, n)
    flops = 2.0 * m * k * n
    reps = int(min(max(2e10 / flops, 5), 200))
    return rate(timed(3, reps, lambda: a @ b), flops / 1e9)


def mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    )


def train_step(model, opt, x, y, amp=False):
    def step():
        opt.zero_grad()
        # Forward and loss under autocast, backward outside: PyTorch's recipe.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def mlp_step(amp=False):
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(128, 784)
    y = torch.arange(128) % 10
    return timed(5, 50, train_step(model, opt, x, y, amp))


def first_call(what, f):
    """Runs `f` once, printing how long it took (torch.compile's compile)."""
    s = time.perf_counter()
    f()
    print(f"torch.compile, {what}: first call (compile) {(time.perf_counter() - s) * 1e3:.1f} ms", file=sys.stderr)


def mlp_step_compiled():
    model = torch.compile(mlp())
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(128, 784)
    y = torch.arange(128) % 10
    step = train_step(model, opt, x, y)
    first_call("mlp step", step)
    return timed(5, 50, step)


def encoder_compiled(batch, seq):
    model = torch.compile(encoder_model())
    x = torch.randn(batch, seq, 384)

    def run():
        with torch.inference_mode():
            model(x)

    first_call(f"encoder b{batch} s{seq}", run)
    return timed(2, 10 if batch * seq >= 512 else 50, run)


def matmul_bf16(n):
    a = torch.randn(n, n).bfloat16()
    b = torch.randn(n, n).bfloat16()
    flops = 2.0 * n * n * n
    reps = int(min(max(2e10 / flops, 5), 200))
    return rate(timed(3, reps, lambda: a @ b), flops / 1e9)


def lenet():
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(400, 120), torch.nn.ReLU(), torch.nn.Linear(120, 84), torch.nn.ReLU(),
        torch.nn.Linear(84, 10),
    )


def lenet_step(amp=False):
    model = lenet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 1, 28, 28)
    y = torch.arange(64) % 10
    return timed(5, 50, train_step(model, opt, x, y, amp))


def lenet_step_compiled():
    model = torch.compile(lenet())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 1, 28, 28)
    y = torch.arange(64) % 10
    step = train_step(model, opt, x, y)
    first_call("lenet step", step)
    return timed(5, 50, step)


def rnn_step(cls):
    return timed(2, 8, rnn_trainer(cls))


def encoder(batch, seq, amp=False):
    layer = torch.nn.TransformerEncoderLayer(384, 12, 1536, batch_first=True)
    # enable_nested_tensor off: no padding mask here, and it only warns.
    model = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).eval()
    x = torch.randn(batch, seq, 384)
    reps = 10 if batch * seq >= 512 else 50

    def run():
        # inference_mode takes PyTorch's fused fast path (the "fused attention" figure).
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            model(x)

    return timed(2, reps, run)


def encoder_model():
    layer = torch.nn.TransformerEncoderLayer(384, 12, 1536, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).eval()


def onnx_bytes(model, x):
    # The TorchScript exporter (the dynamo one needs onnxscript), into memory:
    # the file write is left out on both sides; batch and sequence symbolic.
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17,
                          input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch", 1: "seq"}})
    return len(buf.getvalue())


def export_encoder():
    model, x = encoder_model(), torch.randn(1, 16, 384)
    return timed(1, 5, lambda: onnx_bytes(model, x))


def rss_export_child():
    model, x = encoder_model(), torch.randn(1, 16, 384)
    onnx_bytes(model, x)
    print(peak_rss_mb())


def rss_export(threads):
    out = subprocess.run(
        [sys.executable, __file__, "--rss-export", "--threads", str(threads)], capture_output=True, text=True, check=True
    )
    return [float(out.stdout.strip())]


def gelu_chain():
    n = 1 << 22
    x, w, b = torch.randn(n), torch.randn(n), torch.randn(n)
    return rate(timed(3, 30, lambda: F.gelu(x * w + b)), 16.0 * n / 1e9)


def resnet_trainer():
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(16, 3, 64, 64)
    y = torch.arange(16) % 10
    return train_step(model, opt, x, y)


def resnet_step():
    return timed(2, 5, resnet_trainer())


def resnet_infer(batch):
    import torchvision

    model = torchvision.models.resnet18().eval()
    x = torch.randn(batch, 3, 224, 224)
    reps = 20 if batch == 1 else 3

    def run():
        with torch.inference_mode():
            model(x)

    return timed(2, reps, run)


def resnet_infer_compiled(batch):
    import torchvision

    model = torch.compile(torchvision.models.resnet18().eval())
    x = torch.randn(batch, 3, 224, 224)

    def run():
        with torch.inference_mode():
            model(x)

    first_call(f"resnet18 b{batch}", run)
    return timed(2, 3, run)


def gpt2_generate():
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ids = torch.tensor([[(i * 997 + 13) % 50257 for i in range(16)]])
    mask = torch.ones_like(ids)

    def run():
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                use_cache=True, pad_token_id=50256,
            )
        assert out.shape[1] == 16 + 32

    return rate(timed(1, 3, run), 32.0)


def bert_model():
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
    )
    return transformers.BertModel(config).eval()


def bert_infer(compiled=False):
    model = bert_model()
    if compiled:
        model = torch.compile(model)
    ids = (torch.arange(32 * 128) * 7919 % 30522).reshape(32, 128)

    def run():
        with torch.inference_mode():
            model(input_ids=ids)

    if compiled:
        first_call("bert b32 s128", run)
    return timed(1, 5, run)


def rnn_trainer(cls):
    net = cls(128, 256, num_layers=2, batch_first=True)
    opt = torch.optim.Adam(net.parameters())
    x = torch.randn(32, 64, 128)

    def step():
        opt.zero_grad()
        y, _ = net(x)
        loss = y.square().mean()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def rss_child(kind):
    """The process whose peak RSS is compared (as suite.rs's `rss_child`):
    `mlp`, `mlp-bf16`, `resnet`, `lstm`, `encoder` or `encoder-compiled`."""
    torch.manual_seed(0)
    if kind in ("mlp", "mlp-bf16"):
        model = mlp()
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(128, 784)
        y = torch.arange(128) % 10
        steps, step = 20, train_step(model, opt, x, y, kind == "mlp-bf16")
    elif kind == "resnet":
        steps, step = 6, resnet_trainer()
    elif kind == "lstm":
        steps, step = 4, rnn_trainer(torch.nn.LSTM)
    elif kind in ("encoder", "encoder-compiled"):
        model = encoder_model()
        if kind == "encoder-compiled":
            model = torch.compile(model)
        x = torch.randn(8, 128, 384)

        def step():
            with torch.inference_mode():
                model(x)

        steps = 4
    else:
        raise SystemExit(f"no process named {kind}")
    for _ in range(steps):
        step()
    print(peak_rss_mb())


def rss_train(threads, kind):
    out = subprocess.run(
        [sys.executable, __file__, "--rss", kind, "--threads", str(threads)], capture_output=True, text=True, check=True
    )
    return [float(out.stdout.strip())]


WORKLOADS = {
    "matmul 128": lambda t: matmul(128, 128, 128),
    "matmul 256": lambda t: matmul(256, 256, 256),
    "matmul 512": lambda t: matmul(512, 512, 512),
    "matmul 1024": lambda t: matmul(1024, 1024, 1024),
    "matmul 2048": lambda t: matmul(2048, 2048, 2048),
    "matmul 64x784x512": lambda t: matmul(64, 784, 512),
    "mlp step": lambda t: mlp_step(),
    "lenet step": lambda t: lenet_step(),
    "lstm step": lambda t: rnn_step(torch.nn.LSTM),
    "gru step": lambda t: rnn_step(torch.nn.GRU),
    "encoder b8 s128": lambda t: encoder(8, 128),
    "encoder b32 s128": lambda t: encoder(32, 128),
    "encoder b1 s16": lambda t: encoder(1, 16),
    "compiled mlp step": lambda t: mlp_step_compiled(),
    "compiled lenet step": lambda t: lenet_step_compiled(),
    "compiled encoder b1 s16": lambda t: encoder_compiled(1, 16),
    "compiled encoder b8 s128": lambda t: encoder_compiled(8, 128),
    "rss encoder b8": lambda t: rss_train(t, "encoder"),
    "rss compiled encoder b8": lambda t: rss_train(t, "encoder-compiled"),
    "compiled resnet18 b16": lambda t: resnet_infer_compiled(16),
    "compiled bert b32 s128": lambda t: bert_infer(compiled=True),
    "gelu chain": lambda t: gelu_chain(),
    "export encoder": lambda t: export_encoder(),
    "rss export": rss_export,
    "rss mlp": lambda t: rss_train(t, "mlp"),
    "resnet18 step": lambda t: resnet_step(),
    "resnet18 b1": lambda t: resnet_infer(1),
    "resnet18 b16": lambda t: resnet_infer(16),
    "gpt2 generate": lambda t: gpt2_generate(),
    "bert b32 s128": lambda t: bert_infer(),
    "rss resnet18": lambda t: rss_train(t, "resnet"),
    "rss lstm": lambda t: rss_train(t, "lstm"),
    "matmul bf16 512": lambda t: matmul_bf16(512),
    "matmul bf16 1024": lambda t: matmul_bf16(1024),
    "matmul bf16 2048": lambda t: matmul_bf16(2048),
    "mlp step bf16": lambda t: mlp_step(amp=True),
    "lenet step bf16": lambda t: lenet_step(amp=True),
    "encoder b8 s128 bf16": lambda t: encoder(8, 128, amp=True),
    "rss mlp bf16": lambda t: rss_train(t, "mlp-bf16"),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--keys", default=",".join(WORKLOADS))
    p.add_argument("--rss", metavar="KIND")
    p.add_argument("--rss-export", action="store_true")
    p.add_argument("--serve", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.rss:
        rss_child(a.rss)
        return
    if a.rss_export:
        rss_export_child()
        return
    keys = (line.strip() for line in sys.stdin) if a.serve else a.keys.split(",")
    for key in keys:
        # An unknown key still gets its line (with no values), so a caller
        # reading one line per key never waits.
        vals = WORKLOADS[key](a.threads) if key in WORKLOADS else []
        print(key + "\t" + ",".join(f"{v:.6g}" for v in vals), flush=True)


if __name__ == "__main__":
    main()
