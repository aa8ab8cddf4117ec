"""The same model as a GGUF file of another precision, for side-by-side benchmarks.

``write_variant(src, dst, "F32")`` copies every metadata entry of ``src`` (architecture,
tokenizer, chat template: what llama-server needs) and writes each matrix in the new type:
dequantised by the gguf package (for F32 these are exactly the values of the fp32 export,
which is the same dequantisation), then quantised again (F16, BF16, Q8_0, Q4_0, Q4_1; a lower
precision than the source loses what rounding loses). Vectors (norms) stay F32. Used by
``benchmarks.vs_llamacpp`` and ``benchmarks.precision_cost``; by hand:

    python -m benchmarks.gguf_variants SRC.gguf DST.gguf F32
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# general.file_type (llama.cpp's llama_ftype) of a file whose matrices are all of one type
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "BF16": 32}


def write_variant(src: Path, dst: Path, qtype: str) -> Path:
    """``dst``: ``src``'s model with its matrices in ``qtype`` (written to a temporary name,
    then renamed; an existing ``dst`` is kept as it is)."""
    import gguf
    from gguf import GGMLQuantizationType as Q

    if dst.exists():
        return dst
    kind = Q[qtype]
    reader = gguf.GGUFReader(str(src))
    tmp = dst.with_name(dst.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch=str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == "general.file_type":
            value = FILE_TYPES[qtype]
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, field.types[0], sub_type=sub)
    for t in reader.tensors:
        values = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        values = values.reshape(shape)
        if len(shape) == 1 or kind == Q.F32:
            writer.add_tensor(t.name, np.ascontiguousarray(values))
        elif kind == Q.F16:
            writer.add_tensor(t.name, np.ascontiguousarray(values.astype(np.float16)))
        else:
            writer.add_tensor(t.name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(dst)
    return dst


def main(argv: list[str] | None = None) -> int:
    doc = (__doc__ or "").splitlines()[0]
    p = argparse.ArgumentParser(prog="python -m benchmarks.gguf_variants", description=doc)
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("type", choices=sorted(FILE_TYPES))
    args = p.parse_args(argv)
    print(write_variant(args.src, args.dst, args.type))
    return 0


if __name__ == "__main__":
    sys.exit(main())
