from __future__ import annotations

import random

from tests.tiny_models import build_tokenizer
from worker.detokenizer import IncrementalDetokenizer, StopText

TOK = build_tokenizer()


def _stream(ids: list[int], prompt: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(TOK, prompt)
    return [detok.add(t) for t in ids] + [detok.flush()]


def test_deltas_add_up_to_the_full_decode_and_never_split_a_character() -> None:
    text = "Héllo wörld — naïve café, 東京 and emoji 🙂!"
    prompt = TOK("Once upon")["input_ids"]
    ids = TOK(text, add_special_tokens=False)["input_ids"]
    deltas = _stream(ids, prompt)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_random_token_streams_match_the_full_decode() -> None:
    rng = random.Random(0)
    prompt = TOK("x")["input_ids"]
    for _ in range(50):
        ids = [rng.randrange(len(TOK)) for _ in range(rng.randrange(1, 30))]
        assert "".join(_stream(ids, prompt)) == TOK.decode(ids, skip_special_tokens=True)


def _push_all(stops: list[str], deltas: list[str]) -> tuple[list[str], StopText]:
    st = StopText(stops)
    out = [st.push(d) for d in deltas]
    return out, st


def test_stop_string_across_deltas_cuts_before_it() -> None:
    out, st = _push_all(["STOP"], ["abc S", "T", "OP tail"])
    assert st.stopped and st.text == "abc "
    assert "".join(out) == "abc "
    assert out[0] == "abc "  # "S" held back: it may begin the stop string


def test_possible_prefix_is_released_when_it_turns_out_not_to_stop() -> None:
    out, st = _push_all(["STOP"], ["ab ST", "x"])
    assert out == ["ab ", "STx"] and not st.stopped


def test_earliest_of_several_stops_wins_and_flush_releases_the_rest() -> None:
    out, st = _push_all(["world", "lo w"], ["hel", "lo world"])
    assert st.stopped and st.text == "hel" and "".join(out) == "hel"
    out2, st2 = _push_all(["\n\n"], ["line\n"])
    assert out2 == ["line"] and st2.flush() == "\n" and st2.text == "line\n"


def test_no_stops_releases_everything_at_once() -> None:
    out, st = _push_all([], ["a", "b"])
    assert out == ["a", "b"] and st.flush() == ""
