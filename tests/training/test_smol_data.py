import torch
from transformers import PreTrainedTokenizerFast

from tests.training.conftest import DATA
from training.smol_data import (
    alpaca_records,
    alpaca_user_text,
    chat_prompt_ids,
    code_prompt_ids,
    code_stream,
    conversation_stream,
    sharegpt_prompts,
)


def test_alpaca_and_sharegpt_load() -> None:
    records = alpaca_records(DATA)
    assert len(records) == 5000
    with_input = next(r for r in records if r["input"].strip())
    want = f"{with_input['instruction'].strip()}\n\n{with_input['input'].strip()}"
    assert alpaca_user_text(with_input) == want
    assert len(sharegpt_prompts(DATA)) == 500


def test_chat_prompts_open_an_assistant_turn(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    prompts = chat_prompt_ids(tiny_tokenizer, ["the cat", "x " * 500, "a dog"], limit=5, max_tokens=40)
    assert len(prompts) == 2  # the long one is skipped
    assert tiny_tokenizer.decode(prompts[0]) == "<|user|>\nthe cat<|endoftext|>\n<|assistant|>\n"


def test_conversations_hold_prompt_and_answer(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    record = {"instruction": "Name a pet.", "input": "", "output": "A cat."}
    stream = conversation_stream(tiny_tokenizer, [record])
    assert tiny_tokenizer.decode(stream.tolist()) == (
        "<|user|>\nName a pet.<|endoftext|>\n<|assistant|>\nA cat.<|endoftext|>\n"
    )


def test_code_prompts_are_seeded_prefixes(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    stream = code_stream(tiny_tokenizer, ["def a():\n    return 1", "def b():\n    return 2"] * 20)
    assert str(tiny_tokenizer.decode(stream.tolist())).startswith("def a():\n    return 1\n\ndef b()")
    prompts = code_prompt_ids(stream, 3, 10, seed=0)
    assert [len(p) for p in prompts] == [10, 10, 10]
    assert prompts == code_prompt_ids(stream, 3, 10, seed=0)
    assert isinstance(stream, torch.Tensor)
