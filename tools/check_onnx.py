#!/usr/bin/env python3
"""Checks Forma's ONNX exports with the reference tools, and records the result.

Runs the tract suite (`cargo test -p forma-onnx --test tract`) with
FORMA_ONNX_OUT set, so each case writes its exported file and, per run, its
inputs and Forma's output. Then, for every case:

  * `onnx.checker.check_model(full_check=True)` (with shape inference);
  * ONNX Runtime runs the file on each run's inputs; its output is compared
    with Forma's (relative error against the largest magnitude);
  * where a PyTorch twin exists (the same layers from torch.nn, loaded from
    the file's initializers by their state_dict keys), PyTorch runs the same
    inputs and is compared with Forma too.

Writes onnx/tests/fixtures/onnx_check.json, which `onnx/tests/fixtures.rs`
checks in CI (every tract case recorded, every error within 1e-5).

    pip install onnx onnxruntime torch numpy
    python tools/check_onnx.py
"""

import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "onnx", "tests", "fixtures", "onnx_check.json")
TOL = 1e-5


def rel_err(got, want):
    got, want = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
    scale = max(np.abs(want).max(initial=0.0), 1e-6)
    return float(np.abs(got - want).max(initial=0.0) / scale)


def torch_twin(name, weights):
    """The case's model in PyTorch, loaded from the ONNX initializers."""
    try:
        import torch
        from torch import nn
    except ImportError:
        return None
    if name == "mlp":
        m = nn.Sequential(collections.OrderedDict(
            fc1=nn.Linear(6, 16), act=nn.ReLU(), fc2=nn.Linear(16, 3)))
    elif name == "lenet":
        m = nn.Sequential(collections.OrderedDict(
            conv1=nn.Conv2d(1, 8, 5, padding=2), act1=nn.ReLU(), pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(8, 16, 5), act2=nn.ReLU(), pool2=nn.MaxPool2d(2),
            flatten=nn.Flatten(), fc1=nn.Linear(400, 64), act3=nn.ReLU(), fc2=nn.Linear(64, 10)))
    elif name == "cnn":
        m = nn.Sequential(collections.OrderedDict(
            conv=nn.Conv2d(1, 4, 3), bn=nn.BatchNorm2d(4), act=nn.ReLU(),
            pool=nn.MaxPool2d(2), flatten=nn.Flatten(), fc=nn.Linear(100, 10)))
    elif name in ("encoder", "encoder_prenorm_gelu"):
        layers = 2 if name == "encoder" else 1
        gelu = name != "encoder"

        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList(
                    nn.TransformerEncoderLayer(
                        16, 4, 32, dropout=0.0, batch_first=True,
                        activation="gelu" if gelu else "relu", norm_first=gelu)
                    for _ in range(layers))
                self.norm = nn.LayerNorm(16)

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return self.norm(x)

        m = Encoder()
    elif name == "tagger":
        m = nn.Sequential(collections.OrderedDict(
            embed=nn.Embedding(20, 8), norm=nn.LayerNorm(8), fc=nn.Linear(8, 5)))
    elif name == "causal_attention":
        class Causal(nn.Module):
            def forward(self, x):
                q = torch.tanh(x * 0.5)
                # Forma: x.scaled_dot_product_attention(&q, &x, ..): x queries, q keys.
                return nn.functional.scaled_dot_product_attention(x, q, x, is_causal=True)

        m = Causal()
    elif name == "resnet":
        from torchvision.models.resnet import BasicBlock

        class ResNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
                self.bn1 = nn.BatchNorm2d(8)
                self.layer1 = BasicBlock(8, 8)
                down = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
                self.layer2 = BasicBlock(8, 16, stride=2, downsample=down)
                self.fc = nn.Linear(16, 5)

            def forward(self, x):
                h = self.layer2(self.layer1(torch.relu(self.bn1(self.conv1(x)))))
                return self.fc(h.mean((2, 3)))

        m = ResNet()
    elif name == "zoo":
        class Zoo(nn.Module):
            def __init__(self):
                super().__init__()
                self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
                self.gn = nn.GroupNorm(3, 6)
                self.rms = nn.RMSNorm(6)

            def forward(self, x):
                h = nn.functional.silu(self.gn(self.up(x)))
                h = nn.functional.avg_pool2d(h, 3, 2, 1, count_include_pad=False)
                h = self.rms(h.permute(0, 2, 3, 1)).reshape(x.shape[0], 25, 6)
                return torch.log_softmax(h, 2).cumsum(1)

        m = Zoo()
    elif name == "lstm_gru":
        class Recurrent(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(3, 5, num_layers=2, batch_first=True, bidirectional=True)
                self.gru = nn.GRU(10, 4, batch_first=True)

            def forward(self, x):
                return self.gru(self.lstm(x)[0])[0]

        m = Recurrent()
    elif name in ("gpt2", "bert"):
        try:
            import transformers
        except ImportError:
            return None
        if name == "gpt2":
            cfg = transformers.GPT2Config(
                vocab_size=99, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=128,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
            hf = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.BertConfig(
                vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=37, max_position_embeddings=40, type_vocab_size=2,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
            hf = transformers.BertModel(cfg)
        hf.config._attn_implementation = "eager"

        class Twin(nn.Module):
            def __init__(self):
                super().__init__()
                self.hf = hf

            def forward(self, ids):
                out = self.hf(input_ids=ids)
                return out.logits if name == "gpt2" else out.last_hidden_state

        weights = {f"hf.{k}": v for k, v in weights.items()}
        m = Twin()
    else:
        return None
    sd = {k: torch.from_numpy(v.copy()) for k, v in weights.items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, f"{name}: keys the twin lacks: {unexpected}"
    # Only buffers the exported graph never reads (and GPT-2's head, tied to
    # its token embedding) may be missing.
    unread = ("num_batches_tracked", "position_ids", "token_type_ids", "lm_head.weight")
    assert all(k.endswith(unread) for k in missing), f"{name}: {missing}"
    if name == "gpt2":
        m.hf.tie_weights()
    return m.eval()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, FORMA_ONNX_OUT=tmp)
        subprocess.run(["cargo", "test", "-q", "-p", "forma-onnx", "--test", "tract"],
                       cwd=ROOT, env=env, check=True)
        results = {}
        for fname in sorted(os.listdir(tmp)):
            if not fname.endswith(".onnx"):
                continue
            name = fname[:-5]
            path = os.path.join(tmp, fname)
            model = onnx.load(path)
            onnx.checker.check_model(model, full_check=True)
            weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
            with open(os.path.join(tmp, name + ".json")) as f:
                runs = json.load(f)["runs"]
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            twin = torch_twin(name, weights)
            entry = {"opset": model.opset_import[0].version, "runs": []}
            for run in runs:
                feeds = {}
                for meta, inp in zip(sess.get_inputs(), run["inputs"]):
                    dtype = np.float32 if inp["dtype"] == "float32" else np.int64
                    feeds[meta.name] = np.array(inp["values"], dtype).reshape(inp["dims"])
                want = np.array(run["output"]["values"], np.float32).reshape(run["output"]["dims"])
                got = sess.run(None, feeds)[0]
                assert list(got.shape) == list(want.shape), f"{name}: {got.shape} vs {want.shape}"
                r = {"input_dims": [i["dims"] for i in run["inputs"]],
                     "onnxruntime_vs_forma": rel_err(got, want)}
                if twin is not None:
                    import torch
                    with torch.no_grad():
                        args = [torch.from_numpy(v) for v in feeds.values()]
                        r["pytorch_vs_forma"] = rel_err(twin(*args).numpy(), want)
                entry["runs"].append(r)
                worst = max(v for k, v in r.items() if k.endswith("_forma"))
                status = "ok" if worst <= TOL else "FAIL"
                print(f"{name:24} {str(r['input_dims']):28} max rel err {worst:.2e}  {status}")
            results[name] = entry
    doc = {
        "tolerance": TOL,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "cases": results,
    }
    try:
        import torch
        doc["torch"] = torch.__version__
    except ImportError:
        pass
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    bad = [n for n, e in results.items() for r in e["runs"]
           if max(v for k, v in r.items() if k.endswith("_forma")) > TOL]
    print(f"wrote {os.path.relpath(OUT, ROOT)}: {len(results)} models, {len(bad)} out of tolerance")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
