"""Speculative verification: greedy keeps the target's tokens; sampling keeps its distribution."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from shared.schemas import SamplingParams
from worker.engine.keyed import keyed_draw
from worker.engine.records import Candidate, Drafted
from worker.engine.sampler import filtered_probs, sample
from worker.engine.scheduler import Scheduled
from worker.engine.sequence import Sequence
from worker.engine.spec.verify import greedy_acceptance, overlap, verify_batch, verify_greedy, verify_sampled


def test_greedy_accepts_matching_prefix_then_target_token() -> None:
    v = 10
    logits = torch.full((2, 4, v), -1.0)
    target = [[3, 4, 5, 6], [7, 8, 9, 1]]
    for b, row in enumerate(target):
        for i, t in enumerate(row):
            logits[b, i, t] = 5.0
    draft = torch.tensor([[3, 4, 0], [0, 8, 9]])
    out = verify_greedy(logits.argmax(-1), draft, torch.tensor([3, 3]))
    assert out == [[3, 4, 5], [7]]


def test_greedy_respects_ragged_draft_lengths() -> None:
    logits = torch.zeros(1, 4, 6)
    for i, t in enumerate([1, 2, 3, 4]):
        logits[0, i, t] = 1.0
    # Only the first draft token is real; the padded ones match but must not count.
    out = verify_greedy(logits.argmax(-1), torch.tensor([[1, 2, 3]]), torch.tensor([1]))
    assert out == [[1, 2]]
    assert verify_greedy(logits.argmax(-1), torch.tensor([[1, 2, 3]]), torch.tensor([0])) == [[1]]


def test_greedy_acceptance_fraction() -> None:
    assert greedy_acceptance([1, 2, 3, 4], [1, 9, 3, 4]) == 0.75
    assert greedy_acceptance([], []) == 0.0


def _sample_sequences(
    p: torch.Tensor, q: torch.Tensor, gamma: int, n_out: int, trials: int
) -> list[tuple[int, ...]]:
    """Generate ``n_out`` tokens per trial by repeated draft-then-verify rounds, where the
    target's and draft's distributions depend only on the output position."""
    gen = torch.Generator().manual_seed(1234)
    seqs = []
    for _ in range(trials):
        out: list[int] = []
        while len(out) < n_out:
            pos = len(out)
            k = min(gamma, p.shape[0] - 1 - pos)
            draft = [int(torch.multinomial(q[pos + i], 1, generator=gen)) for i in range(k)]
            out += verify_sampled(p[pos : pos + k + 1], q[pos : pos + k], draft, gen)
        seqs.append(tuple(out[:n_out]))
    return seqs


def test_speculative_sampling_matches_target_distribution() -> None:
    torch.manual_seed(0)
    vocab, positions = 4, 4
    p = torch.softmax(torch.randn(positions, vocab) * 1.5, -1)
    q = torch.softmax(torch.randn(positions, vocab) * 1.5, -1)
    trials = 6000
    seqs = _sample_sequences(p, q, gamma=3, n_out=2, trials=trials)
    observed = torch.zeros(vocab * vocab)
    for a, b in seqs:
        observed[a * vocab + b] += 1
    expected = (p[0].unsqueeze(1) * p[1].unsqueeze(0)).flatten() * trials
    stat = chisquare(observed.numpy(), expected.numpy())
    assert stat.pvalue > 1e-3, stat
    # The draft distribution itself is clearly rejected by the same test: the test has power.
    wrong = (q[0].unsqueeze(1) * q[1].unsqueeze(0)).flatten() * trials
    assert chisquare(observed.numpy(), wrong.numpy()).pvalue < 1e-6


def test_identical_draft_is_always_accepted() -> None:
    p = torch.softmax(torch.randn(3, 5), -1)
    gen = torch.Generator().manual_seed(0)
    out = verify_sampled(p, p[:2].clone(), [1, 2], gen)
    assert out[:2] == [1, 2] and len(out) == 3


def test_batch_verification_mixes_plain_rows_drafts_greedy_and_sampling() -> None:
    torch.manual_seed(0)
    rows = [torch.randn(n, 6) for n in (1, 3, 4, 1, 4, 1)]
    ids = [r.argmax(-1).tolist() for r in rows]
    greedy, unseeded = SamplingParams(), SamplingParams(temperature=1.0, top_k=4)
    seeded = SamplingParams(temperature=1.0, top_k=4, seed=9)
    # The seeded candidate (prompt of 1 token, so its rows are output positions 0..3): its
    # first draft is the target's keyed draw there, its second is not.
    draws = keyed_draw(filtered_probs(rows[4], [seeded] * 4), [9] * 4, [0, 1, 2, 3])
    drafts = [[], [ids[1][0], (ids[1][1] + 1) % 6], [1, 2, 3], [], [draws[0], (draws[1] + 1) % 6, 0], []]
    params = [greedy, greedy, unseeded, unseeded, seeded, seeded]
    seqs = [Sequence(str(i), [0], p) for i, p in enumerate(params)]  # drafts are not among its tokens
    seqs[3].generator = torch.Generator().manual_seed(3)
    candidates = [
        Candidate(Scheduled(seq, 1), r, i, Drafted(1, d, None, len(d)) if d else None)
        for seq, r, i, d in zip(seqs, rows, ids, drafts, strict=True)
    ]
    verified = verify_batch(candidates)
    assert [v.candidate for v in verified] == candidates
    out, p_rows = [v.emitted for v in verified], [v.p for v in verified]
    assert out[0] == ids[0] and out[1] == ids[1][:2]  # one accepted, then the target's token
    assert p_rows[0] is None and p_rows[2] is not None and p_rows[2].shape == (4, 6)
    # A point-mass proposal keeps each draft with probability p(draft) and never re-draws it.
    assert 1 <= len(out[2]) <= 4
    # A row without drafts is drawn exactly as the plain sampler draws it.
    assert out[3] == sample(rows[3], [unseeded], [torch.Generator().manual_seed(3)], [0])
    # Seeded: the draft equal to the target's keyed draw stands, then the target's own draw.
    assert out[4] == draws[:2] and p_rows[4] is not None and p_rows[4].shape == (4, 6)
    assert out[5] == sample(rows[5], [seeded], [None], [0])


def test_overlap_is_one_minus_total_variation() -> None:
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]])
    assert overlap(p, q).tolist() == [0.5, 1.0]
