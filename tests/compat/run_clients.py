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
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list (offline)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from tests.compat.checks_langchain import (
    lc_batch,
    lc_invoke,
    lc_json_mode,
    lc_logprobs,
    lc_stream,
    lc_structured_function_calling,
    lc_structured_json_schema,
    lc_structured_stream,
    lc_tool_result_turn,
    lc_tools_named,
    lc_tools_required_stream,
)
from tests.compat.checks_others import (
    guidellm_run,
    ll_logprobs,
    ll_plain,
    ll_response_format,
    ll_stream,
    ll_text_completion,
    ll_tools,
    lm_eval_task,
)
from tests.compat.client_target import Target, model_id

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
            "local-completions loglikelihood (multiple_choice)": lm_eval_task("loglikelihood"),
            "local-completions loglikelihood_rolling": lm_eval_task("rolling"),
            "local-completions generate_until": lm_eval_task("generate_until"),
            "local-chat-completions generate_until (apply_chat_template)": lm_eval_task("chat"),
        },
    ),
    Client(
        "guidellm",
        lambda: shutil.which("guidellm") is not None,
        {
            "run: /v1/chat/completions streamed, synchronous, 10 s, synthetic": guidellm_run(
                "/v1/chat/completions", "kind=synchronous"
            ),
            "run: /v1/completions streamed, 4 concurrent, 10 s, synthetic": guidellm_run(
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
    model = a.model or model_id(base)
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
