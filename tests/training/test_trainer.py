import itertools

import torch

from training.trainer import CALIBRATION_STEPS, LoopConfig, distill_loss, lm_loss, lr_factor, train_loop


def test_lr_warms_up_then_decays_to_the_floor() -> None:
    factors = [lr_factor(s, 100, 10, 0.1) for s in range(100)]
    assert factors[0] == 0.1 and factors[9] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert abs(lr_factor(100, 100, 10, 0.1) - 0.1) < 1e-9


def test_distill_loss_is_the_kl_over_the_top_k() -> None:
    logits = torch.randn(2, 3, 10)
    top, ids = logits.topk(10, dim=-1)
    batch = {"topk_ids": ids, "topk_probs": torch.softmax(top, -1)}
    assert distill_loss(logits, batch).item() < 1e-5  # a student equal to its teacher
    assert distill_loss(torch.zeros(2, 3, 10), batch).item() > 0.01


class _Bigram(torch.nn.Module):
    """Stands in for a causal LM: ``.logits`` from an embedding table."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(5, 5)

    def forward(self, input_ids: torch.Tensor) -> torch.nn.Module:
        out = torch.nn.Module()
        out.logits = self.table(input_ids)
        return out


def _batch() -> dict[str, torch.Tensor]:
    seq = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]])
    return {"input_ids": seq[:, :-1], "labels": seq[:, 1:]}


def test_loop_fits_a_cycle() -> None:
    torch.manual_seed(0)
    model = _Bigram()
    run = train_loop(model, _batch, lm_loss, LoopConfig(steps=60, lr=0.1, warmup=5, log_every=10),
                     log=lambda _: None)
    assert run.steps == 60 and run.tokens == 60 * 9
    assert len(run.losses) == 6
    assert run.last_loss < 0.1 < run.first_loss


def test_budgeted_loop_sizes_itself_after_calibration() -> None:
    model = _Bigram()
    logs: list[str] = []
    cfg = LoopConfig(steps=None, lr=0.1, warmup=CALIBRATION_STEPS, budget_s=1e-9)
    run = train_loop(model, _batch, lm_loss, cfg, log=logs.append)
    # A budget smaller than any step still finishes the step after calibration.
    assert run.steps == CALIBRATION_STEPS + 1
    assert any("measured" in line for line in logs)
