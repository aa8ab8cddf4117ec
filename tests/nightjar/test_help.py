"""Every command's --help says what each flag does and its default: the parser of `nightjar`
and of every command it hands over (models, bench, top) is walked, every flag and positional
must carry help text, and every flag's rendered help must show its default."""

from __future__ import annotations

import argparse
import importlib

import pytest

from nightjar.cli import DELEGATED, build_parser, main


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, p: argparse.ArgumentParser) -> None:
        found.append((name, p))
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    if sub not in DELEGATED:
                        walk(f"{name} {sub}", child)

    walk("nightjar", build_parser())
    for command, (module, _) in DELEGATED.items():
        walk(f"nightjar {command}", importlib.import_module(module).build_parser())
    return found


PARSERS = _parsers()


def test_every_command_is_walked() -> None:
    names = {n for n, _ in PARSERS}
    expected = {
        "nightjar " + c
        for c in ("up", "gateway", "worker", "planner", "planner use", "submit", "models", "models train",
                  "models smollm2", "bench", "top")
    }  # fmt: skip
    assert expected <= names, expected - names


@pytest.mark.parametrize(("name", "parser"), PARSERS, ids=[n for n, _ in PARSERS])
def test_every_flag_says_what_it_does_and_its_default(name: str, parser: argparse.ArgumentParser) -> None:
    missing = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        label = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{label}: no help")
            continue
        text = parser.formatter_class(prog=parser.prog)._format_action(action)  # as --help shows it
        if action.option_strings and "default" not in text:
            missing.append(f"{label}: no default shown")
    assert not missing, f"{name}: {missing}"
    rendered = parser.format_help()
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in rendered


@pytest.mark.parametrize(
    "command", ["up", "gateway", "worker", "planner", "submit", "top", "models train", "bench"]
)
def test_help_runs_and_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main([*command.split(), "--help"])
    except SystemExit as exc:  # argparse exits after --help; `bench` returns its code
        code = int(exc.code or 0)
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: nightjar") and "default" in out
