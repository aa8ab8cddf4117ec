from pathlib import Path
from typing import Any

from training.checkpoint import write_meta
from training.report import render, write_report
from training.specs import ArchSpec, Recipe


def _meta(name: str, role: str, arch: ArchSpec, **extra: Any) -> dict[str, Any]:
    recipe = Recipe(name=name, arch=arch, domains=("stories",), steps=10, batch_size=4)
    return {"name": name, "role": role, "recipe": recipe.as_dict(), "vocab_size": 4096, "params": 1000,
            "matmul_params": arch.matmul_params(4096), "file_bytes": 2_000_000, "train_seconds": 90.0,
            "tokens_seen": 10240, "steps": 10, "seed": 0, "first_train_loss": 8.0, "final_train_loss": 3.0,
            "command": "nightjar models train --seed 0", **extra}


def test_report_tables(tmp_path: Path) -> None:
    big, small = ArchSpec(256, 6, 8, 4, 768), ArchSpec(96, 2, 4, 2, 288)
    (tmp_path / "nj-target").mkdir()
    write_meta(tmp_path / "nj-target", _meta("nj-target", "target", big,
                                             eval={"val_loss": {"stories": 1.5, "code": 2.5}}))
    (tmp_path / "nj-draft-prose").mkdir()
    write_meta(tmp_path / "nj-draft-prose", _meta(
        "nj-draft-prose", "drafter", small, teacher="nj-target", distill_windows=12, teacher_continuations=4,
        teacher_seconds=30.0,
        eval={"val_loss": {"stories": 2.0, "code": 4.0}, "agreement_forced": {"stories": 0.7, "code": 0.4},
              "agreement_continuation": {"stories": 0.8, "code": 0.5},
              "accept_len_g4": {"stories": 2.5, "code": 1.0}}))
    text = render(tmp_path)
    assert "| `nj-target` | 1.5 | 2.5 |" in text
    assert "| `nj-draft-prose` | stories | 0.700 | 0.800 | 2.50 |" in text
    ratio = big.matmul_params(4096) / small.matmul_params(4096)
    assert f"(1/{ratio:.1f} of the target)" in text
    assert "2 layers" in text and "6 layers" in text
    assert text.count("nightjar models train --seed 0") == 1  # one shared command
    assert "not trained yet: run `nightjar models train-smol-drafters`" in text
    out = write_report(tmp_path, tmp_path / "MODELS.md")
    assert out.read_text() == text
