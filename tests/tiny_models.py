"""Tiny random Hugging Face models with a real byte-level BPE tokenizer, built in a test.

Nothing is downloaded: the tokenizer is trained on a few sentences with the ``tokenizers``
library and the Llama weights are random, so a test model builds and loads in about a second.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tests.worker.engine.tiny import hf_greedy, hf_model

TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little robot who liked to count stars.",
    "Redis streams carry jobs from the gateway to the workers and back.",
    "Speculative decoding drafts tokens cheaply and verifies them in one pass.",
    "Héllo wörld — naïve café, 東京 and emoji 🙂 test the byte-level tokenizer.",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TEXT * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_llama(
    path: Path, *, layers: int = 2, hidden: int = 64, seed: int = 0, max_positions: int = 4096
) -> Path:
    """Save a random Llama and its tokenizer under ``path``; return ``path``."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        initializer_range=0.3,  # large weights give varied outputs instead of one repeated token
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def reference_greedy(
    model_dir: Path, prompt_ids: list[int], max_new_tokens: int, ignore_eos: bool = False
) -> list[int]:
    """transformers' own greedy ``generate`` on the saved model: the exactness oracle."""
    return hf_greedy(_loaded(Path(model_dir)), prompt_ids, max_new_tokens, stop_at_eos=not ignore_eos)


# Two logits closer than this are a float tie: fp32 sums in another order (a fused decode
# kernel, a prefill of a resumed job, another batch) may pick either. On the random tiny models
# such ties come every few hundred greedy tokens (top-2 margins of 1e-4 seen), so long outputs are
# checked token by token against the target's own logits instead of one generate() run.
TIE = 1e-3


def is_greedy(model_dir: Path, prompt_ids: list[int], output: list[int]) -> bool:
    """Whether every token of ``output`` is the target's argmax (within ``TIE``) given the prompt
    and the output before it: one teacher-forced forward of transformers' model."""
    import torch

    if not output:
        return True
    model = _loaded(Path(model_dir))
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + output[:-1]])).logits[0, len(prompt_ids) - 1 :]  # type: ignore[operator]
    chosen = logits.gather(1, torch.tensor(output).unsqueeze(1)).squeeze(1)
    return bool((chosen >= logits.max(dim=1).values - TIE).all())


@lru_cache(maxsize=4)
def _loaded(model_dir: Path) -> object:
    """One load per model directory: the end-to-end tests ask for dozens of references."""
    return hf_model(model_dir)
