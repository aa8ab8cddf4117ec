"""LangChain (``langchain-openai``) against a live gateway: tests/compat/run_clients.py runs these."""

from __future__ import annotations

from typing import Any

from tests.compat.client_target import WEATHER_TOOL, Pet, Target


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
