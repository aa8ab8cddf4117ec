"""Run the clients people use against a live gateway, each one only when it is installed.

    .venv/bin/python -m tests.compat.run_clients --base-url http://127.0.0.1:8000/v1 [--model NAME]

- LangChain (``langchain-openai``): ``OpenAI.batch`` (a list of prompts), ``ChatOpenAI``
  ``invoke`` and ``stream``;
- LiteLLM: ``completion`` plain and streamed through its ``openai/`` provider;
- guidellm: its default streaming benchmark for a few seconds (``guidellm benchmark`` on the
  PATH; never installed by this project: it pulls CUDA torch).

Prints one line per check (ok / skipped / FAILED with the error) and exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable


def _model(base_url: str) -> str:
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=10) as resp:
        return str(json.load(resp)["data"][0]["id"])


def langchain(base: str, model: str) -> None:
    from langchain_openai import ChatOpenAI, OpenAI

    llm = OpenAI(base_url=base, api_key="unused", model=model, max_tokens=8, temperature=0)
    outs = llm.batch(["Once upon a time", "Redis streams"])
    assert len(outs) == 2 and all(isinstance(o, str) for o in outs)
    chat = ChatOpenAI(base_url=base, api_key="unused", model=model, max_tokens=8, temperature=0)
    assert isinstance(chat.invoke("hi").content, str)
    assert "".join(str(c.content) for c in chat.stream("hi"))


def litellm(base: str, model: str) -> None:
    import litellm as ll

    msgs = [{"role": "user", "content": "hi"}]
    done = ll.completion(
        model=f"openai/{model}", api_base=base, api_key="unused", messages=msgs, max_tokens=8
    )
    assert done.choices[0].message.content is not None
    chunks = ll.completion(
        model=f"openai/{model}", api_base=base, api_key="unused", messages=msgs, max_tokens=8, stream=True
    )
    assert any(c.choices[0].delta.content for c in chunks)


def guidellm(base: str, model: str) -> None:
    cmd = [
        "guidellm", "benchmark", "--target", base.removesuffix("/v1"), "--model", model,
        "--rate-type", "synchronous", "--max-seconds", "10",
        "--data", "prompt_tokens=32,output_tokens=16",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


CHECKS: dict[str, tuple[Callable[[], bool], Callable[[str, str], None]]] = {
    "langchain-openai": (lambda: importlib.util.find_spec("langchain_openai") is not None, langchain),
    "litellm": (lambda: importlib.util.find_spec("litellm") is not None, litellm),
    "guidellm": (lambda: shutil.which("guidellm") is not None, guidellm),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default=None)
    a = ap.parse_args()
    model = a.model or _model(a.base_url)
    failed = 0
    for name, (installed, check) in CHECKS.items():
        if not installed():
            print(f"{name}: skipped (not installed)")
            continue
        try:
            check(a.base_url, model)
        except Exception as exc:  # report every client, whatever breaks
            failed += 1
            print(f"{name}: FAILED: {type(exc).__name__}: {exc}")
        else:
            print(f"{name}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
