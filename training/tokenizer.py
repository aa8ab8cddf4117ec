"""Trains the byte-level BPE tokenizer that the target and every nj-drafter share."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

EOT = "<|endoftext|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (EOT, *ROLE_TOKENS)  # ids 0..3, in this order
VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 2048

# Each turn is "<|role|>\n{content}<|endoftext|>\n"; the generation prompt opens an assistant
# turn, so the model's own <|endoftext|> (also its eos) ends its answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def eot_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id of <|endoftext|> (0 in a tokenizer this module trained)."""
    ids = tokenizer.convert_tokens_to_ids(EOT)
    assert isinstance(ids, int)
    return ids


def train_tokenizer(texts: Iterable[str], vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style pre-tokenisation, no prefix space) over ``texts``.

    Every byte is in the initial alphabet, so any UTF-8 text encodes without an unknown token.
    """
    if vocab_size <= len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    # Like a Llama tokenizer, encoding adds the bos (<|endoftext|>) in front: every training
    # document follows one, so a prompt then reads as the start of a new document.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{EOT} $A", pair=f"{EOT} $A {EOT} $B", special_tokens=[(EOT, tok.token_to_id(EOT))]
    )
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """The Hugging Face wrapper: one <|endoftext|> serves as bos, eos and pad."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        extra_special_tokens=list(ROLE_TOKENS),
        model_max_length=MODEL_MAX_LENGTH,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> None:
    """Writes tokenizer.json and tokenizer_config.json, with the chat template inside the latter."""
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)
