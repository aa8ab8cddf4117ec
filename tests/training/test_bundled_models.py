"""The trained files under models/ that the rest of Nightjar serves."""

from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from training.checkpoint import count_params, read_meta
from training.specs import DRAFTERS, TARGET

MODELS = Path(__file__).resolve().parents[2] / "models"
NJ = [TARGET.name, *(r.name for r in DRAFTERS)]


@pytest.mark.parametrize("name", NJ)
def test_each_model_is_a_complete_hf_dir(name: str) -> None:
    model_dir = MODELS / name
    for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
              "tokenizer_config.json"):
        assert (model_dir / f).is_file(), f"{name} lacks {f}"
    config = AutoConfig.from_pretrained(str(model_dir))
    assert config.model_type == "llama" and config.tie_word_embeddings
    assert str(config.dtype).endswith("bfloat16")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert len(tok) == config.vocab_size and tok.chat_template
    meta = read_meta(model_dir)
    assert meta["name"] == name and meta["command"].startswith("nightjar models ")


def test_nj_models_share_one_tokenizer_and_drafters_are_small() -> None:
    target = AutoModelForCausalLM.from_pretrained(str(MODELS / TARGET.name))
    tokenizer_json = (MODELS / TARGET.name / "tokenizer.json").read_text()
    assert target.config.num_key_value_heads < target.config.num_attention_heads  # GQA
    for r in DRAFTERS:
        drafter = AutoModelForCausalLM.from_pretrained(str(MODELS / r.name))
        assert (MODELS / r.name / "tokenizer.json").read_text() == tokenizer_json
        assert drafter.config.vocab_size == target.config.vocab_size
        assert drafter.config.eos_token_id == target.config.eos_token_id
        assert count_params(drafter) * 8 <= count_params(target)
        assert r.arch.matmul_params(drafter.config.vocab_size) * 8 <= TARGET.arch.matmul_params(
            target.config.vocab_size)


def test_committed_files_stay_small() -> None:
    nj = sum(p.stat().st_size for name in NJ for p in (MODELS / name).iterdir())
    assert nj <= 20_000_000
