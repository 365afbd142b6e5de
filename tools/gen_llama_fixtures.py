#!/usr/bin/env python3
"""Writes the Hugging Face golden values that
`examples/models/tests/llama_hf.rs` compares Forma's Llama decoder
(`forma_models::llama`) against:

- `tools/fixtures/models/llama_tiny.safetensors`: the `model.safetensors`
  that `save_pretrained` writes for a tiny random `LlamaForCausalLM` with
  grouped-query attention and an untied head (`TINY_LLAMA`: vocabulary 256,
  hidden 64, 4 heads of 16, 2 key/value heads, MLP 128, 2 layers, rope theta
  10000, RMSNorm eps 1e-5);
- `tools/fixtures/models/llama_mha.safetensors`: one with as many key/value
  heads as heads (plain multi-head attention) and the head tied to the token
  embedding (`MHA_LLAMA`; `save_pretrained` leaves the tied `lm_head.weight`
  out), with a rope theta of 500000 and eps 1e-6 so that both settings are
  read from the config rather than assumed;
- `tools/fixtures/models/llama_io.safetensors`: fixed inputs and the models'
  outputs;
- `tools/fixtures/models/llama_tiny.config.json`, `llama_mha.config.json`:
  the two tiny models' `config.json` files;
- `tools/fixtures/models/llama_layouts.json`: the `state_dict()` keys and
  shapes of full-size `LlamaForCausalLM`s built on the `meta` device (no
  weights allocated or shipped): TinyLlama-1.1B's config (untied head) and a
  Llama-3.2-1B-shaped one (tied head; its `llama3` rope scaling changes no
  weight, so the layout uses the default rope).

Run from the repository root:

    python3 tools/gen_llama_fixtures.py            # keeps llama_io's values
    python3 tools/gen_llama_fixtures.py --fresh    # rewrites them from this run

Needs `torch`, `safetensors` and `transformers` (written against torch 2.15.0,
transformers 5.25.0). The models run in float32 on the CPU with the eager
attention, in eval mode; parameters come from a fixed seed, so the weight files
are identical on every rerun. As in `gen_model_fixtures.py`, stored float
entries of `llama_io.safetensors` are kept when a rerun agrees within
`KEEP_ATOL` (results move by an ulp between CPUs), so reruns are
byte-identical on any machine.

Conventions of `llama_io.safetensors` (mirrored by the Rust tests):

- `tiny.input_ids` int64 `[2, 7]`, `tiny.logits` f32 `[2, 7, 256]`;
- `tiny.prompt` int64 `[1, 8]`, `tiny.greedy` int64 `[1, 8 + 16]`: the prompt
  followed by `generate(do_sample=False, max_new_tokens=16)` (no end token,
  so all 16 are generated); every greedy choice wins by more than
  `GREEDY_MARGIN`, far above float error, so the Rust test may demand the
  exact tokens;
- `tiny.cached_logits` f32 `[1, 24, 256]`: the logits of the whole greedy
  sequence recomputed at once (what the cached steps must reproduce);
- `mha.input_ids` int64 `[2, 5]`, `mha.logits` f32 `[2, 5, 128]`;
- `rope.cos`, `rope.sin` f32 `[1, 7, 16]`: `model.rotary_emb` of the tiny
  model at positions 0..7 (the default rope, `cat(freqs, freqs)`);
- `tiny.hidden_states.{i}` f32 `[2, 7, 64]` for `i` in `0..=2` and
  `tiny.attentions.{i}` f32 `[2, 4, 7, 7]` for `i` in `0..2`:
  `output_hidden_states=True, output_attentions=True` on `tiny.input_ids`.
  Hidden state 0 is the token embedding, 1 the output of layer 0, and the
  last is `model.norm` of the last layer's output (the head's input), not
  the raw output; attentions are the probabilities after the softmax (exact
  zeros above the diagonal).
"""
import json

import torch
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from fixture_file import layout
from hf_fixtures import MODELS, KeptIo, assert_causal, greedy, put_intermediates, save_hf, with_last_output

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

GENERATOR = "tools/gen_llama_fixtures.py"

# No end-of-text token: generation runs its full length, untouched by
# stopping rules, which is what the Rust greedy loop does.
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
TINY_LLAMA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    **NO_SPECIAL,
)
MHA_LLAMA = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    rms_norm_eps=1e-6,
    rope_theta=500000.0,
    max_position_embeddings=32,
    tie_word_embeddings=True,
    **NO_SPECIAL,
)
PROMPT_LEN = 8
GREEDY_NEW_TOKENS = 16
GREEDY_MARGIN = 1e-3
KEEP_ATOL = 1e-5


class Io(KeptIo):
    GENERATOR = GENERATOR
    KEEP_ATOL = KEEP_ATOL

    def __init__(self):
        super().__init__("models/llama_io", seed=20261205)

def build(cfg):
    return LlamaForCausalLM(LlamaConfig(**cfg, attn_implementation="eager")).eval()


def randomize(model, g):
    """Weights `N(0, 0.3^2)`, RMSNorm scales `1 + N(0, 0.1^2)`: Hugging
    Face's init (std 0.02, unit norms) would give near-flat logits, greedy
    near-ties and an untested norm scale."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.3 * noise)


def loaded(cfg, name):
    """A fresh eager model holding the weights of the written file, which is
    what the Rust side loads."""
    model = build(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(MODELS / f"{name}.safetensors")), strict=False)
    tied = cfg["tie_word_embeddings"]
    assert missing == (["lm_head.weight"] if tied else []) and not unexpected, (missing, unexpected)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def tiny(io):
    torch.manual_seed(3)
    model = build(TINY_LLAMA)
    randomize(model, io.g)
    path = save_hf(model, "llama_tiny", GENERATOR)
    assert set(load_file(str(path))) == set(model.state_dict()), "untied: every key is saved"
    model = loaded(TINY_LLAMA, "llama_tiny")

    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 7), generator=io.g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        # The rotary table at positions 0..7, as the attention layers get it.
        x = model.model.embed_tokens(ids[:1])
        cos, sin = model.model.rotary_emb(x, torch.arange(7)[None])
    io.put("tiny.input_ids", ids)
    io.put("tiny.logits", logits)
    intermediates(io, model, ids, logits)
    io.put("rope.cos", cos)
    io.put("rope.sin", sin)

    prompt = torch.randint(0, TINY_LLAMA["vocab_size"], (1, PROMPT_LEN), generator=io.g)
    sequences = greedy(model, prompt, GREEDY_NEW_TOKENS, GREEDY_MARGIN)
    with torch.no_grad():
        full = model(input_ids=sequences).logits
    assert sequences.shape == (1, PROMPT_LEN + GREEDY_NEW_TOKENS)
    io.put("tiny.prompt", prompt)
    io.put("tiny.greedy", sequences)
    io.put("tiny.cached_logits", full)


def intermediates(io, model, ids, logits):
    def run():
        return model(input_ids=ids, output_hidden_states=True, output_attentions=True)

    with torch.no_grad():
        out, raw_last = with_last_output(model.model.layers[-1], run)
        embedded = model.model.embed_tokens(ids)
        final = model.model.norm(raw_last)
    hidden = out.hidden_states
    assert torch.equal(hidden[0], embedded)
    assert torch.equal(hidden[-1], final) and not torch.allclose(raw_last, final)
    assert torch.equal(out.logits, logits)
    assert_causal(out.attentions, ids.shape[1])
    put_intermediates(io, "tiny", out, TINY_LLAMA["num_hidden_layers"])


def mha(io):
    torch.manual_seed(4)
    model = build(MHA_LLAMA)
    randomize(model, io.g)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    path = save_hf(model, "llama_mha", GENERATOR)
    saved = set(load_file(str(path)))
    assert saved == set(model.state_dict()) - {"lm_head.weight"}, saved
    model = loaded(MHA_LLAMA, "llama_mha")
    ids = torch.randint(0, MHA_LLAMA["vocab_size"], (2, 5), generator=io.g)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    io.put("mha.input_ids", ids)
    io.put("mha.logits", logits)


TINYLLAMA_1_1B = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
LLAMA_3_2_1B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
    tie_word_embeddings=True,
)


def layouts():
    def entry_of(cfg):
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**cfg))
        params = sum(p.numel() for p in model.parameters())  # a tied tensor counts once
        entry = {
            "config": cfg,
            "state_dict": layout(model),
            "num_parameters": params,
        }
        if cfg["tie_word_embeddings"]:
            assert model.lm_head.weight is model.model.embed_tokens.weight
            entry["tied"] = {"lm_head.weight": "model.embed_tokens.weight"}
        return entry

    doc = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generator": GENERATOR,
        "tinyllama_1_1b": entry_of(TINYLLAMA_1_1B),
        "llama_3_2_1b": entry_of(LLAMA_3_2_1B),
    }
    (MODELS / "llama_layouts.json").write_text(json.dumps(doc, indent=1) + "\n")


def configs():
    """The two tiny models' `config.json`, as `save_pretrained` writes it
    (`transformers` 5 puts `rope_theta` in `rope_parameters`), for
    `read_hf_config`, `from_pretrained_dir` and `hf_config!`."""
    for name, cfg in [("llama_tiny", TINY_LLAMA), ("llama_mha", MHA_LLAMA)]:
        LlamaConfig(**cfg).to_json_file(str(MODELS / f"{name}.config.json"))


def main():
    MODELS.mkdir(parents=True, exist_ok=True)
    io = Io()
    tiny(io)
    mha(io)
    io.save()
    layouts()
    configs()


if __name__ == "__main__":
    main()
