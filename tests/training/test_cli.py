from pathlib import Path

import pytest

from tests.training.conftest import DATA
from training.cli import main


def test_bad_data_path_is_one_line_and_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "models")])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and "nowhere" in err and err.startswith("nightjar models train: error:")
    assert not (tmp_path / "models").exists()


def test_eval_without_models_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["eval", "--models", str(tmp_path), "--data", str(DATA)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no trained target" in err


def test_non_positive_numbers_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--threads", "0", "--data", str(DATA)]) == 2
    assert "--threads must be positive" in capsys.readouterr().err


def test_unknown_subcommand_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fly"])
    assert exc.value.code == 2
