#!/usr/bin/env python3
"""Writes the PyTorch golden values `tests/suite/nn_seq_parity.rs` compares against:
MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer, their
stacks (TransformerEncoder, TransformerDecoder), LSTM and GRU, in float64, forward outputs and gradients.

Run from the repository root:

    python3 tools/gen_seq_fixtures.py

Needs `torch` and `safetensors`. It writes `tools/fixtures/seq_layers.safetensors`
and prints its size. The metadata records `torch` (the version), `generator`,
and per case `<case>.keys` (the state_dict keys and shapes, in order, as JSON)
and `<case>.repr` (`str(module)`).

Conventions (mirrored by the Rust test; change both together):

- Every case builds a float64 PyTorch module with `batch_first=True` (except
  the `*_seq_first` cases, PyTorch's default `batch_first=False`), puts it
  in eval mode (dropout off), and overwrites every parameter with values drawn
  from a generator seeded once for the file: `U(-0.5, 0.5)`, except layer-norm
  weights, `1 + U(-0.2, 0.2)`. `<case>.p.<key>` holds each state_dict entry.
- `<case>.x.<name>` are the inputs (float64 tensors drawn from N(0, 1), bool
  masks); float inputs require grad.
- `<case>.y<i>` are the outputs (for MHA with weights: output then the
  head-averaged weights; for LSTM: output, h_n, c_n; for GRU: output, h_n),
  and `<case>.w<i>` a fixed N(0, 1) tensor of the same shape each. The loss is
  `sum_i sum(y_i * w_i)`.
- `<case>.gx.<name>` is the loss gradient for each float input and
  `<case>.gp.<key>` for each parameter.
- Gradients are enabled, so the encoder layer takes PyTorch's regular path,
  not the inference fast path (which zeroes padded positions).
"""
import json

import torch
import torch.nn as nn
from safetensors.torch import save_file

from fixture_file import OUT, FixtureFile, canonical_header

F64 = torch.float64
torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)


class SeqFixtures(FixtureFile):
    GENERATOR = "tools/gen_seq_fixtures.py"

    def __init__(self):
        super().__init__("seq_layers", seed=20240611)
        self.meta = {}

    def normal(self, *shape):
        return torch.randn(shape, generator=self.g, dtype=F64)

    def uniform(self, shape, lo, hi):
        return torch.rand(shape, generator=self.g, dtype=F64) * (hi - lo) + lo

    def save(self):
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{self.name}.safetensors"
        meta = {"torch": torch.__version__, "generator": self.GENERATOR, **self.meta}
        save_file(self.tensors, str(path), metadata=meta)
        canonical_header(path)
        return path

    def module(self, case, m):
        """Randomises and records the parameters of `m`; eval mode, float64."""
        m = m.to(F64).eval()
        with torch.no_grad():
            for name, p in m.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                owner = name.rsplit(".", 1)[0] if "." in name else ""
                if leaf == "weight" and owner.startswith("norm"):
                    p.copy_(1.0 + self.uniform(p.shape, -0.2, 0.2))
                else:
                    p.copy_(self.uniform(p.shape, -0.5, 0.5))
        sd = m.state_dict()
        self.meta[f"{case}.keys"] = json.dumps([[k, list(v.shape)] for k, v in sd.items()])
        self.meta[f"{case}.repr"] = str(m)
        for k, v in sd.items():
            self.put(f"{case}.p.{k}", v)
        return m

    def inputs(self, case, **xs):
        """Records inputs; float ones become leaves that require grad."""
        out = {}
        for name, x in xs.items():
            self.put(f"{case}.x.{name}", x)
            if x.dtype == F64:
                x = x.clone().requires_grad_(True)
            out[name] = x
        return out

    def finish(self, case, m, xs, ys):
        """Records outputs, loss weights and every gradient."""
        loss = 0.0
        for i, y in enumerate(ys):
            w = self.normal(*y.shape)
            self.put(f"{case}.y{i}", y)
            self.put(f"{case}.w{i}", w)
            loss = loss + (y * w).sum()
        loss.backward()
        for name, x in xs.items():
            if x.dtype == F64:
                self.put(f"{case}.gx.{name}", x.grad)
        for name, p in m.named_parameters():
            self.put(f"{case}.gp.{name}", p.grad)


def pad_mask(lengths, total):
    """[batch, total] bool, True past each sequence's length."""
    return torch.stack([torch.arange(total) >= n for n in lengths])


def causal_mask(n, dtype=F64):
    """PyTorch's causal mask: float (-inf above the diagonal) or bool."""
    if dtype == torch.bool:
        return torch.ones(n, n, dtype=torch.bool).triu(1)
    return nn.Transformer.generate_square_subsequent_mask(n, dtype=F64)


B, E, HEADS, FF = 2, 8, 2, 16


def mha_cases(f):
    T, S = 4, 5

    # Cross-attention without masks; also the head-averaged weights.
    c = "mha_cross"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, batch_first=True))
    xs = f.inputs(c, q=f.normal(B, T, E), k=f.normal(B, S, E), v=f.normal(B, S, E))
    y, w = m(xs["q"], xs["k"], xs["v"], need_weights=True, average_attn_weights=True)
    f.finish(c, m, xs, [y, w])

    # A bool key padding mask (the second sequence has 3 of 5 keys).
    c = "mha_kpm"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, batch_first=True))
    xs = f.inputs(
        c, q=f.normal(B, T, E), k=f.normal(B, S, E), v=f.normal(B, S, E), kpm=pad_mask([5, 3], S)
    )
    y, _ = m(xs["q"], xs["k"], xs["v"], key_padding_mask=xs["kpm"], need_weights=False)
    f.finish(c, m, xs, [y])

    # Causal self-attention (gradients reach x through q, k and v).
    c = "mha_causal"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, batch_first=True))
    xs = f.inputs(c, x=f.normal(B, T, E))
    x = xs["x"]
    y, _ = m(x, x, x, attn_mask=causal_mask(T), is_causal=True, need_weights=False)
    f.finish(c, m, xs, [y])

    # Float masks: an additive [T, S] attn_mask and a float key padding mask.
    c = "mha_float_masks"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, batch_first=True))
    kpm = torch.zeros(B, S, dtype=F64).masked_fill(pad_mask([4, 5], S), float("-inf"))
    xs = f.inputs(c, q=f.normal(B, T, E), k=f.normal(B, S, E), v=f.normal(B, S, E))
    am = f.uniform((T, S), -1.0, 1.0)
    f.put(f"{c}.x.attn_mask", am)
    f.put(f"{c}.x.kpm", kpm)
    y, _ = m(xs["q"], xs["k"], xs["v"], key_padding_mask=kpm, attn_mask=am, need_weights=False)
    f.finish(c, m, xs, [y])

    # Bool masks: a [T, S] attn_mask (no row fully hidden) and a key padding mask.
    c = "mha_bool_masks"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, batch_first=True))
    am = torch.tensor(
        [[False, True, False, False, True],
         [True, False, False, True, False],
         [False, False, True, False, False],
         [False, True, True, False, False]]
    )
    xs = f.inputs(
        c,
        q=f.normal(B, T, E),
        k=f.normal(B, S, E),
        v=f.normal(B, S, E),
        attn_mask=am,
        kpm=pad_mask([5, 4], S),
    )
    y, _ = m(
        xs["q"], xs["k"], xs["v"], key_padding_mask=xs["kpm"], attn_mask=am, need_weights=False
    )
    f.finish(c, m, xs, [y])

    # bias=False: no in_proj_bias, no out_proj.bias.
    c = "mha_nobias"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, bias=False, batch_first=True))
    xs = f.inputs(c, x=f.normal(B, T, E))
    x = xs["x"]
    y, _ = m(x, x, x, need_weights=False)
    f.finish(c, m, xs, [y])


def encoder_cases(f):
    T = 5
    for c, norm_first, act, masking in [
        ("enc_post_relu_kpm", False, "relu", "kpm"),
        ("enc_pre_gelu_kpm", True, "gelu", "kpm"),
        ("enc_post_gelu_causal", False, "gelu", "causal"),
        ("enc_pre_relu_plain", True, "relu", None),
    ]:
        layer = nn.TransformerEncoderLayer(
            E, HEADS, FF, activation=act, norm_first=norm_first, batch_first=True
        )
        m = f.module(c, layer)
        if masking == "kpm":
            xs = f.inputs(c, src=f.normal(B, T, E), kpm=pad_mask([5, 3], T))
            y = m(xs["src"], src_key_padding_mask=xs["kpm"])
        elif masking == "causal":
            xs = f.inputs(c, src=f.normal(B, T, E))
            y = m(xs["src"], src_mask=causal_mask(T), is_causal=True)
        else:
            xs = f.inputs(c, src=f.normal(B, T, E))
            y = m(xs["src"])
        f.finish(c, m, xs, [y])


def decoder_cases(f):
    T, S = 4, 5
    for c, norm_first, act, tgt_kpm in [
        ("dec_post_relu", False, "relu", False),
        ("dec_pre_gelu", True, "gelu", True),
    ]:
        layer = nn.TransformerDecoderLayer(
            E, HEADS, FF, activation=act, norm_first=norm_first, batch_first=True
        )
        m = f.module(c, layer)
        extra = {"tgt_kpm": pad_mask([4, 3], T)} if tgt_kpm else {}
        xs = f.inputs(
            c, tgt=f.normal(B, T, E), memory=f.normal(B, S, E), mem_kpm=pad_mask([3, 5], S), **extra
        )
        y = m(
            xs["tgt"],
            xs["memory"],
            # The mask's type matches the padding mask's (PyTorch deprecates mixing them).
            tgt_mask=causal_mask(T, torch.bool if tgt_kpm else F64),
            tgt_is_causal=True,
            tgt_key_padding_mask=xs.get("tgt_kpm"),
            memory_key_padding_mask=xs["mem_kpm"],
        )
        f.finish(c, m, xs, [y])


def rnn_cases(f):
    I, H, T, L = 3, 4, 5, 2
    for kind in ["lstm", "gru"]:
        for c, bidir, state, bias in [
            (f"{kind}_zero", False, False, True),
            (f"{kind}_state", False, True, True),
            (f"{kind}_bi_state", True, True, True),
            (f"{kind}_bi_nobias", True, False, False),
        ]:
            cls = nn.LSTM if kind == "lstm" else nn.GRU
            m = f.module(
                c, cls(I, H, num_layers=L, bias=bias, batch_first=True, bidirectional=bidir)
            )
            dirs = 2 if bidir else 1
            if state:
                init = {"h0": f.normal(L * dirs, B, H)}
                if kind == "lstm":
                    init["c0"] = f.normal(L * dirs, B, H)
                xs = f.inputs(c, x=f.normal(B, T, I), **init)
                hx = (xs["h0"], xs["c0"]) if kind == "lstm" else xs["h0"]
                y, hn = m(xs["x"], hx)
            else:
                xs = f.inputs(c, x=f.normal(B, T, I))
                y, hn = m(xs["x"])
            ys = [y, *hn] if kind == "lstm" else [y, hn]
            f.finish(c, m, xs, ys)


def stack_cases(f):
    """TransformerEncoder / TransformerDecoder: two layers and a final norm.
    The nested-tensor fast path is off (it zeroes padded positions)."""
    T, S = 5, 4
    c = "enc_stack"
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, norm_first=True, batch_first=True)
    stack = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(E), enable_nested_tensor=False)
    m = f.module(c, stack)
    xs = f.inputs(c, src=f.normal(B, T, E), kpm=pad_mask([5, 3], T))
    y = m(xs["src"], src_key_padding_mask=xs["kpm"])
    f.finish(c, m, xs, [y])

    c = "dec_stack"
    layer = nn.TransformerDecoderLayer(E, HEADS, FF, activation="gelu", batch_first=True)
    m = f.module(c, nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(E)))
    xs = f.inputs(c, tgt=f.normal(B, T, E), memory=f.normal(B, S, E), mem_kpm=pad_mask([4, 2], S))
    y = m(
        xs["tgt"],
        xs["memory"],
        tgt_mask=causal_mask(T),
        tgt_is_causal=True,
        memory_key_padding_mask=xs["mem_kpm"],
    )
    f.finish(c, m, xs, [y])


def nobias_cases(f):
    """Encoder and decoder layers with `bias=False`: no projection biases
    and layer norms with a weight alone (drawn last, so the cases above keep
    their values)."""
    T, S = 5, 4
    c = "enc_nobias"
    layer = nn.TransformerEncoderLayer(
        E, HEADS, FF, activation="gelu", norm_first=True, batch_first=True, bias=False
    )
    m = f.module(c, layer)
    xs = f.inputs(c, src=f.normal(B, T, E), kpm=pad_mask([5, 3], T))
    y = m(xs["src"], src_key_padding_mask=xs["kpm"])
    f.finish(c, m, xs, [y])

    c = "dec_nobias"
    layer = nn.TransformerDecoderLayer(E, HEADS, FF, batch_first=True, bias=False)
    m = f.module(c, layer)
    xs = f.inputs(c, tgt=f.normal(B, T, E), memory=f.normal(B, S, E), mem_kpm=pad_mask([4, 2], S))
    y = m(
        xs["tgt"],
        xs["memory"],
        tgt_mask=causal_mask(T),
        tgt_is_causal=True,
        memory_key_padding_mask=xs["mem_kpm"],
    )
    f.finish(c, m, xs, [y])


def extra_kv_cases(f):
    """MultiheadAttention with add_bias_kv and add_zero_attn: a learned and
    a zero key/value appended to every sequence, the masks widened to match
    (drawn last, so the cases above keep their values)."""
    T, S = 4, 5
    c = "mha_bias_kv"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, add_bias_kv=True, batch_first=True))
    xs = f.inputs(
        c, q=f.normal(B, T, E), k=f.normal(B, S, E), v=f.normal(B, S, E), kpm=pad_mask([5, 3], S)
    )
    y, w = m(xs["q"], xs["k"], xs["v"], key_padding_mask=xs["kpm"], need_weights=True)
    f.finish(c, m, xs, [y, w])

    c = "mha_zero_attn_causal"
    layer = nn.MultiheadAttention(E, HEADS, add_bias_kv=True, add_zero_attn=True, batch_first=True)
    m = f.module(c, layer)
    xs = f.inputs(c, x=f.normal(B, T, E))
    x = xs["x"]
    y, _ = m(x, x, x, attn_mask=causal_mask(T), is_causal=True, need_weights=False)
    f.finish(c, m, xs, [y])

    # With the weights returned, PyTorch widens the causal mask itself: the
    # appended keys are visible to every query (without, they are hidden).
    c = "mha_bias_kv_causal_weights"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, add_bias_kv=True, batch_first=True))
    xs = f.inputs(c, x=f.normal(B, T, E))
    x = xs["x"]
    y, w = m(x, x, x, attn_mask=causal_mask(T), is_causal=True, need_weights=True)
    f.finish(c, m, xs, [y, w])

    c = "mha_zero_attn_float"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, add_zero_attn=True, batch_first=True))
    kpm = torch.zeros(B, S, dtype=F64).masked_fill(pad_mask([4, 5], S), float("-inf"))
    xs = f.inputs(c, q=f.normal(B, T, E), k=f.normal(B, S, E), v=f.normal(B, S, E))
    am = f.uniform((T, S), -1.0, 1.0)
    f.put(f"{c}.x.attn_mask", am)
    f.put(f"{c}.x.kpm", kpm)
    y, _ = m(xs["q"], xs["k"], xs["v"], key_padding_mask=kpm, attn_mask=am, need_weights=False)
    f.finish(c, m, xs, [y])


def other_width_cases(f):
    """Sizes that differ from the model width (drawn last): MultiheadAttention
    with `kdim`/`vdim` (separate `q/k/v_proj_weight`), and LSTM with
    `proj_size` (`weight_hr_l{k}`, a hidden state of `proj_size`)."""
    T, S, KD, VD = 4, 5, 6, 3
    c = "mha_kdim_vdim"
    m = f.module(c, nn.MultiheadAttention(E, HEADS, kdim=KD, vdim=VD, batch_first=True))
    xs = f.inputs(
        c, q=f.normal(B, T, E), k=f.normal(B, S, KD), v=f.normal(B, S, VD), kpm=pad_mask([5, 2], S)
    )
    y, w = m(xs["q"], xs["k"], xs["v"], key_padding_mask=xs["kpm"], need_weights=True)
    f.finish(c, m, xs, [y, w])

    c = "mha_kdim_bias_kv"
    layer = nn.MultiheadAttention(E, HEADS, bias=False, add_bias_kv=True, kdim=KD, vdim=KD, batch_first=True)
    m = f.module(c, layer)
    xs = f.inputs(c, q=f.normal(B, T, E), k=f.normal(B, S, KD), v=f.normal(B, S, KD))
    y, _ = m(xs["q"], xs["k"], xs["v"], need_weights=False)
    f.finish(c, m, xs, [y])

    I, H, P, L = 3, 5, 2, 2
    for c, bidir in [("lstm_proj_state", False), ("lstm_proj_bi_state", True)]:
        m = f.module(c, nn.LSTM(I, H, num_layers=L, proj_size=P, batch_first=True, bidirectional=bidir))
        dirs = 2 if bidir else 1
        xs = f.inputs(c, x=f.normal(B, T, I), h0=f.normal(L * dirs, B, P), c0=f.normal(L * dirs, B, H))
        y, (hn, cn) = m(xs["x"], (xs["h0"], xs["c0"]))
        f.finish(c, m, xs, [y, hn, cn])


def seq_first_cases(f):
    """PyTorch's default `batch_first=False` (drawn last): `[seq, batch, F]`
    inputs and outputs; states, masks and averaged weights as before."""
    T, S, H = 5, 4, 4
    c = "lstm_seq_first"
    m = f.module(c, nn.LSTM(3, H, num_layers=2, bidirectional=True))
    xs = f.inputs(c, x=f.normal(T, B, 3), h0=f.normal(4, B, H), c0=f.normal(4, B, H))
    y, (hn, cn) = m(xs["x"], (xs["h0"], xs["c0"]))
    f.finish(c, m, xs, [y, hn, cn])

    c = "gru_seq_first"
    m = f.module(c, nn.GRU(3, H))
    xs = f.inputs(c, x=f.normal(T, B, 3))
    y, hn = m(xs["x"])
    f.finish(c, m, xs, [y, hn])

    c = "mha_seq_first"
    m = f.module(c, nn.MultiheadAttention(E, HEADS))
    xs = f.inputs(
        c, q=f.normal(T, B, E), k=f.normal(S, B, E), v=f.normal(S, B, E), kpm=pad_mask([4, 2], S)
    )
    y, w = m(xs["q"], xs["k"], xs["v"], key_padding_mask=xs["kpm"], need_weights=True)
    f.finish(c, m, xs, [y, w])

    c = "enc_seq_first"
    m = f.module(c, nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0))
    xs = f.inputs(c, src=f.normal(T, B, E))
    y = m(xs["src"], src_mask=causal_mask(T), is_causal=True)
    f.finish(c, m, xs, [y])

    c = "dec_seq_first"
    m = f.module(c, nn.TransformerDecoderLayer(E, HEADS, FF, dropout=0.0, norm_first=True))
    xs = f.inputs(c, tgt=f.normal(T, B, E), memory=f.normal(S, B, E), mem_kpm=pad_mask([4, 3], S))
    y = m(xs["tgt"], xs["memory"], memory_key_padding_mask=xs["mem_kpm"])
    f.finish(c, m, xs, [y])


def main():
    f = SeqFixtures()
    mha_cases(f)
    encoder_cases(f)
    decoder_cases(f)
    rnn_cases(f)
    stack_cases(f)
    nobias_cases(f)
    extra_kv_cases(f)
    other_width_cases(f)
    seq_first_cases(f)
    path = f.save()
    print(f"{path.relative_to(path.parent.parent.parent)}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
