import torch
from transformers import LlamaForCausalLM

from training.evaluate import continuation_agreement, forced_agreement, greedy_tokens, make_eval_set, val_loss
from training.generate import generate_labelled, greedy_continue, teacher_topk
from training.specs import ArchSpec


def _model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(ArchSpec(32, 1, 4, 2, 64).llama_config(50, 0)).eval()


def test_greedy_continue_matches_full_recompute() -> None:
    model = _model(0)
    prompts = torch.randint(0, 50, (3, 5))
    seqs = greedy_continue(model, prompts, 6, batch_size=2)
    assert seqs.shape == (3, 11) and torch.equal(seqs[:, :5], prompts)
    with torch.no_grad():
        again = model(input_ids=seqs[:, :-1]).logits.argmax(-1)[:, 4:]
    assert torch.equal(again, seqs[:, 5:])


def test_teacher_topk_is_sorted_and_normalised() -> None:
    ids, probs = teacher_topk(_model(0), torch.randint(0, 50, (3, 9)), k=4, batch_size=2)
    assert ids.shape == probs.shape == (3, 8, 4) and ids.dtype == torch.int32
    assert torch.allclose(probs.float().sum(-1), torch.ones(3, 8), atol=1e-3)
    assert bool((probs[..., :-1] >= probs[..., 1:]).all())


def test_a_model_agrees_fully_with_itself() -> None:
    target = _model(0)
    evalset = make_eval_set(torch.randint(0, 50, (400,)), 16, windows=4, prompts=3, seed=0)
    assert evalset.windows.shape == (4, 17) and evalset.prompts.shape == (3, 32)
    assert forced_agreement(greedy_tokens(target, evalset.windows), target, evalset.windows) == 1.0
    seqs = greedy_continue(target, evalset.prompts, 12)
    agree, accepted = continuation_agreement(target, seqs, prompt_len=32, gamma=4)
    assert agree == 1.0 and accepted == 4.0
    other, _ = continuation_agreement(_model(1), seqs, prompt_len=32, gamma=4)
    assert other < 1.0
    assert 0.0 < val_loss(target, evalset.windows) < 10.0


def test_accepted_length_follows_verify_steps() -> None:
    class Fixed(torch.nn.Module):
        """Predicts token 1 everywhere."""

        def forward(self, input_ids: torch.Tensor) -> torch.nn.Module:
            out = torch.nn.Module()
            out.logits = torch.nn.functional.one_hot(torch.ones_like(input_ids), 3).float()
            return out

    # Continuation 1 1 0 | 1 1 1 1 | 1 1: the first step accepts 2 and the verifier emits the 0,
    # the next accepts 4 (then the bonus token); 2 tokens remain, too few for a γ=4 step.
    seqs = torch.tensor([[2, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]])
    agree, accepted = continuation_agreement(Fixed(), seqs, prompt_len=1, gamma=4)  # type: ignore[arg-type]
    assert accepted == 3.0 and abs(agree - 0.9) < 1e-6


def test_labelled_generation_matches_unpadded_greedy() -> None:
    model = _model(0)
    prompts = [[5, 6, 7], [1, 2, 3, 4, 5, 6], [9]]
    seqs = generate_labelled(model, prompts, new_tokens=5, k=3, eos_id=None, pad_id=0, batch_size=3)
    for prompt, seq in zip(prompts, seqs, strict=True):
        alone = greedy_continue(model, torch.tensor([prompt]), 5)[0].tolist()
        assert seq.tokens == alone and seq.prompt_len == len(prompt)
        ids, probs = teacher_topk(model, torch.tensor([seq.tokens]), k=3)
        assert torch.equal(seq.topk_ids, ids[0])  # one label row per predicted token
        assert torch.allclose(seq.topk_probs.float(), probs[0].float(), atol=2e-3)


def test_labelled_generation_stops_at_eos() -> None:
    model = _model(0)
    free = generate_labelled(model, [[5, 6, 7]], new_tokens=6, k=2, eos_id=None, pad_id=0)[0]
    eos = free.generated[1]
    stopped = generate_labelled(model, [[5, 6, 7]], new_tokens=6, k=2, eos_id=eos, pad_id=0)[0]
    assert stopped.generated == free.generated[:free.generated.index(eos) + 1]
    assert stopped.topk_ids.shape[0] == len(stopped.tokens) - 1
