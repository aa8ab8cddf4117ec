"""A GGUF file's metadata and tensors, read lean: the header is parsed once, the data mapped.

``gguf.GGUFReader`` builds a numpy view for every element of every metadata array (SmolLM2's
file carries ~100k tokenizer strings), which took 8 s here, and transformers' GGUF config
reader runs it again. This reader walks the header with ``struct`` (arrays of strings are
skipped by their lengths; only their element count is kept), keeps scalar metadata, and maps
tensor data with ``numpy.memmap``: SmolLM2's header in well under a second.

Format (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, metadata
count u64; each metadata entry a string key, a u32 value type and the value; then per tensor
its name, dimension count u32, dimensions u64 each (innermost first), GGML type u32 and
offset u64 from the data section, which starts at the next multiple of ``general.alignment``
(default 32) after the header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# value type -> struct format of the scalar
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
# GGML type -> (elements per block, bytes per block), for the types a file may hold
BLOCKS = {
    0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
}  # fmt: skip


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array, not materialised: its element type and length."""

    type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: outermost first ([rows, columns] for a matrix)
    type: int  # GGML type id
    offset: int  # from the start of the file
    nbytes: int


class GGUFFile:
    """``metadata`` (scalars and strings; arrays as ``ArrayInfo``), ``tensors`` by name, and
    ``raw(name)``: a tensor's bytes as a read-only ``uint8`` array of ``[rows, row_bytes]``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._f = f
            if f.read(4) != MAGIC:
                raise ValueError(f"{self.path} is not a GGUF file")
            (self.version,) = self._unpack("<I")
            if self.version not in (2, 3):
                raise ValueError(f"{self.path}: GGUF version {self.version} is not supported (2, 3)")
            n_tensors, n_kv = self._unpack("<QQ")
            self.metadata: dict[str, Any] = {}
            for _ in range(n_kv):
                key = self._string()
                (vtype,) = self._unpack("<I")
                self.metadata[key] = self._value(vtype)
            infos = []
            for _ in range(n_tensors):
                name = self._string()
                (ndim,) = self._unpack("<I")
                dims = self._unpack(f"<{ndim}Q")
                gtype, offset = self._unpack("<IQ")
                infos.append((name, tuple(int(d) for d in reversed(dims)), int(gtype), int(offset)))
            align = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
            start = -(-f.tell() // align) * align
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, gtype, offset in infos:
            if gtype not in BLOCKS:
                raise ValueError(f"{self.path}: tensor {name} has GGML type {gtype}, unknown to this reader")
            block, size = BLOCKS[gtype]
            if shape[-1] % block:
                raise ValueError(f"{self.path}: tensor {name}'s rows are not whole blocks")
            nbytes = int(np.prod(shape[:-1], dtype=np.int64)) * (shape[-1] // block) * size
            self.tensors[name] = TensorInfo(name, shape, gtype, start + offset, nbytes)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        for t in self.tensors.values():
            if t.offset + t.nbytes > self._map.size:
                raise ValueError(f"{self.path} is truncated: tensor {t.name} ends past the file")

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        data = self._f.read(size)
        if len(data) != size:
            raise ValueError(f"{self.path} ends inside its header")
        return struct.unpack(fmt, data)

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        return self._f.read(n).decode("utf-8", errors="replace")

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self._unpack("<" + _SCALARS[vtype])[0]
        if vtype == STRING:
            return self._string()
        if vtype == ARRAY:
            etype, count = self._unpack("<IQ")
            if etype in _SCALARS:
                self._f.seek(struct.calcsize("<" + _SCALARS[etype]) * count, 1)
            elif etype == STRING:
                for _ in range(count):
                    (n,) = self._unpack("<Q")
                    self._f.seek(n, 1)
            else:  # arrays of arrays: walk them
                for _ in range(count):
                    self._value(etype)
            return ArrayInfo(int(etype), int(count))
        raise ValueError(f"{self.path}: metadata value type {vtype} is not GGUF's")

    def raw(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        rows = int(np.prod(t.shape[:-1], dtype=np.int64)) if len(t.shape) > 1 else 1
        return self._map[t.offset : t.offset + t.nbytes].reshape(rows, -1)

    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def hf_config(self) -> dict[str, Any]:
        """The architecture as a Hugging Face config dict (what ``ModelConfig.from_dict`` reads),
        from the ``{arch}.*`` keys, as transformers' GGUF reader maps them."""
        arch = self.architecture()
        md = self.metadata

        def get(key: str, default: Any = None) -> Any:
            return md.get(f"{arch}.{key}", default)

        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        vocab = get("vocab_size")
        if vocab is None:
            tokens = md.get("tokenizer.ggml.tokens")
            embed = self.tensors["token_embd.weight"]
            vocab = tokens.count if isinstance(tokens, ArrayInfo) else embed.shape[0]
        rope: dict[str, Any] = {"rope_theta": float(get("rope.freq_base", 10000.0)), "rope_type": "default"}
        scaling = get("rope.scaling.type")
        if scaling not in (None, "none"):
            if scaling != "linear":
                raise ValueError(f"{self.path}: rope scaling {scaling!r} is not supported (linear only)")
            rope.update(rope_type="linear", factor=float(get("rope.scaling.factor")))
        cfg: dict[str, Any] = {
            "model_type": arch,
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(get("feed_forward_length")),
            "num_hidden_layers": int(get("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(get("attention.head_count_kv", heads)),
            "head_dim": int(get("attention.key_length", hidden // heads)),
            "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            "max_position_embeddings": int(get("context_length", 4096)),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "rope_parameters": rope,
            "hidden_act": "silu",
        }
        if get("attention.sliding_window") is not None:
            cfg["sliding_window"] = int(get("attention.sliding_window"))
        for key, name in (("eos_token_id", "eos_token_id"), ("bos_token_id", "bos_token_id")):
            if f"tokenizer.ggml.{key}" in md:
                cfg[name] = int(md[f"tokenizer.ggml.{key}"])
        return cfg
