"""The three training domains (stories, shakespeare, code) with held-out validation text.

Every split is a pure function of the input files, so a given data directory and Python
version always give the same documents in the same order.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

DOMAINS = ("stories", "shakespeare", "code")
PROSE_DOMAINS = ("stories", "shakespeare")

# Directories of the standard library that are tests, data tables or generated text rather
# than ordinary hand-written Python.
_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "__pycache__", "site-packages", "encodings", "pydoc_data",
     "lib-dynload", "ensurepip", "turtledemo"}
)
_MAX_FILE_BYTES = 80_000
CODE_TRAIN_BYTES = 1_500_000
CODE_VAL_BYTES = 150_000
SHAKESPEARE_VAL_FRACTION = 0.1


class DataError(Exception):
    """The data directory is missing or lacks an expected file."""


@dataclass(frozen=True)
class Domain:
    """One domain's documents: ``train`` feeds the tokenizer and the models, ``val`` is held out."""

    name: str
    train: list[str]
    val: list[str]

    def train_bytes(self) -> int:
        return sum(len(d.encode()) for d in self.train)


def _read(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    return path.read_text(encoding="utf-8")


def _paragraphs(text: str) -> list[str]:
    """TinyStories files hold one story per paragraph, separated by blank lines."""
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def stdlib_python_files(root: str | None = None) -> list[Path]:
    """Ordinary .py files of the standard library, in a fixed pseudo-random order.

    Ordering by a hash of the relative path spreads the subset over many packages instead of
    taking one alphabetical corner of the tree.
    """
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("config-"))
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith(("test_", "_sysconfigdata")):
                continue
            path = Path(dirpath) / name
            if path.stat().st_size <= _MAX_FILE_BYTES:
                rel = path.relative_to(base).as_posix()
                found.append((hashlib.sha256(rel.encode()).hexdigest(), path))
    found.sort()
    return [p for _, p in found]


def code_domain(root: str | None = None, train_bytes: int = CODE_TRAIN_BYTES,
                val_bytes: int = CODE_VAL_BYTES) -> Domain:
    """Whole stdlib source files: the first ``val_bytes`` of them held out, the next for training."""
    train: list[str] = []
    val: list[str] = []
    used_val = used_train = 0
    for path in stdlib_python_files(root):
        try:
            text = path.read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            continue
        if not text:
            continue
        size = len(text.encode())
        if used_val < val_bytes:
            val.append(text)
            used_val += size
        elif used_train < train_bytes:
            train.append(text)
            used_train += size
        else:
            break
    if not train or not val:
        raise DataError("found too little Python source in the standard library")
    return Domain("code", train, val)


def load_domains(data_dir: str | Path, stdlib_root: str | None = None) -> dict[str, Domain]:
    """Reads ``<data_dir>/corpus`` and the standard library into the three domains."""
    corpus = Path(data_dir) / "corpus"
    if not corpus.is_dir():
        raise DataError(f"data directory {data_dir} has no corpus/ folder")
    stories = Domain(
        "stories",
        _paragraphs(_read(corpus / "tinystories_a.txt")),
        _paragraphs(_read(corpus / "tinystories_val_head.txt")),
    )
    play = _read(corpus / "tinyshakespeare.txt")
    cut = play.index("\n\n", int(len(play) * (1 - SHAKESPEARE_VAL_FRACTION)))
    # The play is one long document; its last tenth (cut at a speech boundary) is held out.
    shakespeare = Domain("shakespeare", [play[:cut].strip()], [play[cut:].strip()])
    return {"stories": stories, "shakespeare": shakespeare, "code": code_domain(stdlib_root)}
