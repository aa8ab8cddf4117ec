"""``nightjar chat``: chat with a running gateway in the terminal, each token coloured by who
made it — an accepted draft (green) or the target's own token (blue) — with a status line
after every answer: the drafter, γ, acceptance and tokens/s.

It streams ``/v1/chat/completions`` with ``stream_options.include_spec`` (each chunk's
``nightjar`` field: docs/api.md), as the chat page does. Each line read from standard input is
a message (so a file or a pipe can drive it); ``/new`` starts over, ``/quit`` or end of input
ends the session.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import httpx
from pydantic import Field
from rich.console import Console
from rich.text import Text

from nightjar.flags import add, build, given
from nightjar.options import UsageError
from shared.settings import EnvSettings

STYLES = {True: "green", False: "blue", None: "dim"}  # accepted draft, target's own, earlier attempt


@dataclass
class Answer:
    """One answer's text and the engine steps that made it."""

    text: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    first: float | None = None
    last: float | None = None

    def add_steps(self, steps: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        self.steps += steps
        if steps:
            self.first = now if self.first is None else self.first
            self.last = now

    def status(self) -> str:
        """drafter, γ, acceptance, tokens/s, tokens (drafted), steps."""
        tokens = sum(int(s["tokens"]) for s in self.steps)
        accepted = sum(int(s["accepted"]) for s in self.steps)
        proposed = sum(int(s["drafted"]) for s in self.steps)
        drafters = [s["drafter"] for s in self.steps if s.get("drafter")]
        gamma = self.steps[-1]["gamma"] if self.steps else "-"
        accept = f"{100 * accepted / proposed:.0f}% ({accepted}/{proposed})" if proposed else "-"
        span = (self.last or 0.0) - (self.first or 0.0)
        after_first = tokens - (int(self.steps[0]["tokens"]) if self.steps else 0)
        rate = f"{after_first / span:.1f}" if span > 0 else "-"
        return (
            f"[drafter {drafters[-1] if drafters else 'none'} · γ {gamma} · acceptance {accept} · "
            f"{rate} tok/s · {tokens} tokens, {accepted} drafted · {len(self.steps)} steps]"
        )


class Chat:
    """A conversation with one gateway; ``ask`` streams one answer to the console."""

    def __init__(self, args: ChatSettings, console: Console) -> None:
        self.args, self.console = args, console
        self.messages: list[dict[str, str]] = []
        if args.system:
            self.messages.append({"role": "system", "content": args.system})
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        self.client = httpx.Client(base_url=args.url, timeout=args.timeout, headers=headers)

    def reset(self) -> None:
        self.messages = self.messages[:1] if self.args.system else []

    def ask(self, text: str) -> bool:
        """Send one message and show the answer; False when the gateway refused or failed."""
        self.messages.append({"role": "user", "content": text})
        body: dict[str, Any] = {
            "messages": self.messages,
            "stream": True,
            "stream_options": {"include_spec": True},
            "max_tokens": self.args.max_tokens,
            "temperature": self.args.temperature,
        }
        if self.args.model:
            body["model"] = self.args.model
        answer = Answer()
        self.console.print(Text("assistant> ", style="bold"), end="")
        try:
            with self.client.stream("POST", "/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    return self._failed(f"{resp.status_code}: {_message(resp.text)}")
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        return self._failed(str(chunk["error"].get("message")))
                    self._show(chunk, answer)
        except httpx.HTTPError as exc:
            return self._failed(f"cannot reach the gateway at {self.args.url}: {exc}")
        self.console.print()
        self.console.print(Text(answer.status(), style="italic"))
        self.messages.append({"role": "assistant", "content": answer.text})
        return True

    def _show(self, chunk: dict[str, Any], answer: Answer) -> None:
        spec = chunk.get("nightjar")
        if spec is not None:
            answer.add_steps(spec.get("steps", []))
            for span in spec.get("spans", []):
                answer.text += span["text"]
                self.console.print(Text(span["text"], style=STYLES.get(span.get("drafted"), "")), end="")
            return
        for choice in chunk.get("choices", []):  # a gateway without the facts: plain text
            text = choice.get("delta", {}).get("content") or ""
            answer.text += text
            self.console.print(Text(text), end="")

    def _failed(self, message: str) -> bool:
        self.messages.pop()
        self.console.print()
        print(f"nightjar chat: error: {message}", file=sys.stderr, flush=True)
        return False


def run(args: ChatSettings, lines: TextIO, console: Console) -> int:
    """The session: one message per line of ``lines``; 0 when every message was answered."""
    chat, failed = Chat(args, console), False
    legend = Text.assemble(
        ("accepted draft", STYLES[True]), " · ", ("target's own token", STYLES[False]), f" · {args.url}"
    )
    console.print(legend)
    interactive = lines.isatty()
    while True:
        if interactive:
            console.print(Text("you> ", style="bold"), end="")
        line = lines.readline()
        if not line:
            break
        text = line.rstrip("\n")
        if text.strip() == "/quit":
            break
        if text.strip() == "/new":
            chat.reset()
            console.print(Text("(a new conversation)", style="italic"))
            continue
        if text.strip():
            failed = not chat.ask(text) or failed
    chat.client.close()
    return 1 if failed else 0


class ChatSettings(EnvSettings):
    url: str = Field(
        default="http://127.0.0.1:8000", validation_alias="NIGHTJAR_URL", description="the gateway"
    )
    api_key: str | None = Field(
        default=None, validation_alias="NIGHTJAR_API_KEY", description="Bearer key; none: no key"
    )
    model: str | None = Field(
        default=None,
        validation_alias="NIGHTJAR_CHAT_MODEL",
        description="the model to ask; none: the gateway's only or default one",
    )
    max_tokens: int = Field(
        default=256,
        ge=1,
        validation_alias="NIGHTJAR_CHAT_MAX_TOKENS",
        description="most tokens in one answer",
    )
    temperature: float = Field(
        default=0.0,
        ge=0,
        validation_alias="NIGHTJAR_CHAT_TEMPERATURE",
        description="sampling temperature; 0: greedy",
    )
    system: str | None = Field(
        default=None,
        validation_alias="NIGHTJAR_CHAT_SYSTEM",
        description="a system message that starts the conversation",
    )
    timeout: float = Field(
        default=600.0,
        gt=0,
        validation_alias="NIGHTJAR_CHAT_TIMEOUT",
        description="seconds one answer may take",
    )
    color: Literal["auto", "always", "never"] = Field(
        default="auto",
        validation_alias="NIGHTJAR_CHAT_COLOR",
        description="colour the tokens; auto: when writing to a terminal",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nightjar chat",
        description="Chat with a running gateway: each token of an answer coloured by who made it "
        "(green: an accepted draft, blue: the target's own token), then a status line with the "
        "drafter, γ, acceptance and tokens/s. One message per line of standard input; /new starts "
        "over, /quit (or the end of the input) ends.",
    )
    add(p, "--url", ChatSettings, "url")
    add(p, "--api-key", ChatSettings, "api_key")
    add(p, "--model", ChatSettings, "model")
    add(p, "--max-tokens", ChatSettings, "max_tokens", type=int)
    add(p, "--temperature", ChatSettings, "temperature", type=float)
    add(p, "--system", ChatSettings, "system")
    add(p, "--timeout", ChatSettings, "timeout", type=float)
    add(p, "--color", ChatSettings, "color", choices=("auto", "always", "never"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = build(ChatSettings, **given(args, ChatSettings))
    except UsageError as exc:
        print(f"nightjar chat: error: {exc}", file=sys.stderr)
        return 2
    force = {"always": True, "never": False}.get(settings.color)
    console = Console(
        force_terminal=force, no_color=settings.color == "never", highlight=False, soft_wrap=True
    )
    try:
        return run(settings, sys.stdin, console)
    except KeyboardInterrupt:
        return 130


def _message(text: str) -> str:
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()[:200]
