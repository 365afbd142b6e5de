#!/usr/bin/env python3
"""Writes the Hugging Face model folders and golden values that
`examples/models/tests/text.rs` compares Forma's text pipeline against
(tokenizer, sentence embeddings, GPT-2 generation, `from_pretrained_dir`):

- `tools/fixtures/models/bert_text/`: a tiny BERT folder as the hub ships
  one: `config.json` and `model.safetensors` from `save_pretrained`, and the
  `tokenizer.json` + `tokenizer_config.json` of a WordPiece tokenizer
  trained here on `CORPUS` (BERT-style: lowercasing `BertNormalizer`,
  `BertPreTokenizer`, `[CLS] $A [SEP]` post-processor, `[PAD]` = 0);
- `tools/fixtures/models/gpt2_text/`: the same for a tiny GPT-2 with a
  byte-level BPE tokenizer trained on `CORPUS` (GPT-2-style: `ByteLevel`
  pre-tokenizer and decoder, no prefix space, `<|endoftext|>` the only
  special token);
- `tools/fixtures/models/text_io.json`: the reference outputs below.

The sizes are `gen_model_fixtures.py`'s `TINY_BERT` / `TINY_GPT2`, with the
vocabulary the tokenizer's (`BERT_VOCAB`, `GPT2_VOCAB`; the Rust test types
use the same numbers), and the weights are drawn by that script's
`randomize`, from fixed seeds: reruns write byte-identical files.

`text_io.json`:

- `bert.sentences`, and what the folder's tokenizer gives for them, loaded by
  `AutoTokenizer` with `padding=True` (to the longest, `[PAD]` = 0):
  `bert.input_ids`, `bert.attention_mask` (`[4, T]`);
- `bert.embeddings` `[4, 32]`: sentence-transformers' own embeddings
  (`SentenceTransformer` of `Transformer(folder)`, `Pooling(mean)`,
  `Normalize()`, i.e. all-MiniLM-L6-v2's pipeline), checked against an eager
  `BertModel` with mean pooling and normalisation by hand (within 1e-6);
- `bert.cosine` `[4, 4]`: `embeddings @ embeddings.T`;
- `bert.truncated_ids`, `bert.truncated_mask`: what sentence-transformers'
  `tokenize` gives with `max_seq_length = bert.truncate_to` (longer texts
  cut, `[SEP]` kept);
- `gpt2.prompt`, `gpt2.prompt_ids` (the tokenizer's ids, no special tokens
  added: GPT-2's post-processor adds none), `gpt2.generated_ids`: the prompt
  followed by `generate(do_sample=False, max_new_tokens=GPT2_NEW_TOKENS)`
  (each greedy choice checked to win by more than 1e-3, so exact tokens may
  be demanded), and `gpt2.text`: `tokenizer.decode(generated_ids)`.

Floats are written as the shortest decimal of the float32 value, so they
read back exactly.

Run from the repository root (needs `torch`, `transformers`, `tokenizers`,
`safetensors` and `sentence-transformers`; written against torch 2.15.0,
transformers 5.25.0, tokenizers 0.23.3, sentence-transformers 6.3.0; no
network is used):

    python3 tools/gen_text_fixtures.py
"""
import json
from collections import Counter
import shutil
import sys
from pathlib import Path

import numpy as np
import sentence_transformers
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
import tokenizers
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_file import OUT  # noqa: E402
from fixture_file import canonical_header  # noqa: E402
from gen_model_fixtures import TINY_BERT, TINY_GPT2, randomize, sentence_embedding  # noqa: E402

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

GENERATOR = "tools/gen_text_fixtures.py"
MODELS = OUT / "models"

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog.",
    "The weather is lovely today, with sunshine and a light breeze.",
    "It is raining heavily and the streets are flooded.",
    "Forma is a deep learning framework written in Rust.",
    "PyTorch is a deep learning framework written in Python and C++.",
    "Tensors have shapes, and the compiler checks them.",
    "My cat sleeps on the sofa all afternoon.",
    "The dog barks at the postman every morning.",
    "Language models predict the next token in a sequence.",
    "Sentence embeddings map similar sentences to nearby vectors.",
    "Hello world! This is a tiny corpus for a tiny tokenizer.",
]
# The trained vocabularies' sizes, which are the models' `vocab_size` and the
# Rust test types' `V`.
BERT_VOCAB = 143
GPT2_VOCAB = 320
BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_SUFFIXES = ["##ing", "##ed", "##er", "##ly"]
EOT = "<|endoftext|>"

# Mixed case and an accent (both normalised away), a word the vocabulary has
# to split into pieces, one with a character it has never seen ([UNK]), and
# sentences of different lengths, so the batch is padded.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A FAST brown fox leaps over a sleepy dog.",
    "Café au lait, with sunshine ☀ in the morning.",
    "Rust frameworks.",
]
# sentence-transformers' `max_seq_length` for the truncation check: shorter
# than two of the sentences.
TRUNCATE_TO = 8
GPT2_PROMPT = "The quick brown fox"
GPT2_NEW_TOKENS = 12


def bert_tokenizer():
    """A BERT-style WordPiece tokenizer whose vocabulary is built from
    `CORPUS` by rule: the special tokens, every character alone and as a
    `##` continuation, a few common suffixes, then the corpus' words, most
    frequent first (ties alphabetical). Not trained: `tokenizers`'
    WordPiece trainer breaks ties between equally frequent pairs (and numbers
    its `##` pieces) in hash-map order, so its vocabulary changes from run to
    run."""
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    words = Counter(w for s in CORPUS for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(s)))
    chars = sorted({c for w in words for c in w})
    vocab = {}
    for token in [*BERT_SPECIAL, *chars, *(f"##{c}" for c in chars), *BERT_SUFFIXES]:
        vocab.setdefault(token, len(vocab))
    for word, _ in sorted(words.items(), key=lambda wc: (-wc[1], wc[0])):
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.WordPiece(prefix="##")
    assert tok.get_vocab_size() == BERT_VOCAB, tok.get_vocab_size()
    assert [tok.token_to_id(t) for t in BERT_SPECIAL] == list(range(len(BERT_SPECIAL)))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def gpt2_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=GPT2_VOCAB,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    assert tok.get_vocab_size() == GPT2_VOCAB, tok.get_vocab_size()
    return tok


def save_folder(name, model, tok, max_len, **special):
    """Writes `model.save_pretrained` and the tokenizer (as `tokenizer.json`
    with the `tokenizer_config.json` that `AutoTokenizer` reads) to
    `fixtures/models/<name>/`, with the weights' header stamped and sorted
    as in `gen_model_fixtures.py`."""
    folder = MODELS / name
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder, safe_serialization=True)
    weights = folder / "model.safetensors"
    raw = weights.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.setdefault("__metadata__", {}).update(
        torch=torch.__version__, transformers=transformers.__version__, generator=GENERATOR
    )
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    weights.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    canonical_header(weights)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=max_len, **special)
    fast.save_pretrained(folder)
    # save_pretrained may add files beside the two the Rust side reads; keep
    # the folder to what a hub model folder needs.
    for extra in ("special_tokens_map.json", "generation_config.json"):
        (folder / extra).unlink(missing_ok=True)
    return folder


def f32(t):
    """Nested lists of the float32 values, each as the shortest decimal that
    reads back to it."""
    return [[float(str(np.float32(v))) for v in row] for row in t.detach().to(torch.float32).numpy()]


def bert(io):
    tok = bert_tokenizer()
    torch.manual_seed(1)
    config = BertConfig(**{**TINY_BERT, "vocab_size": BERT_VOCAB}, pad_token_id=0, attn_implementation="eager")
    model = BertModel(config, add_pooling_layer=True).eval()
    randomize(model, torch.Generator().manual_seed(20261205))
    folder = save_folder(
        "bert_text",
        model,
        tok,
        TINY_BERT["max_position_embeddings"],
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )

    hf_tok = AutoTokenizer.from_pretrained(folder)
    enc = hf_tok(SENTENCES, padding=True, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    # The Rust crate loads tokenizer.json alone: check that it is what
    # AutoTokenizer ran.
    assert [e.ids for e in tok.encode_batch(SENTENCES)] == [
        row[m.bool()].tolist() for row, m in zip(ids, mask)
    ]
    assert tok.token_to_id("[UNK]") in ids[2].tolist(), "the third sentence exercises [UNK]"
    assert any(hf_tok.convert_ids_to_tokens(i).startswith("##") for i in ids.flatten().tolist()), "word pieces"

    st = sentence_transformers.SentenceTransformer(
        modules=[
            Transformer(str(folder)),
            Pooling(TINY_BERT["hidden_size"], pooling_mode="mean"),
            Normalize(),
        ],
        device="cpu",
    )
    st_features = st.tokenize(SENTENCES)
    assert torch.equal(st_features["input_ids"], ids) and torch.equal(st_features["attention_mask"], mask)
    emb = st.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    reloaded = BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        by_hand = sentence_embedding(reloaded(input_ids=ids, attention_mask=mask).last_hidden_state, mask)
    diff = (emb - by_hand).abs().max().item()
    assert diff < 1e-6, f"sentence-transformers and the hand pooling differ by {diff}"
    cosine = emb @ emb.T
    st.max_seq_length = TRUNCATE_TO
    short = st.tokenize(SENTENCES)

    io["bert.sentences"] = SENTENCES
    io["bert.input_ids"] = ids.tolist()
    io["bert.attention_mask"] = mask.tolist()
    io["bert.embeddings"] = f32(emb)
    io["bert.cosine"] = f32(cosine)
    io["bert.truncate_to"] = TRUNCATE_TO
    io["bert.truncated_ids"] = short["input_ids"].tolist()
    io["bert.truncated_mask"] = short["attention_mask"].tolist()


def gpt2(io):
    tok = gpt2_tokenizer()
    torch.manual_seed(2)
    config = GPT2Config(**{**TINY_GPT2, "vocab_size": GPT2_VOCAB}, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    randomize(model, torch.Generator().manual_seed(20261206))
    folder = save_folder("gpt2_text", model, tok, TINY_GPT2["n_positions"], eos_token=EOT, bos_token=EOT, unk_token=EOT)

    hf_tok = AutoTokenizer.from_pretrained(folder)
    prompt = hf_tok(GPT2_PROMPT, return_tensors="pt")["input_ids"]
    assert prompt[0].tolist() == tok.encode(GPT2_PROMPT).ids
    reloaded = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = reloaded.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=GPT2_NEW_TOKENS,
            pad_token_id=0,
            eos_token_id=None,
            output_scores=True,
            return_dict_in_generate=True,
        )
    for step, scores in enumerate(out.scores):
        top = scores[0].topk(2).values
        assert top[0] - top[1] > 1e-3, f"greedy step {step} is a near tie: {top}"
    generated = out.sequences[0].tolist()
    assert len(generated) == prompt.shape[1] + GPT2_NEW_TOKENS
    text = hf_tok.decode(generated)
    assert text == tok.decode(generated), (text, tok.decode(generated))

    io["gpt2.prompt"] = GPT2_PROMPT
    io["gpt2.prompt_ids"] = prompt[0].tolist()
    io["gpt2.new_tokens"] = GPT2_NEW_TOKENS
    io["gpt2.generated_ids"] = generated
    io["gpt2.text"] = text


def main():
    MODELS.mkdir(parents=True, exist_ok=True)
    io = {
        "generator": GENERATOR,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
    }
    bert(io)
    gpt2(io)
    (MODELS / "text_io.json").write_text(json.dumps(io, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
