from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from training.checkpoint import count_params, dir_bytes, read_meta, save_model, write_meta
from training.specs import ArchSpec


def test_resave_replaces_a_previous_run(tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    model = LlamaForCausalLM(ArchSpec(16, 1, 2, 1, 32).llama_config(len(tiny_tokenizer), 0))
    (tmp_path / "chat_template.jinja").write_text("stale")  # would shadow the config's template
    (tmp_path / "notes.txt").write_text("not ours")
    save_model(model, tiny_tokenizer, tmp_path, {"run": 1})
    assert not (tmp_path / "chat_template.jinja").exists()
    assert (tmp_path / "notes.txt").exists()
    assert read_meta(tmp_path) == {"run": 1}
    write_meta(tmp_path, {"run": 2})
    assert read_meta(tmp_path) == {"run": 2}
    assert dir_bytes(tmp_path) > 2 * count_params(model)  # bf16 weights plus tokenizer files
    assert next(model.parameters()).dtype == torch.float32  # saving leaves the caller's model as it was


def test_tied_embeddings_count_once() -> None:
    model = LlamaForCausalLM(ArchSpec(16, 1, 2, 1, 32).llama_config(100, 0))
    assert count_params(model) == ArchSpec(16, 1, 2, 1, 32).matmul_params(100) + 16 * 3  # plus 3 norms
