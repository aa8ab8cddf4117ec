"""Speculation is on by default: `nightjar up` and `nightjar planner` start the nightjar policy
(its defaults: the cost rule over every profiled drafter, offload under KV pressure)."""

from __future__ import annotations

import pytest

from nightjar.cli import build_parser
from planner.policies import registry


@pytest.mark.parametrize("command", ["up", "planner"])
def test_the_default_policy_is_nightjar_with_offload(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NIGHTJAR_POLICY", raising=False)
    args = build_parser().parse_args([command])
    assert args.policy == "nightjar" and not args.set
    params = {name: p["default"] for name, p in registry.describe("nightjar")["params"].items()}
    assert params["offload"] is True and params["calibrate"] is True


def test_the_environment_still_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTJAR_POLICY", "static")
    assert build_parser().parse_args(["planner"]).policy == "static"
