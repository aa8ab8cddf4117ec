"""Configurations: parsing, checking against the policy registry, the default line-up."""

from __future__ import annotations

import pytest

from benchmarks.load.configs import DEFAULT_CONFIGS, BenchConfig, parse_config, select_configs
from planner.policies import registry


def test_parse_config_reads_name_policy_and_params() -> None:
    cfg = parse_config("static-2=static:gamma=2")
    assert cfg == BenchConfig("static-2", "static", {"gamma": "2"})
    assert cfg.is_static
    assert cfg.spec() == "static-2=static:gamma=2"
    assert parse_config("nj=nightjar").params == {}


@pytest.mark.parametrize("spec", ["static", "=static", "x=", "x=static:gamma"])
def test_parse_config_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_config(spec)


def test_named_configs_must_be_valid() -> None:
    with pytest.raises(registry.PolicyError):
        select_configs(["x=static:gamma=99"], skip_unregistered=False)
    with pytest.raises(registry.PolicyError):
        select_configs(["x=no_such_policy"], skip_unregistered=False)
    with pytest.raises(ValueError, match="twice"):
        select_configs(["a=static", "a=static:gamma=2"], skip_unregistered=False)


def test_default_line_up_runs_what_is_registered_and_notes_the_rest() -> None:
    configs, notes = select_configs(list(DEFAULT_CONFIGS), skip_unregistered=True)
    known = set(registry.names())
    assert [c.name for c in configs][:3] == ["no-spec", "static-2", "static-4"]
    assert all(c.policy in known for c in configs)
    skipped = [parse_config(s).name for s in DEFAULT_CONFIGS if parse_config(s).policy not in known]
    assert len(notes) == len(skipped)
    assert all(any(note.startswith(name) for note in notes) for name in skipped)
