"""The detokenizer's Rust path (tokenizers' DecodeStream) releases exactly the deltas of the
window decoded in Python: multi-byte characters split across tokens (accents, CJK, emoji,
ZWJ sequences, flags, 4-byte letters), random prompts and outputs, an output that ends in
the middle of a character, and a stream that fails half-way."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.tiny_models import build_tokenizer
from worker.detokenizer import REPLACEMENT, IncrementalDetokenizer

TOK = build_tokenizer()
TEXTS = [
    "Héllo wörld — naïve café, 東京 and emoji 🙂!",
    "family 👨‍👩‍👧, flag 🇫🇷, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🤷🏽‍♀️ at the end 🎉",
    "  two  spaces\n\nnew\tline ½ ≠ ∑",
]


class WindowOnly:
    """The same tokenizer seen only through ``decode``: the window decoded in Python."""

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        return TOK.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)


def _deltas(tokenizer: Any, prompt: list[int], ids: list[int]) -> tuple[list[str], bool]:
    detok = IncrementalDetokenizer(tokenizer, prompt)
    streamed = detok._stream is not None
    return [detok.add(t) for t in ids] + [detok.flush()], streamed


def test_multi_byte_text_streams_the_same_deltas_from_rust() -> None:
    prompt = TOK("Once upon")["input_ids"]
    for text in TEXTS:
        ids = TOK(text, add_special_tokens=False)["input_ids"]
        assert len(ids) > len(text.encode()) // 4  # characters really are split across tokens
        fast, streamed = _deltas(TOK, prompt, ids)
        assert streamed
        assert fast == _deltas(WindowOnly(), prompt, ids)[0]
        assert "".join(fast) == text and not any(REPLACEMENT in d for d in fast)


def test_random_prompts_and_outputs_give_the_same_deltas() -> None:
    rng = random.Random(5)
    words = [TOK(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    streamed = 0
    for _ in range(300):
        prompt = [rng.randrange(len(TOK)) for _ in range(rng.randrange(0, 8))]
        if rng.random() < 0.5:
            w = rng.choice(words)
            start = rng.randrange(len(w))
            ids = w[start : start + rng.randrange(1, 40)]
        else:
            ids = [rng.randrange(len(TOK)) for _ in range(rng.randrange(1, 30))]
        fast, used = _deltas(TOK, prompt, ids)
        streamed += used
        assert fast == _deltas(WindowOnly(), prompt, ids)[0], (prompt, ids)
    assert 50 < streamed < 300  # both paths ran: a prompt ending mid-character stays in Python


def test_an_output_ending_mid_character_flushes_the_same_replacement() -> None:
    ids = TOK("ok 🎉", add_special_tokens=False)["input_ids"][:-1]
    fast, streamed = _deltas(TOK, TOK("x")["input_ids"], ids)
    assert streamed and fast[-1].endswith(REPLACEMENT)
    assert fast == _deltas(WindowOnly(), TOK("x")["input_ids"], ids)[0]


def test_a_prompt_ending_mid_character_is_decoded_in_python() -> None:
    prompt = TOK("x 🙂", add_special_tokens=False)["input_ids"][:-1]
    assert REPLACEMENT in TOK.decode(prompt)
    ids = TOK(" and more", add_special_tokens=False)["input_ids"]
    fast, streamed = _deltas(TOK, prompt, ids)
    assert not streamed and fast == _deltas(WindowOnly(), prompt, ids)[0]


def test_a_stream_that_fails_half_way_hands_over_to_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    text = TEXTS[1]
    ids = TOK(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(TOK, [])
    assert detok._stream is not None
    real, calls = detok._stream, [0]

    class Failing:
        def step(self, tokenizer: Any, token_id: int) -> str | None:
            calls[0] += 1
            if calls[0] == 7:
                raise Exception("InvalidPrefix")
            return real.step(tokenizer, token_id)

    detok._stream = Failing()  # type: ignore[assignment]
    out = [detok.add(t) for t in ids] + [detok.flush()]
    assert detok._stream is None and calls[0] == 7
    assert out == _deltas(WindowOnly(), [], ids)[0] and "".join(out) == text
