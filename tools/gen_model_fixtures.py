#!/usr/bin/env python3
"""Writes the Hugging Face golden values that `examples/models/tests/` compares
Forma's BERT and GPT-2 against:

- `tools/fixtures/models/bert_tiny.safetensors` and `gpt2_tiny.safetensors`:
  the `model.safetensors` that `save_pretrained` writes for tiny random
  `BertModel` / `GPT2LMHeadModel`s (so GPT-2's tied `lm_head.weight` is left
  out, as in real GPT-2 checkpoints), with the torch and transformers
  versions added to the header's metadata;
- `tools/fixtures/models/io.safetensors`: fixed inputs and the models' outputs;
- `tools/fixtures/models/layouts.json`: the `state_dict()` keys and shapes of
  the full-size all-MiniLM-L6-v2 and GPT-2 small models (built on the `meta`
  device, so no weights are allocated or shipped).

Run from the repository root:

    python3 tools/gen_model_fixtures.py

Needs `torch`, `safetensors` and `transformers` (written against 5.24). The
models run in float32 on the CPU with the eager attention, in eval mode;
parameters come from a fixed seed, so reruns write identical files.

Conventions of `io.safetensors` (mirrored by the Rust tests; change both
together):

- `bert.input_ids`, `bert.token_type_ids`, `bert.attention_mask`: int64
  `[2, 7]`; the second sequence ends with two padding positions;
- `bert.last_hidden_state` `[2, 7, 32]`, `bert.pooler_output` `[2, 32]`;
- `bert.sentence_embedding` `[2, 32]`: sentence-transformers' pooling for
  all-MiniLM-L6-v2 (mean over the unmasked positions, then L2 normalisation)
  of the model run on the ids and mask alone (token types all 0);
- `gpt2.input_ids` int64 `[2, 6]`, `gpt2.logits` `[2, 6, 99]`;
- `gpt2.prompt` int64 `[1, 4]`, `gpt2.greedy` int64 `[1, 4 + 12]`: the prompt
  followed by `generate(do_sample=False, max_new_tokens=12)`; the generator
  checks that every greedy choice wins by a margin far above float error, so
  the Rust test may demand the exact tokens.
"""
import json
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from fixture_file import OUT, FixtureFile, canonical_header

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

MODELS = OUT / "models"

TINY_BERT = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=40,
    type_vocab_size=2,
    hidden_act="gelu",
    layer_norm_eps=1e-12,
)
TINY_GPT2 = dict(
    vocab_size=99,
    n_positions=64,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_inner=None,  # 4 * n_embd = 128
    activation_function="gelu_new",
    layer_norm_epsilon=1e-5,
    # No end-of-text token: generation runs its full length, untouched by
    # stopping rules, which is what the Rust greedy loop does.
    bos_token_id=None,
    eos_token_id=None,
)
GREEDY_NEW_TOKENS = 12


class Io(FixtureFile):
    GENERATOR = "tools/gen_model_fixtures.py"

    def __init__(self):
        super().__init__("models/io", seed=20261130)


def randomize(model, g):
    """Replaces every parameter with seeded values: weights `N(0, 0.3^2)`,
    biases `N(0, 0.1^2)`, LayerNorm scales `1 + N(0, 0.1^2)`. Hugging Face's
    own init (zero biases, unit norms) would leave the bias and norm paths
    untested."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "LayerNorm.weight" in name or ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.3 * noise)


def save_hf(model, name):
    """Saves the model as `save_pretrained` writes it and copies its
    `model.safetensors` to `fixtures/models/<name>.safetensors`."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        dst = MODELS / f"{name}.safetensors"
        shutil.copyfile(Path(d) / "model.safetensors", dst)
    stamp(dst)
    canonical_header(dst)
    return dst


def stamp(path):
    """Adds the torch and transformers versions and the generator to the
    header's metadata (beside `save_pretrained`'s `"format": "pt"`); the
    tensors and their offsets are untouched."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.setdefault("__metadata__", {}).update(
        torch=torch.__version__, transformers=transformers.__version__, generator=Io.GENERATOR
    )
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def sentence_embedding(last_hidden_state, attention_mask):
    """sentence-transformers' `Pooling(mode="mean")` then `Normalize()`."""
    mask = attention_mask.unsqueeze(-1).expand(last_hidden_state.size()).float()
    summed = torch.sum(last_hidden_state * mask, 1)
    counts = torch.clamp(mask.sum(1), min=1e-9)
    return torch.nn.functional.normalize(summed / counts, p=2, dim=1)


def bert(io):
    torch.manual_seed(1)
    model = BertModel(BertConfig(**TINY_BERT, attn_implementation="eager")).eval()
    randomize(model, io.g)
    path = save_hf(model, "bert_tiny")
    assert set(load_file(str(path))) == set(model.state_dict())

    ids = torch.randint(0, TINY_BERT["vocab_size"], (2, 7), generator=io.g)
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0, 0]])
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    ids[1, 5:] = 0  # the [PAD] id
    with torch.no_grad():
        out = model(input_ids=ids, token_type_ids=types, attention_mask=mask)
    io.put("bert.input_ids", ids)
    io.put("bert.token_type_ids", types)
    io.put("bert.attention_mask", mask)
    io.put("bert.last_hidden_state", out.last_hidden_state)
    io.put("bert.pooler_output", out.pooler_output)
    # sentence-transformers passes single sentences with all-zero token types.
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).last_hidden_state
    io.put("bert.sentence_embedding", sentence_embedding(plain, mask))


def gpt2(io):
    torch.manual_seed(2)
    model = GPT2LMHeadModel(GPT2Config(**TINY_GPT2, attn_implementation="eager")).eval()
    randomize(model, io.g)
    assert model.lm_head.weight is model.transformer.wte.weight
    path = save_hf(model, "gpt2_tiny")
    saved = set(load_file(str(path)))
    assert saved == set(model.state_dict()) - {"lm_head.weight"}, saved

    ids = torch.randint(0, TINY_GPT2["vocab_size"], (2, 6), generator=io.g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    io.put("gpt2.input_ids", ids)
    io.put("gpt2.logits", logits)

    prompt = torch.randint(0, TINY_GPT2["vocab_size"], (1, 4), generator=io.g)
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=GREEDY_NEW_TOKENS,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    for step, scores in enumerate(out.scores):
        top = scores[0].topk(2).values
        assert top[0] - top[1] > 1e-3, f"greedy step {step} is a near tie: {top}"
    io.put("gpt2.prompt", prompt)
    io.put("gpt2.greedy", out.sequences)


def layout(model):
    return [[k, list(v.shape)] for k, v in model.state_dict().items()]


def layouts():
    """Keys and shapes of the full-size models, from the `meta` device."""
    with torch.device("meta"):
        minilm = BertModel(
            BertConfig(
                vocab_size=30522,
                hidden_size=384,
                num_hidden_layers=6,
                num_attention_heads=12,
                intermediate_size=1536,
                max_position_embeddings=512,
                type_vocab_size=2,
            )
        )
        gpt2 = GPT2LMHeadModel(GPT2Config())  # GPT-2 small is the default config
    assert gpt2.lm_head.weight is gpt2.transformer.wte.weight
    doc = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generator": Io.GENERATOR,
        "minilm_l6": {"state_dict": layout(minilm)},
        "gpt2_small": {"state_dict": layout(gpt2), "tied": {"lm_head.weight": "transformer.wte.weight"}},
    }
    path = MODELS / "layouts.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main():
    MODELS.mkdir(parents=True, exist_ok=True)
    io = Io()
    bert(io)
    gpt2(io)
    io.save()
    layouts()


if __name__ == "__main__":
    main()
