from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from training import smol_drafters
from training.checkpoint import load_model, save_model
from training.distill import labelled_rows, one_hot_rows
from training.generate import LabelledSeq
from training.smol_drafters import Teacher, build_set, cached_labels, load_teacher, train_smol_drafter
from training.specs import ArchSpec, Recipe
from training.trainer import LoopConfig


@pytest.fixture()
def teacher(tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> Teacher:
    torch.manual_seed(0)
    model = LlamaForCausalLM(ArchSpec(32, 1, 4, 2, 64).llama_config(len(tiny_tokenizer), 0))
    save_model(model, tiny_tokenizer, tmp_path / "teacher", {"name": "teacher"})
    return load_teacher(tmp_path / "teacher")


def _recipe() -> Recipe:
    return Recipe(name="smol-draft-chat", arch=ArchSpec(16, 1, 2, 1, 32), domains=("chat",), steps=12,
                  batch_size=4, seq_len=16, warmup=2, topk=4, max_windows=6)


def test_labels_are_cached_on_disk(teacher: Teacher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smol_drafters, "CACHE_DIR", tmp_path / "cache")
    first, seconds = cached_labels(teacher, [[5, 6], [7, 8, 9]], 4, 3, "t", log=lambda _: None)
    assert seconds > 0 and len(list((tmp_path / "cache").iterdir())) == 1
    again, zero = cached_labels(teacher, [[5, 6], [7, 8, 9]], 4, 3, "t", log=lambda _: None)
    assert zero == 0.0
    assert [s.tokens for s in again] == [s.tokens for s in first]
    assert torch.equal(again[1].topk_probs, first[1].topk_probs)
    cached_labels(teacher, [[5, 6]], 4, 3, "t", log=lambda _: None)  # other prompts: another entry
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_rows_pad_without_labels() -> None:
    seq = LabelledSeq([1, 2, 3], 1, torch.ones(2, 2, dtype=torch.int32), torch.full((2, 2), 0.5).half())
    windows, ids, probs = labelled_rows([seq], seq_len=4, pad_id=9)
    assert windows.tolist() == [[1, 2, 3, 9, 9]]
    assert ids[0, :, 0].tolist() == [1, 1, 0, 0]
    assert probs.float().sum(-1).tolist() == [[1.0, 1.0, 0.0, 0.0]]
    hard_ids, hard_probs = one_hot_rows(windows, 3)
    assert hard_ids[0, :, 0].tolist() == [2, 3, 9, 9] and hard_probs[0, :, 1:].abs().sum() == 0


def test_build_set_mixes_teacher_rows_and_text(teacher: Teacher) -> None:
    seqs, _ = cached_labels(teacher, [[5, 6, 7]] * 2, 6, 4, "mix", log=lambda _: None)
    data = build_set(seqs, torch.arange(200) % 300, _recipe(), teacher.pad_id, seed=0, teacher_seconds=1.0)
    assert data.windows.shape == (2 + 6, 17) and data.generated_rows == 2
    assert data.weights is not None
    assert abs(data.weights[:2].sum().item() - 0.5) < 1e-6 and abs(data.weights.sum().item() - 1) < 1e-6
    model, run = train_smol_drafter(teacher, data, _recipe(), LoopConfig(steps=12, lr=1e-2, warmup=2), 0,
                                    log=lambda _: None)
    assert run.steps == 12 and model.config.vocab_size == teacher.model.config.vocab_size
    assert model.config.eos_token_id == teacher.eos_id


def test_saved_drafter_carries_the_teacher_tokenizer(teacher: Teacher, tmp_path: Path) -> None:
    torch.manual_seed(0)
    drafter = LlamaForCausalLM(ArchSpec(16, 1, 2, 1, 32).llama_config(len(teacher.tokenizer), teacher.eos_id))
    out = save_model(drafter, teacher.tokenizer, tmp_path / "d", {"teacher": "t"})
    assert (out / "tokenizer.json").read_text() == (teacher.directory / "tokenizer.json").read_text()
    assert load_model(out).config.vocab_size == len(teacher.tokenizer)


def test_projected_embeddings_keep_the_teacher_geometry(teacher: Teacher) -> None:
    torch.manual_seed(1)
    big = smol_drafters.embedding_table(teacher.model)
    with torch.no_grad():  # a teacher table of rank 8, so an 8-wide projection loses nothing
        big.copy_(torch.randn(big.shape[0], 8) @ torch.randn(8, big.shape[1]))
    student = LlamaForCausalLM(ArchSpec(8, 1, 2, 1, 16).llama_config(big.shape[0], 0))
    smol_drafters.project_embeddings(teacher.model, student)
    small = smol_drafters.embedding_table(student)
    assert small.shape == (big.shape[0], 8)
    assert torch.allclose(small.pow(2).mean(), big.pow(2).mean(), rtol=1e-4)
    gram_big, gram_small = big @ big.T, small @ small.T
    scale = gram_big.abs().mean() / gram_small.abs().mean()
    assert torch.allclose(gram_small * scale, gram_big, atol=1e-3 * gram_big.abs().max().item())
    assert student.get_output_embeddings().weight.data_ptr() == small.data_ptr()  # tied: output moved too
