"""LiteLLM, lm-eval-harness and guidellm against a live gateway: tests/compat/run_clients.py
runs these."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.compat.client_target import WEATHER_TOOL, Pet, Target


def _ll(t: Target, **kw: Any) -> Any:
    import litellm

    msgs = kw.pop("messages", [{"role": "user", "content": "hi"}])
    return litellm.completion(
        model=f"openai/{t.model}", api_base=t.base, api_key="unused", messages=msgs, temperature=0, **kw
    )


def ll_plain(t: Target) -> None:
    assert _ll(t, max_tokens=8).choices[0].message.content


def ll_stream(t: Target) -> None:
    assert any(c.choices[0].delta.content for c in _ll(t, max_tokens=8, stream=True))


def ll_response_format(t: Target) -> None:
    done = _ll(t, max_tokens=64, response_format=Pet)
    Pet.model_validate_json(done.choices[0].message.content)


def ll_logprobs(t: Target) -> None:
    done = _ll(t, max_tokens=8, logprobs=True, top_logprobs=2)
    content = done.choices[0].logprobs["content"]
    assert len(content) == done.usage.completion_tokens, (len(content), done.usage)
    assert all(len(c["top_logprobs"]) == 2 and c["logprob"] <= 0 for c in content), content


def ll_text_completion(t: Target) -> None:
    import litellm

    prompt = "Once upon a time"
    done = litellm.text_completion(
        model=f"text-completion-openai/{t.model}",
        api_base=t.base,
        api_key="unused",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        logprobs=2,
        echo=True,
    )
    choice, usage = done.choices[0], done.usage
    assert choice.text.startswith(prompt), choice.text
    lp = choice.logprobs
    assert len(lp.tokens) == usage.prompt_tokens + usage.completion_tokens and lp.token_logprobs[0] is None, (
        lp
    )


def ll_tools(t: Target) -> None:
    done = _ll(t, max_tokens=64, tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False)
    calls = done.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", done
    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Oslo"), calls


# ---------------------------------------------------------------------------- lm-eval, guidellm


def lm_eval_task(kind: str) -> Callable[[Target], None]:
    def check(t: Target) -> None:
        from tests.compat import lm_eval_check

        assert t.model_dir is not None, "--model-dir is needed (the tokenizer lm-eval counts with)"
        lm_eval_check.run(kind, t.base, t.model, t.model_dir)

    return check


def guidellm_run(route: str, profile: str) -> Callable[[Target], None]:
    return lambda t: gl_benchmark(t, route, profile)


def gl_benchmark(t: Target, route: str, profile: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "benchmarks.json"
        tokenizer = (
            [] if t.model_dir is None else ["--tokenizer", f"kind=huggingface_auto,model={t.model_dir}"]
        )
        backend = f"kind=openai_http,target={t.base.removesuffix('/v1')},request_format={route}"
        cmd = [
            "guidellm", "run", "--backend", backend,
            "--profile", profile, "--constraint", "kind=max_duration,seconds=10",
            "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16", *tokenizer,
            "--output", f"kind=json,path={out}", "--disable-console-interactive",
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
        metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    mean = {k: metrics[k]["successful"]["mean"] for k in ("requests_per_second", "output_tokens_per_second")}
    ttft = metrics["time_to_first_token_ms"]["successful"]["median"]
    print(f"    guidellm {route} {profile}: {totals}, {mean}, TTFT median {ttft:.1f} ms")
    # incomplete: the requests in flight when the 10 s ran out (cancelled by guidellm)
    assert totals["successful"] > 0 and totals["errored"] == 0 and totals["incomplete"] <= 4, totals
