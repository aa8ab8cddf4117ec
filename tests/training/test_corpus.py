import functools
from pathlib import Path

import pytest

from training import corpus
from training.corpus import DataError, code_domain, load_domains, stdlib_python_files


def _fake_stdlib(root: Path) -> Path:
    for rel in ("a.py", "pkg/b.py", "pkg/c.py", "test/test_x.py", "pkg/tests/t.py", "site-packages/z.py",
                "test_y.py", "notes.txt"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\nx = 1\n" * 5)
    return root


def test_stdlib_files_skip_tests_and_packages(tmp_path: Path) -> None:
    files = stdlib_python_files(str(_fake_stdlib(tmp_path)))
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == ["a.py", "pkg/b.py", "pkg/c.py"]
    assert files == stdlib_python_files(str(tmp_path))  # a fixed order


def test_code_split_holds_whole_files_out(tmp_path: Path) -> None:
    domain = code_domain(str(_fake_stdlib(tmp_path)), train_bytes=10_000, val_bytes=1)
    assert len(domain.val) == 1 and len(domain.train) == 2
    assert not set(domain.val) & set(domain.train)


def test_load_domains_splits_every_domain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "code_domain", functools.partial(code_domain, val_bytes=1))
    folder = tmp_path / "data" / "corpus"
    folder.mkdir(parents=True)
    (folder / "tinystories_a.txt").write_text("Story one.\n\nStory two.\n\n")
    (folder / "tinystories_val_head.txt").write_text("Held out story.")
    (folder / "tinyshakespeare.txt").write_text("\n\n".join(f"KING:\nLine {i}." for i in range(50)))
    domains = load_domains(tmp_path / "data", str(_fake_stdlib(tmp_path / "lib")))
    assert domains["stories"].train == ["Story one.", "Story two."]
    assert domains["stories"].val == ["Held out story."]
    play = domains["shakespeare"]
    assert play.val[0].startswith("KING:") and "Line 49." in play.val[0] and "Line 49." not in play.train[0]
    assert set(domains) == {"stories", "shakespeare", "code"}
    assert len(domains["code"].val) == 1 and len(domains["code"].train) == 2


def test_missing_data_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no corpus"):
        load_domains(tmp_path)
    (tmp_path / "corpus").mkdir()
    with pytest.raises(DataError, match=r"tinystories_a\.txt"):
        load_domains(tmp_path)
