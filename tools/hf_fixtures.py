"""What the Hugging Face model fixture generators (`gen_model_fixtures.py`,
`gen_llama_fixtures.py`) share: an io file that keeps its stored values
across reruns, `save_pretrained` files copied into `fixtures/models/` with the
versions recorded, greedy generation with a safe margin, and the
intermediate outputs (`output_hidden_states`, `output_attentions`)."""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file

from fixture_file import OUT, FixtureFile, canonical_header

MODELS = OUT / "models"
# `--fresh` rewrites the io files from this run and drops the checks that a
# rerun reproduces the committed weights.
FRESH = "--fresh" in sys.argv[1:]


class KeptIo(FixtureFile):
    """An io file whose stored values are kept when a rerun reproduces them:
    float results move by an ulp or so between CPUs (kernel dispatch), so
    when the file exists every entry is recomputed and checked against the
    stored one (integers exactly, floats within `KEEP_ATOL`), the stored
    value is kept, and only keys the file lacks are added; reruns are thus
    byte-identical on any machine. Subclasses set `GENERATOR` and
    `KEEP_ATOL`."""

    KEEP_ATOL = None

    def save(self):
        """Writes the file, keeping the values of the entries it already has
        (unless `--fresh`) once they agree with this run's."""
        path = OUT / f"{self.name}.safetensors"
        if path.exists() and not FRESH:
            old = load_file(str(path))
            stale = sorted(set(old) - set(self.tensors))
            assert not stale, f"{path} has keys this generator no longer writes: {stale} (rerun with --fresh)"
            moved = []
            for key, kept in old.items():
                new = self.tensors[key]
                assert (new.dtype, new.shape) == (kept.dtype, kept.shape), (key, new.dtype, new.shape, kept.dtype, kept.shape)
                if kept.is_floating_point():
                    diff = (new - kept).abs().max().item() if new.numel() else 0.0
                    atol = self.KEEP_ATOL
                    assert diff <= atol, f"{key} moved by {diff:e} (> {atol:e}); rerun with --fresh if meant"
                    if diff:
                        moved.append(f"{key} ({diff:.1e})")
                else:
                    assert torch.equal(new, kept), f"{key} changed; rerun with --fresh if meant"
                self.tensors[key] = kept
            added = sorted(set(self.tensors) - set(old))
            print(f"{path.name}: kept {len(old)} stored entries ({len(moved)} off this run by float error: {', '.join(moved) or 'none'})")
            print(f"{path.name}: added {len(added)}: {', '.join(added) or 'none'}")
        return super().save()


def stamp(path, generator):
    """Adds the torch and transformers versions and the generator to the
    header's metadata (beside `save_pretrained`'s `"format": "pt"`); the
    tensors and their offsets are untouched."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header.setdefault("__metadata__", {}).update(
        torch=torch.__version__, transformers=transformers.__version__, generator=generator
    )
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def save_hf(model, name, generator):
    """Saves the model as `save_pretrained` writes it and copies its
    `model.safetensors` to `fixtures/models/<name>.safetensors`, stamped;
    unless `--fresh`, a rerun must give the committed weights bit for bit."""
    dst = MODELS / f"{name}.safetensors"
    committed = load_file(str(dst)) if dst.exists() and not FRESH else None
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        if committed is not None:
            new = load_file(str(Path(d) / "model.safetensors"))
            assert set(new) == set(committed) and all(
                new[k].dtype == committed[k].dtype and torch.equal(new[k], committed[k]) for k in new
            ), f"{dst}: this run's weights differ from the committed ones"
        shutil.copyfile(Path(d) / "model.safetensors", dst)
    stamp(dst, generator)
    canonical_header(dst)
    return dst


def greedy(model, prompt, new_tokens, margin):
    """`generate(do_sample=False, max_new_tokens=new_tokens)` from `prompt`
    (`[1, len]`), checking that every choice wins by more than `margin`, far
    above float error, so the Rust tests may demand the exact tokens.
    Returns the prompt followed by the new tokens."""
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            do_sample=False,
            max_new_tokens=new_tokens,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    for step, scores in enumerate(out.scores):
        top = scores[0].topk(2).values
        assert top[0] - top[1] > margin, f"greedy step {step} is a near tie: {top}"
    return out.sequences


def with_last_output(layer, run):
    """`run()` with `layer`'s raw output caught on its way out (the last
    layer's, which `output_hidden_states` replaces with the final norm's):
    returns both."""
    seen = []
    hook = layer.register_forward_hook(lambda m, args, y: seen.append(y[0] if isinstance(y, tuple) else y))
    try:
        out = run()
    finally:
        hook.remove()
    (raw,) = seen
    return out, raw


def assert_causal(attentions, length):
    """Every probability above the diagonal exactly 0, the others positive."""
    causal = torch.ones(length, length, dtype=torch.bool).triu(1)
    for a in attentions:
        assert torch.all(a[..., causal] == 0) and torch.all(a[..., ~causal] > 0), "causal"


def put_intermediates(io, prefix, out, layers):
    """`<prefix>.hidden_states.{i}` and `<prefix>.attentions.{i}` of `out`,
    a model's output for `output_hidden_states=True, output_attentions=True`."""
    hidden, attn = out.hidden_states, out.attentions
    assert len(hidden) == layers + 1 and len(attn) == layers, (len(hidden), len(attn))
    for i, h in enumerate(hidden):
        io.put(f"{prefix}.hidden_states.{i}", h)
    for i, a in enumerate(attn):
        assert torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5), f"{prefix}.attentions.{i}: rows sum to 1"
        io.put(f"{prefix}.attentions.{i}", a)
