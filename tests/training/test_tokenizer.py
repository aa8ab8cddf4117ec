from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from training.tokenizer import ROLE_TOKENS, SPECIAL_TOKENS, eot_id, save_tokenizer


def test_special_tokens_come_first(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    assert tiny_tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3]
    assert eot_id(tiny_tokenizer) == 0
    assert tiny_tokenizer.bos_token_id == tiny_tokenizer.eos_token_id == tiny_tokenizer.pad_token_id == 0
    assert len(tiny_tokenizer) == 320


def test_saved_tokenizer_loads_with_chat_template(
    tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    save_tokenizer(tiny_tokenizer, tmp_path)
    assert "chat_template" in (tmp_path / "tokenizer_config.json").read_text()
    assert not (tmp_path / "chat_template.jinja").exists()
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi cat"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi cat<|endoftext|>\n<|assistant|>\n"
    encoded: Any = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids: list[int] = encoded["input_ids"]
    # Each role marker is one special token (ids 1..3), never split into bytes.
    assert [i for i in ids if i in (1, 2, 3)] == tok.convert_tokens_to_ids(list(ROLE_TOKENS))
    assert ids.count(0) == 2  # one <|endoftext|> closing each turn


def test_encoding_starts_a_document(tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    save_tokenizer(tiny_tokenizer, tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    ids = tok("Once upon a time")["input_ids"]
    assert ids[0] == 0 and ids[1:] == tok("Once upon a time", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "Once upon a time"


def test_any_text_round_trips(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    text = "Héllo wörld 東京 🙂\n\tdef f(x): return x  # unseen"
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
