"""What both fixture generators share: a named set of tensors written to
`tools/fixtures/<name>.safetensors` with the torch version and the generator
recorded, byte-identical across reruns."""
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parent / "fixtures"


class FixtureFile:
    """The tensors of one fixture file. Subclasses set `GENERATOR` and add
    their input-drawing helpers on top of `self.g`."""

    GENERATOR = None

    def __init__(self, name, seed):
        self.name = name
        self.tensors = {}
        self.g = torch.Generator().manual_seed(seed)

    def put(self, key, t):
        assert key not in self.tensors, f"duplicate key {key}"
        assert isinstance(t, torch.Tensor), key
        self.tensors[key] = t.detach().clone().contiguous()
        return t

    def save(self):
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"{self.name}.safetensors"
        save_file(self.tensors, str(path), metadata={"torch": torch.__version__, "generator": self.GENERATOR})
        canonical_header(path)
        return path


def layout(model):
    """The keys and shapes of `model.state_dict()`, in order, as JSON lists
    (for the layout files of full-size models built on the `meta` device)."""
    return [[k, list(v.shape)] for k, v in model.state_dict().items()]


def canonical_header(path):
    """Rewrites the safetensors header with sorted metadata keys.

    The writer serialises `__metadata__` from a hash map, so its key order (and
    thus the file's bytes) varies between runs; sorting makes reruns
    byte-identical. Tensor entries keep their order and data offsets.
    """
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    ordered = {"__metadata__": dict(sorted(meta.items()))} if meta else {}
    ordered.update(header)
    text = json.dumps(ordered, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])
    path.chmod(0o644)  # the writer creates files readable by the owner only
