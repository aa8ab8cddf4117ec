"""Benchmark configurations: a name, a planner policy and its parameters.

Spelled ``NAME=POLICY[:key=value,key=value]`` on the command line, e.g.
``static-2=static:gamma=2`` or ``nightjar=nightjar:drafter_policy=hedge,offload=true``.
A configuration is checked against the planner's policy registry before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from planner.policies import registry

STATIC_POLICY = "static"


@dataclass(frozen=True)
class BenchConfig:
    name: str
    policy: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def is_static(self) -> bool:
        """A fixed configuration: the ones the claim compares nightjar against."""
        return self.policy == STATIC_POLICY

    @property
    def is_no_spec(self) -> bool:
        """A static configuration that never speculates (γ = 0): the "nothing pays" baseline."""
        return self.is_static and str(self.params.get("gamma", "0")).strip() == "0"

    def spec(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.name}={self.policy}" + (f":{extra}" if extra else "")


# The line-up. Adaptive baselines whose policy is not registered (yet) are skipped
# with a note in the report, so the default works while the planner is still growing.
DEFAULT_CONFIGS = (
    "no-spec=static:gamma=0",
    "static-2=static:gamma=2",
    "static-4=static:gamma=4",
    "threshold=threshold",
    "cost-model=cost-model",
    "nightjar=nightjar",
)


def lineup(drafters: list[str], gammas: list[int]) -> list[str]:
    """What the regime verdict judges: no-spec, each static (γ, drafter) pair, and nightjar
    with its defaults (the cost rule over every drafter, offload under KV pressure). Other
    adaptive policies (threshold, cost-model, bandit) run with ``--config``."""
    if not drafters:
        raise ValueError("the line-up needs at least one drafter")
    specs = ["no-spec=static:gamma=0"]
    specs += [f"{d}-{g}=static:gamma={g},drafter={d}" for d in drafters for g in gammas]
    return [*specs, "nightjar=nightjar"]


def parse_config(spec: str) -> BenchConfig:
    """``NAME=POLICY[:k=v,...]`` (values stay strings: the registry parses them)."""
    name, sep, rest = spec.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"configuration {spec!r} is not NAME=POLICY[:key=value,...]")
    policy, _, args = rest.partition(":")
    params: dict[str, Any] = {}
    for pair in (a.strip() for a in args.split(",")):
        if not pair:
            continue
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"configuration {spec!r}: parameter {pair!r} is not key=value")
        params[key.strip()] = value.strip()
    return BenchConfig(name.strip(), policy.strip(), params)


def check_config(cfg: BenchConfig) -> None:
    """Raise registry.PolicyError when the policy or a parameter is not accepted."""
    registry.create(cfg.policy, **cfg.params)


def select_configs(specs: list[str], *, skip_unregistered: bool) -> tuple[list[BenchConfig], list[str]]:
    """The configurations to run and a note for each one left out.

    An unregistered policy is left out (with a note) only when ``skip_unregistered`` — for
    the default line-up; a configuration the user named must be valid, or this raises.
    """
    configs: list[BenchConfig] = []
    notes: list[str] = []
    known = set(registry.names())
    for spec in specs:
        cfg = parse_config(spec)
        if cfg.name in {c.name for c in configs}:
            raise ValueError(f"configuration name {cfg.name!r} is used twice")
        if cfg.policy not in known and skip_unregistered:
            notes.append(f"{cfg.name}: skipped, policy {cfg.policy!r} is not registered "
                         f"(registered: {', '.join(sorted(known))})")  # fmt: skip
            continue
        check_config(cfg)
        configs.append(cfg)
    if not configs:
        raise ValueError("no configuration to run")
    return configs, notes
