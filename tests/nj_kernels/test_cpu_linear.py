"""The skinny CPU linear kernel: the torch product to rounding, batch-invariant, and the
dispatch rule (few fp32 CPU rows take it, everything else takes F.linear)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from nj_kernels import cpu_linear

pytestmark = pytest.mark.skipif(not cpu_linear.available(), reason="needs cc with AVX2/FMA (x86-64)")


@pytest.mark.parametrize("k", [576, 577, 5, 16, 1536])
@pytest.mark.parametrize("n", [1, 3, 4, 13])
def test_it_computes_the_product_and_bias_to_rounding(k: int, n: int) -> None:
    g = torch.Generator().manual_seed(k * 31 + n)
    x, w, b = torch.randn(9, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    exact = F.linear(x.double(), w.double(), b.double())
    got = cpu_linear.skinny_linear(x, w, b)
    assert got.dtype == torch.float32 and got.shape == (9, n)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(cpu_linear.skinny_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)


def test_a_rows_result_does_not_depend_on_the_other_rows() -> None:
    """What makes a verification's logits equal a decode step's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(11, 300, generator=g), torch.randn(37, 300, generator=g)
    whole = cpu_linear.skinny_linear(x, w)
    for i in range(11):
        assert torch.equal(cpu_linear.skinny_linear(x[i : i + 1], w)[0], whole[i])
    assert torch.equal(cpu_linear.skinny_linear(x[3:8], w), whole[3:8])
    assert torch.equal(cpu_linear.skinny_linear(torch.cat([x[5:6], x[:2]]), w)[0], whole[5])


def test_non_contiguous_inputs_are_taken_as_their_values() -> None:
    x = torch.randn(6, 40)[:, ::2]
    w = torch.randn(8, 20)
    torch.testing.assert_close(cpu_linear.skinny_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_dispatch_few_fp32_cpu_rows_take_the_kernel_others_take_torch() -> None:
    w = torch.randn(8, 16)
    rows = cpu_linear.max_rows()
    assert rows >= 16
    assert cpu_linear.applies(torch.randn(rows, 16), w)
    assert not cpu_linear.applies(torch.randn(rows + 1, 16), w)
    assert not cpu_linear.applies(torch.randn(2, 16, dtype=torch.float64), w.double())
    assert not cpu_linear.applies(torch.randn(2, 16), w.t().contiguous().t())
    x = torch.randn(rows + 1, 16)
    assert torch.equal(cpu_linear.linear(x, w), F.linear(x, w))


def test_shape_or_dtype_mismatch_is_refused() -> None:
    with pytest.raises(ValueError):
        cpu_linear.skinny_linear(torch.randn(2, 5), torch.randn(3, 6))


def test_the_build_is_cached_by_source_and_machine(tmp_path: Path) -> None:
    first = cpu_linear.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert cpu_linear.build(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left behind


def _restore(lib: object) -> None:
    """The process's reading orders as it loaded them (other tests run after these)."""
    rows = cpu_linear.stream_rows(lib)  # type: ignore[arg-type]
    for m in range(1, cpu_linear.PASS_ROWS + 1):
        lib.skinny_set_stream(m, int(m in rows))  # type: ignore[attr-defined]


def test_both_reading_orders_give_the_same_bits_for_every_row_count() -> None:
    """The order the weights are read in is chosen per machine (``stream_rows``): it must
    never change a result."""
    lib = cpu_linear.library()
    assert lib is not None
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(37, 577, generator=g), torch.randn(37, generator=g)
    try:
        for m in range(1, cpu_linear.PASS_ROWS + 1):
            x = torch.randn(m, 577, generator=g)
            got = []
            for on in (0, 1):
                lib.skinny_set_stream(m, on)
                got.append(cpu_linear.skinny_linear(x, w, b))
            assert torch.equal(got[0], got[1]), m
            torch.testing.assert_close(got[0], F.linear(x, w, b), rtol=1e-5, atol=1e-4)
    finally:
        _restore(lib)


def test_the_reading_order_is_measured_once_per_machine_or_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = cpu_linear.library()
    assert lib is not None
    measured: list[int] = []

    def measure(lib: object) -> list[int]:
        measured.append(1)
        return [1, 2, 3]

    monkeypatch.setattr(cpu_linear, "measure_stream_rows", measure)
    monkeypatch.delenv("NIGHTJAR_SKINNY_STREAM", raising=False)
    assert cpu_linear.stream_rows(lib, tmp_path) == [1, 2, 3]
    assert cpu_linear.stream_rows(lib, tmp_path) == [1, 2, 3] and measured == [1]  # kept
    (kept,) = tmp_path.iterdir()  # one file, no temporary one left behind
    kept.write_text("[1, 2", encoding="utf-8")  # torn or corrupt: measured again
    assert cpu_linear.stream_rows(lib, tmp_path) == [1, 2, 3] and measured == [1, 1]
    kept.write_text("[1, 99]", encoding="utf-8")  # out of range: only what can be set
    assert cpu_linear.stream_rows(lib, tmp_path) == [1]
    monkeypatch.setenv("NIGHTJAR_SKINNY_STREAM", "1,4,99,x")
    assert cpu_linear.stream_rows(lib, tmp_path) == [1, 4]
    monkeypatch.setenv("NIGHTJAR_SKINNY_STREAM", "2")  # one row in blocks too, as asked
    assert cpu_linear.stream_rows(lib, tmp_path) == [2]


def test_the_measurement_takes_the_faster_order_per_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed side by side: the address order where it is ``STREAM_MARGIN`` faster, the
    blocks elsewhere (here a clock that makes the address order faster for even row counts)."""
    lib = cpu_linear.library()
    assert lib is not None
    monkeypatch.setattr(cpu_linear, "CALIBRATION_BYTES", 1 << 20)
    rows = cpu_linear.measure_stream_rows(lib)  # the real clock: any answer within a pass
    assert 1 in rows and set(rows) <= set(range(1, cpu_linear.PASS_ROWS + 1))
    calls: list[tuple[int, int]] = []
    real = lib.skinny_set_stream

    class Fake:
        def __init__(self) -> None:
            self.state: dict[int, int] = {}
            self.t = 0.0

        def skinny_set_stream(self, m: int, on: int) -> None:
            self.state[m] = on
            calls.append((m, on))

        def skinny_linear(self, x: int, w: int, b: object, y: int, m: int, n: int, k: int) -> None:
            self.t += 1.0 if (self.state.get(m) and m % 2 == 0) else 2.0

    fake = Fake()
    monkeypatch.setattr(cpu_linear.time, "perf_counter", lambda: fake.t)
    assert cpu_linear.measure_stream_rows(fake) == [1, 2, 4, 6]  # type: ignore[arg-type]
    last = dict(calls)  # each row count's last setting: left at the blocks for the caller to set
    assert sorted(last) == list(range(2, cpu_linear.PASS_ROWS + 1)) and set(last.values()) == {0}
    assert real is lib.skinny_set_stream
    _restore(lib)
