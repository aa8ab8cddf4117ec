from __future__ import annotations

import msgpack
import pytest

from shared import codec
from shared.codec import ALL_MESSAGES
from shared.control import Decision, PolicyCommand, SwitchCostEvent, Telemetry, WorkerInfo
from shared.errors import ErrorCode
from shared.schemas import (
    CancelRequest,
    ChatMessage,
    ErrorEvent,
    FinishEvent,
    FinishReason,
    JobRequest,
    Message,
    SamplingParams,
    StartEvent,
    TokenEvent,
)

SAMPLES: list[Message] = [
    JobRequest(
        job_id="j", prompt="hi", params=SamplingParams(max_tokens=5, temperature=0.7, seed=3, stop=["\n"])
    ),
    JobRequest(job_id="j", messages=[ChatMessage(role="user", content="héllo 🙂")]),
    JobRequest(job_id="j", prompt_token_ids=[1, 2, 3]),
    StartEvent(job_id="j", worker_id="w", attempt=2, prompt_tokens=4),
    TokenEvent(job_id="j", index=3, token_ids=[5, 6], text="ab"),
    FinishEvent(
        job_id="j", finish_reason="stop", text="x", token_ids=[1], prompt_tokens=2, completion_tokens=1
    ),
    ErrorEvent(job_id="j", code="bad_request", message="no"),
    CancelRequest(job_id="j"),
    Telemetry(
        worker_id="w",
        batch_size=4,
        counterfactual={"d": 0.5},
        switch_costs=[SwitchCostEvent(drafter="d", batch_size=2, tokens=3, seconds=0.1)],
    ),
    Decision(
        version=7,
        policy="static",
        gamma_table=[(4, 3), (1 << 30, 0)],
        drafter="d",
        offload=True,
        drafter_costs={"d": 0.2, "ngram": 0.01},
    ),
    PolicyCommand(policy="static", params={"gamma": "2"}),
    WorkerInfo(worker_id="w", model="m"),
]


def test_samples_cover_every_message_kind() -> None:
    assert {type(m) for m in SAMPLES} == set(ALL_MESSAGES)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.kind)
def test_round_trip(msg: Message) -> None:
    back = codec.decode(codec.encode(msg))
    assert type(back) is type(msg)
    assert back == msg
    assert codec.from_entry(codec.entry(msg)) == msg
    assert codec.decode_as(codec.encode(msg), type(msg)) == msg


def test_decision_gamma_table_survives_as_tuples() -> None:
    d = codec.decode_as(codec.encode(SAMPLES[9]), Decision)
    assert d.gamma_for(1) == 3 and d.gamma_for(5) == 0


def _env(**over: object) -> bytes:
    body = {"v": codec.SCHEMA_VERSION, "t": "cancel", "d": {"job_id": "j"}}
    body.update(over)
    return msgpack.packb(body)


@pytest.mark.parametrize(
    "raw, match",
    [
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2]), "envelope"),
        (msgpack.packb({"v": 1, "t": "cancel"}), "envelope"),
        (_env(v=99), "schema version"),
        (_env(t="nope"), "unknown message kind"),
        (_env(t=5), "unknown message kind"),
        (_env(d=[1]), "not a map"),
        (_env(d={"job_id": 5}), "invalid cancel"),
        (_env(d={"job_id": "j", "extra": 1}), "invalid cancel"),
    ],
)
def test_malformed_raises_codec_error(raw: bytes, match: str) -> None:
    with pytest.raises(codec.CodecError, match=match):
        codec.decode(raw)


def test_entry_errors() -> None:
    with pytest.raises(codec.CodecError, match="no message field"):
        codec.from_entry({b"other": b"x"})
    with pytest.raises(codec.CodecError, match="expected"):
        codec.decode_as(codec.encode(CancelRequest(job_id="j")), JobRequest)
    # str-keyed fields (a decode_responses client) decode too
    assert codec.from_entry({"m": codec.encode(CancelRequest(job_id="j")).decode("latin-1")}).kind == "cancel"


def test_unregistered_message_is_refused() -> None:
    class Stray(Message):
        kind = "stray"

    with pytest.raises(codec.CodecError, match="unregistered"):
        codec.encode(Stray())


def test_enum_fields_go_on_the_wire_as_their_strings() -> None:
    """ErrorCode and FinishReason are StrEnums: the bytes are those of the plain strings, and
    the strings decode back to the members."""
    err = ErrorEvent(job_id="j", code=ErrorCode.DEAD_LETTER, message="no")
    fin = FinishEvent(job_id="j", finish_reason=FinishReason.LENGTH, text="", token_ids=[], prompt_tokens=1,
                      completion_tokens=0)  # fmt: skip
    for msg, field, value in ((err, "code", "dead_letter"), (fin, "finish_reason", "length")):
        d = msgpack.unpackb(codec.encode(msg))["d"]
        assert type(d[field]) is str and d[field] == value
        back = codec.decode(codec.encode(msg))
        assert getattr(back, field) is getattr(msg, field)
    plain = {"job_id": "j", "code": "dead_letter", "message": "no"}
    envelope = {"v": codec.SCHEMA_VERSION, "t": "error", "d": plain}
    assert codec.encode(err) == msgpack.packb(envelope, use_bin_type=True)
    # a code outside this version's vocabulary (a newer worker's) still answers the job: internal
    newer = codec.decode(codec.encode(err).replace(b"dead_letter", b"dead_lettex"))
    assert isinstance(newer, ErrorEvent) and newer.code is ErrorCode.INTERNAL
