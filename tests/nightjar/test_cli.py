from __future__ import annotations

import sys
import types
from pathlib import Path

import anyio
import pytest

from nightjar import commands, options
from nightjar.cli import build_parser, main
from planner.policies import registry
from planner.settings import DEFAULT_POLICY
from shared import codec, keys
from shared.connection import connect, reset_fake_server
from shared.control import PolicyCommand
from worker.settings import WorkerSettings


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no usage dump, no traceback
    assert err.startswith("nightjar: error: ")
    return err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["gateway", "--port", "eighty"],
        ["worker", "--model", "/nonexistent"],
        ["up", "--model", "/nonexistent"],
        ["planner", "--set", "gamma"],
        ["planner", "--policy", "nope"],
        ["planner", "use", "static", "--set", "colour=red"],
        ["planner", "--valid-for", "0"],
        ["--log-level", "loud", "up"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    assert code == 2
    _error_line(capsys)


TARGET = str(options.BUNDLED_MODEL)


def test_environment_gives_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NIGHTJAR_PORT", "9001")
    monkeypatch.setenv("NIGHTJAR_REDIS_URL", "redis://h:1/3")
    monkeypatch.setenv("NIGHTJAR_MAX_JOBS", "4")
    args = build_parser().parse_args(["up", "--model", TARGET])
    gw, wk = commands.gateway_config(args, False), commands.worker_config(args, False)
    assert (gw.port, gw.redis_url, wk.redis_url, wk.max_jobs) == (9001, "redis://h:1/3", "redis://h:1/3", 4)
    args = build_parser().parse_args(["up", "--port", "9002", "--model", TARGET])
    assert commands.gateway_config(args, False).port == 9002  # a flag wins over the environment
    monkeypatch.setenv("NIGHTJAR_DECISION_VALID_FOR_S", "4.5")
    assert commands.planner_config(build_parser().parse_args(["planner"]), True).valid_for_s == 4.5


def test_up_gives_the_planner_the_port_after_the_workers_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `up` one NIGHTJAR_METRICS_PORT reaches the worker and the planner: they must not
    both bind it. The worker keeps it, the planner takes the next one; alone, each keeps it."""
    monkeypatch.setenv("NIGHTJAR_METRICS_PORT", "9100")
    args = build_parser().parse_args(["up", "--model", TARGET])
    assert commands.worker_config(args, False).metrics_port == 9100
    assert commands.planner_config(args, False).metrics_port == 9101
    assert commands.planner_config(build_parser().parse_args(["planner"]), True).metrics_port == 9100
    assert [commands.up_planner_metrics_port(p) for p in (None, 0, 65535)] == [None, 0, None]


def test_command_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` embeds its store; the services started alone use the local Redis; a worker
    started from the command line profiles (an embedded one does not unless asked)."""
    monkeypatch.delenv("NIGHTJAR_REDIS_URL", raising=False)
    monkeypatch.delenv("NIGHTJAR_PROFILE", raising=False)
    up = build_parser().parse_args(["up", "--model", TARGET])
    assert commands.gateway_config(up, False).redis_url == "memory://"
    assert commands.worker_config(up, False).profile is True
    worker = build_parser().parse_args(["worker", "--model", TARGET])
    assert commands.worker_config(worker, True).redis_url == "redis://127.0.0.1:6379/0"
    gateway = build_parser().parse_args(["gateway"])
    assert commands.gateway_config(gateway, True).redis_url == "redis://127.0.0.1:6379/0"
    assert WorkerSettings(model_dir=TARGET).profile is False


def test_planner_and_up_run_the_one_default_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """planner.settings.DEFAULT_POLICY (nightjar), a registered name, is what both commands run."""
    monkeypatch.delenv("NIGHTJAR_POLICY", raising=False)
    assert DEFAULT_POLICY == "nightjar" and DEFAULT_POLICY in registry.names()
    assert commands.planner_config(build_parser().parse_args(["planner"]), True).policy == DEFAULT_POLICY
    up = build_parser().parse_args(["up", "--model", TARGET])
    assert commands.planner_config(up, False).policy == DEFAULT_POLICY


def test_a_bad_environment_value_is_one_line_naming_flag_and_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NIGHTJAR_MAX_QUEUE", "0")
    assert main(["gateway"]) == 2
    assert "--max-queue / NIGHTJAR_MAX_QUEUE" in _error_line(capsys)


def test_planner_use_sends_a_policy_command(capsys: pytest.CaptureFixture[str]) -> None:
    reset_fake_server()
    assert main(["planner", "--redis-url", "memory://", "use", "static", "--set", "gamma=2"]) == 0
    assert "static" in capsys.readouterr().out

    async def read() -> list[PolicyCommand]:
        r = connect("memory://")
        return [
            codec.decode_as(f[codec.FIELD], PolicyCommand)
            for _, f in await r.xrange(keys.PLANNER_CONTROL_STREAM)
        ]

    (cmd,) = anyio.run(read)
    assert cmd.policy == "static" and cmd.params == {"gamma": "2"} and cmd.requested_by == "cli"


def test_models_delegates_to_training_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("training.cli")
    fake.main = lambda argv: seen.append(argv) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "training.cli", fake)
    assert main(["models", "train", "--out", "x"]) == 7
    assert seen == [["train", "--out", "x"]]


def test_bench_delegates_to_the_load_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("benchmarks.load.cli")
    fake.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.load.cli", fake)
    assert main(["bench", "w.jsonl", "--phases", "low:1:5"]) == 0
    assert seen == [["w.jsonl", "--phases", "low:1:5"]]


def _model(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_drafters_default_to_the_bundled_ones_that_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(options, "MODELS_DIR", tmp_path / "models")
    monkeypatch.delenv("NIGHTJAR_DRAFTERS", raising=False)
    target = _model(tmp_path / "models" / "nj-target")
    prose = _model(tmp_path / "models" / "nj-draft-prose")
    assert options.drafter_dirs(str(target), None) == [str(prose)]  # nj-draft-code is not there
    other = _model(tmp_path / "elsewhere" / "nj-target")
    assert options.drafter_dirs(str(other), None) == []
    # models/X may be a link to an export kept elsewhere: still the bundled model's drafters
    export = _model(tmp_path / "exports" / "smollm2")
    heads = [_model(tmp_path / "models" / n) for n in ("smol-eagle-chat", "smol-eagle-code")]
    (tmp_path / "models" / "smollm2-135m-instruct").symlink_to(export)
    linked = str(tmp_path / "models" / "smollm2-135m-instruct")
    assert options.drafter_dirs(linked, None) == [str(h) for h in heads]
    assert options.drafter_dirs(str(target), ["none"]) == []
    assert options.drafter_dirs(str(target), [str(other)]) == [str(other)]
    monkeypatch.setenv("NIGHTJAR_DRAFTERS", f"{prose}, {other}")
    args = build_parser().parse_args(["worker", "--model", str(target)])
    assert list(commands.worker_config(args, True).drafters or ()) == [str(prose), str(other)]
    args = build_parser().parse_args(["up", "--model", str(target), "--drafter", "none", "--no-ngram"])
    settings = commands.worker_config(args, False)
    assert settings.drafters == () and settings.ngram is False
    args = build_parser().parse_args(["up", "--drafter", "a", "--drafter", "b"])
    assert args.drafters == ["a", "b"]
    assert commands.worker_config(build_parser().parse_args(["worker", "--model", str(target)]), True).ngram


def test_profile_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NIGHTJAR_PROFILE", raising=False)
    args = build_parser().parse_args(["worker", "--model", TARGET])
    s = commands.worker_config(args, True)
    assert s.profile is True and s.profile_budget_s == 60.0 and s.profile_cache is True
    args = build_parser().parse_args(["up", "--model", TARGET, "--no-profile", "--profile-budget", "15"])
    s = commands.worker_config(args, False)
    assert s.profile is False and s.profile_budget_s == 15.0
    assert s.profiling().enabled is False and s.profiling().budget_s == 15.0
    monkeypatch.setenv("NIGHTJAR_PROFILE", "0")
    assert (
        commands.worker_config(build_parser().parse_args(["worker", "--model", TARGET]), True).profile
        is False
    )


def test_a_missing_drafter_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _model(tmp_path / "t")
    assert main(["worker", "--model", str(target), "--drafter", str(tmp_path / "nope")]) == 2
    assert "no drafter model at" in _error_line(capsys)


def test_gateway_security_and_limit_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from nightjar.commands import _gateway_app

    monkeypatch.setenv("NIGHTJAR_API_KEYS", "k1, k2,")
    monkeypatch.setenv("NIGHTJAR_RESULT_TTL_S", "3600")
    args = build_parser().parse_args(["gateway", "--redis-url", "memory://", "--rate-limit", "5"])
    s = _gateway_app(args, True).state.settings
    assert s.api_keys == ("k1", "k2") and s.rate_limit_rps == 5 and s.result_ttl_s == 3600
    assert s.max_body_bytes == 4 * 1024 * 1024 and s.request_timeout_s == 600
    assert s.outage_grace_s == 30
    args = build_parser().parse_args(
        [
            "gateway",
            "--redis-url",
            "memory://",
            "--api-key",
            "a",
            "--api-key",
            "b",
            "--rate-burst",
            "9",
            "--request-timeout",
            "30",
            "--max-body-bytes",
            "1000",
            "--max-concurrency",
            "10",
            "--outage-grace",
            "5",
        ]
    )
    s = _gateway_app(args, True).state.settings
    assert s.outage_grace_s == 5
    assert s.api_keys == ("a", "b") and s.rate_limit_burst == 9 and s.request_timeout_s == 30
    assert (s.max_body_bytes, s.max_concurrency) == (1000, 10)
    monkeypatch.delenv("NIGHTJAR_API_KEYS")
    assert commands.gateway_config(build_parser().parse_args(["gateway"]), True).api_keys == ()
    args = build_parser().parse_args(["up", "--result-ttl", "60", "--model", TARGET])
    # one --result-ttl for the gateway and the worker of `up`
    assert (
        commands.gateway_config(args, False).result_ttl_s
        == commands.worker_config(args, False).result_ttl_s
        == 60
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["gateway", "--max-queue", "0"],
        ["gateway", "--request-timeout", "0"],
        ["gateway", "--rate-limit", "-1"],
        ["gateway", "--max-body-bytes", "0"],
        ["gateway", "--outage-grace", "-1"],
    ],
)
def test_bad_gateway_limits_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    _error_line(capsys)
