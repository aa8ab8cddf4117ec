"""Speculation is on by default: `nightjar up`, `nightjar planner` and an embedded planner
start the nightjar policy (its defaults: the cost rule over every profiled drafter, offload
under KV pressure), defined once (planner/settings.py, DEFAULT_POLICY)."""

from __future__ import annotations

import pytest

from nightjar import commands
from nightjar.cli import build_parser
from planner.policies import registry
from planner.settings import DEFAULT_POLICY, PlannerSettings


@pytest.mark.parametrize("command", ["up", "planner"])
def test_the_default_policy_is_nightjar_with_offload(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NIGHTJAR_POLICY", raising=False)
    settings = commands.planner_config(build_parser().parse_args([command]), command == "planner")
    assert settings.policy == DEFAULT_POLICY == "nightjar" and settings.params == {}
    assert PlannerSettings().policy == DEFAULT_POLICY  # an embedded planner: the same default
    params = {name: p["default"] for name, p in registry.describe("nightjar")["params"].items()}
    assert params["offload"] is True and params["calibrate"] is True


def test_the_environment_still_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTJAR_POLICY", "static")
    assert commands.planner_config(build_parser().parse_args(["planner"]), True).policy == "static"
