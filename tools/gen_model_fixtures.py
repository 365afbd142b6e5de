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

    python3 tools/gen_model_fixtures.py            # keeps io.safetensors' values
    python3 tools/gen_model_fixtures.py --fresh    # rewrites them from this run

Needs `torch`, `safetensors` and `transformers` (written against torch 2.15.0,
transformers 5.24.0). The models run in float32 on the CPU with the eager
attention, in eval mode; parameters come from a fixed seed, so the weight
files are identical on every rerun (for io.safetensors see below).

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

Intermediate outputs, as Hugging Face returns them for
`output_hidden_states=True, output_attentions=True` (eager attention, eval
mode) on the inputs above (BERT: `bert.input_ids`, `bert.token_type_ids`,
`bert.attention_mask`; GPT-2: `gpt2.input_ids`, no attention mask), computed
from the committed `bert_tiny` / `gpt2_tiny` weight files:

- `bert.hidden_states.{i}` f32 `[2, 7, 32]` for `i` in `0..=2`: 0 is the
  embedding output (word + position + token type embeddings, then the
  embeddings' LayerNorm), `i >= 1` the output of encoder layer `i - 1`, so
  `bert.hidden_states.2` is `bert.last_hidden_state` (recomputed: equal
  within float error, not necessarily bit for bit);
- `bert.attentions.{i}` f32 `[2, 4, 7, 7]` (`[batch, heads, query, key]`)
  for `i` in `0..2`: layer `i`'s attention probabilities after the softmax,
  with the padding mask applied as Hugging Face does (the dtype's minimum
  added to the scores of masked keys): the two padded key positions of
  sequence 1 get exactly 0 in every row, the padded query rows included,
  which are ordinary rows over the five real keys (not zeroed);
- `gpt2.hidden_states.{i}` f32 `[2, 6, 32]` for `i` in `0..=2`: 0 is
  `wte[ids] + wpe[positions]`, 1 the output of block 0, and the last one
  (2) is NOT the raw output of the last block but `ln_f` applied to it,
  i.e. the model's `last_hidden_state`, the input of `lm_head`
  (transformers replaces the last captured entry with `last_hidden_state`);
  the raw output of the last block is not recorded;
- `gpt2.attentions.{i}` f32 `[2, 4, 6, 6]` for `i` in `0..2`: block `i`'s
  causal attention probabilities (exact zeros above the diagonal).

Existing entries are kept: float results move by an ulp or so between CPUs
(kernel dispatch), even with the same torch and transformers, so when
`io.safetensors` exists the generator recomputes every entry, checks that the
stored ones agree (integers exactly, floats within `KEEP_ATOL`), keeps the
stored values and only adds the keys the file lacks; reruns are thus
byte-identical on any machine. The weight files must come out bit for bit as
committed. `--fresh` drops both checks and rewrites io.safetensors from this
run's values.
"""
import json

import torch
import transformers
from safetensors.torch import load_file
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from fixture_file import layout
from hf_fixtures import MODELS, KeptIo, assert_causal, greedy, put_intermediates, save_hf, with_last_output

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

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


# How far a recomputed float entry may stray from the stored one for the
# generator to keep the stored value (the Rust tests compare at 1e-4).
KEEP_ATOL = 1e-5


class Io(KeptIo):
    GENERATOR = "tools/gen_model_fixtures.py"
    KEEP_ATOL = KEEP_ATOL

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
    path = save_hf(model, "bert_tiny", Io.GENERATOR)
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
    path = save_hf(model, "gpt2_tiny", Io.GENERATOR)
    saved = set(load_file(str(path)))
    assert saved == set(model.state_dict()) - {"lm_head.weight"}, saved

    ids = torch.randint(0, TINY_GPT2["vocab_size"], (2, 6), generator=io.g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    io.put("gpt2.input_ids", ids)
    io.put("gpt2.logits", logits)

    prompt = torch.randint(0, TINY_GPT2["vocab_size"], (1, 4), generator=io.g)
    io.put("gpt2.prompt", prompt)
    io.put("gpt2.greedy", greedy(model, prompt, GREEDY_NEW_TOKENS, margin=1e-3))


def loaded_bert():
    """A fresh eager `BertModel` holding the committed `bert_tiny` weights."""
    model = BertModel(BertConfig(**TINY_BERT, attn_implementation="eager")).eval()
    model.load_state_dict(load_file(str(MODELS / "bert_tiny.safetensors")), strict=True)
    return model


def loaded_gpt2():
    """A fresh eager `GPT2LMHeadModel` holding the committed `gpt2_tiny`
    weights (the file leaves out the tied `lm_head.weight`)."""
    model = GPT2LMHeadModel(GPT2Config(**TINY_GPT2, attn_implementation="eager")).eval()
    missing, unexpected = model.load_state_dict(load_file(str(MODELS / "gpt2_tiny.safetensors")), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    assert model.lm_head.weight is model.transformer.wte.weight
    return model


def intermediates(io):
    """`output_hidden_states` / `output_attentions` of both models on the
    inputs already in `io`, run on the committed weight files."""
    bert = loaded_bert()
    ids, types, mask = (io.tensors[f"bert.{k}"] for k in ("input_ids", "token_type_ids", "attention_mask"))
    with torch.no_grad():
        out = bert(
            input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True, output_attentions=True
        )
        embedded = bert.embeddings(input_ids=ids, token_type_ids=types)
    assert torch.equal(out.hidden_states[0], embedded)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert torch.allclose(out.last_hidden_state, io.tensors["bert.last_hidden_state"], rtol=0, atol=KEEP_ATOL)
    for a in out.attentions:
        masked_key = (mask == 0)[:, None, None, :].expand_as(a)
        assert torch.all(a[masked_key] == 0) and torch.all(a[~masked_key] > 0), "padded keys get exactly 0"
    put_intermediates(io, "bert", out, TINY_BERT["num_hidden_layers"])

    gpt2 = loaded_gpt2()
    ids = io.tensors["gpt2.input_ids"]
    t = gpt2.transformer

    def run():
        return gpt2(input_ids=ids, output_hidden_states=True, output_attentions=True)

    with torch.no_grad():
        out, raw_last = with_last_output(t.h[-1], run)
        embedded = t.wte(ids) + t.wpe(torch.arange(ids.shape[1]))[None]
        final = t.ln_f(raw_last)
        logits = gpt2.lm_head(out.hidden_states[-1])
    assert torch.equal(out.hidden_states[0], embedded)
    # The last entry is ln_f of the last block's output: the lm_head input.
    assert torch.equal(out.hidden_states[-1], final)
    assert not torch.allclose(raw_last, final)
    assert torch.equal(logits, out.logits)
    assert torch.allclose(out.logits, io.tensors["gpt2.logits"], rtol=0, atol=KEEP_ATOL)
    assert_causal(out.attentions, ids.shape[1])
    put_intermediates(io, "gpt2", out, TINY_GPT2["n_layer"])


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
    intermediates(io)
    io.save()
    layouts()


if __name__ == "__main__":
    main()
