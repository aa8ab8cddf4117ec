"""Scheduler policy without a model: budgets, chunking, priorities, preemption, rejection."""

from __future__ import annotations

from shared.schemas import SamplingParams
from worker.engine.block_manager import BlockManager
from worker.engine.scheduler import Scheduler, SchedulerOutput
from worker.engine.sequence import Sequence, Status

BS = 4


def make(num_blocks: int = 64, seqs: int = 8, tokens: int = 16, max_len: int = 1000) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), seqs, tokens, max_len)


def seq(name: str, length: int, priority: int = 0, arrival: float = 0.0) -> Sequence:
    return Sequence(name, list(range(10, 10 + length)), SamplingParams(), priority, arrival)


def advance(out: SchedulerOutput) -> None:
    """Pretend the forward ran: tokens computed, one sampled where a sequence reached its end."""
    for s in out.scheduled:
        s.seq.num_computed += s.num_new
        if s.seq.num_computed == len(s.seq.token_ids):
            s.seq.append(7)
            s.seq.prefilling = False


def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(s.seq.request_id, s.num_new) for s in out.scheduled]


def test_long_prompt_is_chunked_and_decodes_share_the_budget() -> None:
    sch = make(tokens=16)
    sch.add(seq("a", 3))
    advance(sch.schedule())
    sch.add(seq("b", 40))
    out = sch.schedule()
    assert plan(out) == [("a", 1), ("b", 15)]
    advance(out)
    assert plan(sch.schedule()) == [("a", 1), ("b", 15)]


def test_priority_then_arrival_order() -> None:
    sch = make(seqs=2, tokens=100)
    sch.add(seq("late-urgent", 4, priority=-1, arrival=5.0))
    sch.add(seq("early", 4, arrival=1.0))
    sch.add(seq("later", 4, arrival=2.0))
    assert [s for s, _ in plan(sch.schedule())] == ["late-urgent", "early"]
    assert [s.request_id for s in sch.waiting] == ["later"]


def test_preempts_the_newest_and_requeues_it_in_front() -> None:
    sch = make(num_blocks=5, tokens=100)
    sch.add(seq("a", 7, arrival=1.0))
    sch.add(seq("b", 7, arrival=2.0))
    advance(sch.schedule())  # 2 + 2 blocks, 1 left
    sch.add(seq("c", 2, arrival=3.0))
    advance(sch.schedule())  # a and b decode inside their blocks; c takes the last block
    # Position 8 needs a third block for a and for b: c (newest) goes first, then b itself.
    out = sch.schedule()
    assert [s.request_id for s in out.preempted] == ["c", "b"]
    assert plan(out) == [("a", 1)]
    assert [s.request_id for s in sch.waiting] == ["b", "c"]  # earlier arrival first
    b = sch.waiting[0]
    assert b.status is Status.WAITING and b.num_computed == 0 and b.token_ids[-2:] == [7, 7]
    assert sch.blocks.table("b") == [] and sch.blocks.table("c") == []


def test_a_lone_sequence_that_cannot_get_a_block_preempts_itself_without_crashing() -> None:
    sch = make(num_blocks=2, tokens=100)
    a = seq("a", 8)
    sch.add(a)
    advance(sch.schedule())
    out = sch.schedule()  # needs a third block
    assert [s.request_id for s in out.preempted] == ["a"] and out.scheduled == []


def test_admission_stops_at_the_first_request_that_does_not_fit() -> None:
    sch = make(num_blocks=4, tokens=100)
    sch.add(seq("big", 20, arrival=1.0))  # 5 blocks: not now
    sch.add(seq("small", 2, arrival=2.0))
    out = sch.schedule()
    assert out.scheduled == [] and [s.request_id for s in sch.waiting] == ["big", "small"]
    assert sch.blocks.num_free_blocks == 4  # nothing held by the refused admission
    assert sch.blocks.prefix_queries == 0


def test_too_long_prompt_is_rejected_with_an_error() -> None:
    sch = make(max_len=10)
    sch.add(seq("long", 10))
    sch.add(seq("ok", 9))
    out = sch.schedule()
    (rejected,) = out.rejected
    assert rejected.finish_reason == "error" and "10 tokens" in str(rejected.error)
    assert plan(out) == [("ok", 9)]


def test_running_limit() -> None:
    sch = make(seqs=2, tokens=100)
    for name in "abc":
        sch.add(seq(name, 2))
    assert len(sch.schedule().scheduled) == 2 and len(sch.waiting) == 1


def test_lookahead_reserves_draft_slots_for_decoding_sequences_only() -> None:
    sch = make(tokens=12)
    sch.add(seq("a", 3))
    advance(sch.schedule())  # a decodes from now on: 4 tokens, 3 computed
    sch.add(seq("b", 30))
    out = sch.schedule(num_lookahead=3)
    planned = [(s.seq.request_id, s.num_new, s.num_lookahead) for s in out.scheduled]
    assert planned == [("a", 1, 3), ("b", 8, 0)]
    assert len(sch.blocks.table("a")) == 2  # positions up to 3 + 1 + 3 = 7


def test_lookahead_shrinks_near_max_tokens_and_the_context_limit() -> None:
    sch = make(tokens=64, max_len=12)
    for name, length, max_tokens in (("near-max", 3, 3), ("near-len", 8, 50), ("free", 3, 50)):
        s = Sequence(name, list(range(10, 10 + length)), SamplingParams(max_tokens=max_tokens))
        sch.add(s)
    advance(sch.schedule())  # each has one output token now
    out = sch.schedule(num_lookahead=4)
    # γ+1 emitted tokens must fit: 3 - 1 - 1 = 1 draft; 12 - 9 - 1 = 2 drafts; the full 4.
    assert {s.seq.request_id: s.num_lookahead for s in out.scheduled} == {
        "near-max": 1,
        "near-len": 2,
        "free": 4,
    }


def test_every_sequence_let_go_of_is_released_once_per_release() -> None:
    """Preempted (in ``schedule``, ``preempt`` or ``resize``) or removed: ``on_release`` hears it."""
    released: list[str] = []
    sch = Scheduler(BlockManager(3, BS), 8, 64, 1000, on_release=released.append)
    for name in ("a", "b", "c"):
        sch.add(seq(name, 4))
    advance(sch.schedule())  # one block each, all full
    out = sch.schedule()  # each needs a second block: the newest go
    assert [s.request_id for s in out.preempted] == released == ["c", "b"]
    sch.remove(sch.running[0])
    assert released == ["c", "b", "a"]
    sch.remove(sch.waiting[0])  # waiting: no blocks, released all the same
    assert released[-1] in ("b", "c") and len(released) == 4


def test_a_shrinking_pool_preempts_the_newest_until_the_blocks_fit() -> None:
    released: list[str] = []
    sch = Scheduler(BlockManager(8, BS), 8, 64, 1000, on_release=released.append)
    for name in ("a", "b", "c"):
        sch.add(seq(name, 7))
    advance(sch.schedule())  # two blocks each: 6 of 8 used
    moves, preempted = sch.resize(3)
    assert preempted == 2 and released == ["c", "b"] and [s.request_id for s in sch.running] == ["a"]
    assert sch.blocks.num_blocks == 3 and all(dst < 3 for _, dst in moves)
    sch.blocks.check_integrity()
    assert sch.resize(8) == ([], 0)
