"""``nightjar submit``: stream one completion from a running gateway to stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx


def stream_completion(
    url: str, body: dict[str, Any], chat: bool, timeout_s: float = 600.0, api_key: str | None = None
) -> int:
    """Print the completion as it arrives; returns a process exit code."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with (
            httpx.Client(base_url=url, timeout=timeout_s, headers=headers) as client,
            client.stream("POST", path, json={**body, "stream": True}) as resp,
        ):
            if resp.status_code != 200:
                resp.read()
                print(f"nightjar: error: {resp.status_code}: {_message(resp.text)}", file=sys.stderr)
                return 2 if 400 <= resp.status_code < 500 else 1
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    print(f"\nnightjar: error: {chunk['error'].get('message')}", file=sys.stderr)
                    return 1
                for choice in chunk.get("choices", []):
                    text = choice["delta"].get("content", "") if chat else choice.get("text", "")
                    sys.stdout.write(text)
                    sys.stdout.flush()
    except httpx.HTTPError as exc:
        print(f"nightjar: error: cannot reach the gateway at {url}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write("\n")
    return 0


def _message(text: str) -> str:
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:200]
