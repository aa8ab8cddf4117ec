"""Run the clients people use against a live gateway, each one only when it is installed.

    python -m tests.compat.run_clients --base-url http://127.0.0.1:8000/v1 [--model NAME]
        [--model-dir models/nj-target] [--only langchain-openai,litellm] [--markdown]

Run it from a separate environment that has the clients (none is in the project's venv:
guidellm and lm-eval pull torch), with the repository on PYTHONPATH; see docs/api.md.

- LangChain (``langchain-openai``): ``OpenAI.batch``, ``ChatOpenAI`` ``invoke``, ``stream``
  (with usage) and logprobs, ``with_structured_output`` (``json_schema`` whole and streamed,
  ``function_calling``, ``json_mode``),
  ``bind_tools`` with a named and a required ``tool_choice`` (whole and streamed) and a
  tool-result turn;
- LiteLLM: ``completion`` plain, streamed, with a ``response_format`` schema, with
  ``logprobs``/``top_logprobs`` and with ``tools``; ``text_completion`` with echo + logprobs;
- lm-eval-harness: its ``local-completions`` model on tiny tasks of its own
  (tests/compat/lm_eval_check.py): loglikelihood (echo + logprobs), rolling loglikelihood and
  ``generate_until``, the loglikelihoods against the model's own forward pass (``--model-dir``);
- guidellm: its streaming benchmark for 10 s on synthetic data, chat (synchronous) and
  completions (4 concurrent streams).

Prints one line per check (ok / skipped / FAILED with the error) and exits 1 if any failed;
``--markdown`` also prints the results as the rows of docs/api.md's table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list (offline)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@dataclass(frozen=True)
class Target:
    base: str  # .../v1
    model: str
    model_dir: Path | None  # the served model's directory (tokenizer, reference forward)


class Pet(BaseModel):
    """A pet (the structured-output checks' schema: it ends in a few tokens)."""

    kind: Literal["cat", "dog", "bird"]
    legs: int = Field(ge=0, le=8)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,  # else the tiny model's greedy JSON may add keys until max_tokens
        },
    },
}


def _model(base_url: str) -> str:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


# ---------------------------------------------------------------------------- LangChain


def _chat(t: Target, max_tokens: int = 8) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=t.base, api_key="unused", model=t.model, max_tokens=max_tokens, temperature=0)


def lc_batch(t: Target) -> None:
    from langchain_openai import OpenAI

    llm = OpenAI(base_url=t.base, api_key="unused", model=t.model, max_tokens=8, temperature=0)
    outs = llm.batch(["Once upon a time", "Redis streams"])
    assert len(outs) == 2 and all(isinstance(o, str) and o for o in outs), outs
    assert "".join(llm.stream("Once upon a time")) == outs[0]  # greedy: the same text streamed


def lc_invoke(t: Target) -> None:
    content = _chat(t).invoke("hi").content
    assert isinstance(content, str) and content, content


def lc_stream(t: Target) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=t.base, api_key="unused", model=t.model, max_tokens=8, stream_usage=True)
    acc = None
    for chunk in chat.stream("hi"):
        acc = chunk if acc is None else acc + chunk
    assert acc is not None and acc.content, acc
    assert acc.usage_metadata and acc.usage_metadata["output_tokens"] > 0, acc.usage_metadata


def lc_logprobs(t: Target) -> None:
    msg = _chat(t).bind(logprobs=True, top_logprobs=2).invoke("hi")
    content = msg.response_metadata["logprobs"]["content"]
    assert content and all(len(c["top_logprobs"]) == 2 for c in content), content


def _lc_structured(t: Target, method: str) -> None:
    llm = _chat(t, 64).with_structured_output(Pet, method=method, strict=True)  # closed objects
    got = llm.invoke("Describe a pet as JSON.")
    assert isinstance(got, Pet), got


def lc_structured_json_schema(t: Target) -> None:
    _lc_structured(t, "json_schema")


def lc_structured_function_calling(t: Target) -> None:
    _lc_structured(t, "function_calling")


def lc_structured_stream(t: Target) -> None:
    last = None
    for part in _chat(t, 64).with_structured_output(Pet, method="json_schema", strict=True).stream("A pet?"):
        last = part
    assert isinstance(last, Pet), last


def lc_json_mode(t: Target) -> None:
    got = _chat(t, 64).with_structured_output(None, method="json_mode").invoke("Reply in JSON.")
    assert isinstance(got, dict), got


def _lc_weather_call(msg: Any) -> dict[str, Any]:
    calls = msg.tool_calls
    assert len(calls) >= 1 and calls[0]["name"] == "get_weather", calls
    assert calls[0]["args"].get("city") in ("Paris", "Oslo"), calls
    return dict(calls[0])


def lc_tools_named(t: Target) -> None:
    _lc_weather_call(_chat(t, 64).bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke("Weather?"))


def lc_tools_required_stream(t: Target) -> None:
    acc = None
    chat = _chat(t, 64).bind_tools([WEATHER_TOOL], tool_choice="any", parallel_tool_calls=False)
    for chunk in chat.stream("Weather?"):
        acc = chunk if acc is None else acc + chunk
    _lc_weather_call(acc)


def lc_tool_result_turn(t: Target) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage

    chat = _chat(t, 64).bind_tools([WEATHER_TOOL], tool_choice="get_weather")
    question = HumanMessage("Weather in Paris?")
    ai = chat.invoke([question])
    call = _lc_weather_call(ai)
    answer = (
        _chat(t, 8)
        .bind_tools([WEATHER_TOOL], tool_choice="none")
        .invoke([question, ai, ToolMessage("sunny, 21 C", tool_call_id=call["id"])])
    )
    assert isinstance(answer.content, str) and not answer.tool_calls, answer


# ---------------------------------------------------------------------------- LiteLLM


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


def _lm_eval(kind: str) -> Callable[[Target], None]:
    def check(t: Target) -> None:
        from tests.compat import lm_eval_check

        assert t.model_dir is not None, "--model-dir is needed (the tokenizer lm-eval counts with)"
        lm_eval_check.run(kind, t.base, t.model, t.model_dir)

    return check


def _guidellm(route: str, profile: str) -> Callable[[Target], None]:
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


# ---------------------------------------------------------------------------- the table


def _has(module: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class Client:
    name: str  # the distribution (its version is reported)
    installed: Callable[[], bool]
    checks: dict[str, Callable[[Target], None]]


CLIENTS = [
    Client(
        "langchain-openai",
        _has("langchain_openai"),
        {
            "OpenAI.batch, OpenAI.stream": lc_batch,
            "ChatOpenAI.invoke": lc_invoke,
            "ChatOpenAI.stream (stream_usage)": lc_stream,
            "ChatOpenAI logprobs + top_logprobs": lc_logprobs,
            "with_structured_output(json_schema)": lc_structured_json_schema,
            "with_structured_output(function_calling)": lc_structured_function_calling,
            "with_structured_output(json_schema) streamed": lc_structured_stream,
            "with_structured_output(json_mode)": lc_json_mode,
            "bind_tools, tool_choice named": lc_tools_named,
            "bind_tools, tool_choice any (required), one call, streamed": lc_tools_required_stream,
            "tool result turn (ToolMessage)": lc_tool_result_turn,
        },
    ),
    Client(
        "litellm",
        _has("litellm"),
        {
            "completion": ll_plain,
            "completion stream": ll_stream,
            "completion response_format (pydantic)": ll_response_format,
            "completion logprobs + top_logprobs": ll_logprobs,
            "completion tools, tool_choice required, one call": ll_tools,
            "text_completion echo + logprobs": ll_text_completion,
        },
    ),
    Client(
        "lm-eval",
        _has("lm_eval"),
        {
            "local-completions loglikelihood (multiple_choice)": _lm_eval("loglikelihood"),
            "local-completions loglikelihood_rolling": _lm_eval("rolling"),
            "local-completions generate_until": _lm_eval("generate_until"),
            "local-chat-completions generate_until (apply_chat_template)": _lm_eval("chat"),
        },
    ),
    Client(
        "guidellm",
        lambda: shutil.which("guidellm") is not None,
        {
            "run: /v1/chat/completions streamed, synchronous, 10 s, synthetic": _guidellm(
                "/v1/chat/completions", "kind=synchronous"
            ),
            "run: /v1/completions streamed, 4 concurrent, 10 s, synthetic": _guidellm(
                "/v1/completions", "kind=concurrent,streams=4"
            ),
        },
    ),
]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default=None)
    ap.add_argument("--model-dir", type=Path, default=None, help="default: models/<model> when it exists")
    ap.add_argument("--only", default="", help="comma-separated client names")
    ap.add_argument("--markdown", action="store_true", help="also print docs/api.md table rows")
    a = ap.parse_args()
    base = a.base_url.rstrip("/")
    model = a.model or _model(base)
    model_dir = a.model_dir or (Path("models") / model if (Path("models") / model).is_dir() else None)
    target = Target(base, model, model_dir.resolve() if model_dir else None)
    wanted = {n for n in a.only.split(",") if n}
    rows: list[tuple[str, str, str, str]] = []
    for client in CLIENTS:
        if wanted and client.name not in wanted:
            continue
        if not client.installed():
            print(f"{client.name}: skipped (not installed)", flush=True)
            continue
        version = _version(client.name)
        for check_name, check in client.checks.items():
            try:
                check(target)
            except Exception as exc:  # report every check, whatever breaks
                outcome = f"FAILED: {type(exc).__name__}: {str(exc)[:1500]}"
            else:
                outcome = "ok"
            print(f"{client.name} {version} | {check_name}: {outcome}", flush=True)
            rows.append((client.name, version, check_name, outcome.split(":")[0]))
    if a.markdown:
        today = datetime.datetime.now(datetime.UTC).date().isoformat()
        for row in rows:
            print(f"| {' | '.join(row)} | {today} |")
    return 1 if any(r[3] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
