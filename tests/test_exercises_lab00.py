import pytest

from common.core.checks import CheckFailed
from common.exercises import lab00

B = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


def test_copy_bytes():
    assert lab00.check_copy_bytes(lambda n, d: 2 * n * B[d]).passed
    assert lab00.check_copy_bytes(lambda n, d: float(2 * n * B[d])).passed  # a float of the right value is right
    with pytest.raises(CheckFailed, match="counts only the read"):
        lab00.check_copy_bytes(lambda n, d: n * B[d])
    with pytest.raises(CheckFailed, match="uses 4 bytes per element"):
        lab00.check_copy_bytes(lambda n, d: 2 * n * 4)
    with pytest.raises(CheckFailed, match="counts elements"):
        lab00.check_copy_bytes(lambda n, d: 2 * n)
    with pytest.raises(CheckFailed, match="counts bits"):
        lab00.check_copy_bytes(lambda n, d: 16 * n * B[d])
    assert lab00.check_copy_bytes(lambda n, d: (_ for _ in ()).throw(NotImplementedError())).status == "not attempted"


@pytest.mark.parametrize("wrong_dtype", ["float64", "float16", "int8"])
def test_copy_bytes_wrong_size_table_fails_every_call(wrong_dtype):
    """Class 1: a wrong byte size for any one dtype fails on every call, not by luck of the random cases."""
    table = dict(B, **{wrong_dtype: 3})
    for _ in range(3):
        with pytest.raises(CheckFailed, match=f"copy_bytes\\(3, '{wrong_dtype}'\\)"):
            lab00.check_copy_bytes(lambda n, d: 2 * n * table[d])


def test_copy_bytes_learner_errors_name_the_call():
    """Class 6: a crash or a wrong type names the call and what was expected; failures print the seed."""
    with pytest.raises(CheckFailed, match=r"copy_bytes\(3, 'bfloat16'\) should return a number of bytes; your code "
                                          r"raised KeyError"):
        lab00.check_copy_bytes(lambda n, d: 2 * n * {"float32": 4}[d])
    with pytest.raises(CheckFailed, match=r"returned str .*expected a number.*seed \d+"):
        lab00.check_copy_bytes(lambda n, d: "lots")


def test_matmul_flops():
    assert lab00.check_matmul_flops(lambda m, n, k: 2 * m * n * k).passed
    with pytest.raises(CheckFailed, match="each is 2 FLOPs"):
        lab00.check_matmul_flops(lambda m, n, k: m * n * k)
    with pytest.raises(CheckFailed, match="one dimension is used twice"):
        lab00.check_matmul_flops(lambda m, n, k: 2 * m * n * n)
    with pytest.raises(CheckFailed, match="one dimension is used twice"):
        lab00.check_matmul_flops(lambda m, n, k: 2 * m * k * k)
    with pytest.raises(CheckFailed, match="expected 60, got 61"):
        lab00.check_matmul_flops(lambda m, n, k: 2 * m * n * k + 1)


def _predict(m, n, k, b, f, bw):
    return max(2 * m * n * k / f, (m * k + k * n + m * n) * b / bw)


def test_predict_matmul_seconds():
    assert lab00.check_predict_matmul_seconds(_predict).passed
    with pytest.raises(CheckFailed, match="added compute time and memory time"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: 2 * m * n * k / f + (m * k + k * n + m * n) * b / bw)
    with pytest.raises(CheckFailed, match="smaller of compute"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: min(2 * m * n * k / f, (m * k + k * n + m * n) * b / bw))
    with pytest.raises(CheckFailed, match="compute time alone"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: 2 * m * n * k / f)
    with pytest.raises(CheckFailed, match="memory time alone"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: (m * k + k * n + m * n) * b / bw)
    with pytest.raises(CheckFailed, match="predicted seconds"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: 1.01 * _predict(m, n, k, b, f, bw))
    with pytest.raises(CheckFailed, match="miss writing C"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: max(2 * m * n * k / f, (m * k + k * n) * b / bw))


def test_predict_parameters_varied():
    """Class 2: hard-coding 2 bytes per element, or counting elements, fails with the right name."""
    with pytest.raises(CheckFailed, match="ignore bytes_per_element"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: _predict(m, n, k, 2, f, bw))
    with pytest.raises(CheckFailed, match="counts elements, not bytes"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: _predict(m, n, k, 1, f, bw))


def test_calling_the_reference_is_caught():
    from common.core import ceilings
    with pytest.raises(CheckFailed, match="called common.core.ceilings.matmul_flops"):
        lab00.check_matmul_flops(lambda m, n, k: ceilings.matmul_flops(m, n, k))
    with pytest.raises(CheckFailed, match="called common.core.ceilings.copy_bytes"):
        lab00.check_copy_bytes(lambda n, d: ceilings.copy_bytes(n * B[d]))


# --- 0.3: the two ceilings, measured right (on a simulated busy device) -------------------------------------------
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402


def _blocks_of(op, sync, calls):
    start = time.perf_counter()
    for _ in range(calls):
        op()
    sync()
    return time.perf_counter() - start


def harness(warm=True, sync_each=True, keep="best", single=False, fixed_blocks=None, unit=1.0, per_block=False):
    """The right harness (warm-up; double the calls until a block lasts 1 ms; blocks until min_time; the best
    block's seconds per call), or it with one mistake."""
    def best_seconds_per_call(op, sync, min_time):
        if warm:
            op()
            sync()
        calls = 1
        while not single and _blocks_of(op, sync, calls) < 1e-3:
            calls *= 2
        blocks, timed = [], 0.0
        while (timed < min_time) if fixed_blocks is None else (len(blocks) < fixed_blocks):
            start = time.perf_counter()
            for _ in range(calls):
                op()
            if sync_each:
                sync()
            elapsed = time.perf_counter() - start
            blocks.append(elapsed if per_block else elapsed / calls)
            timed += elapsed
        sync()
        pick = {"best": min, "median": statistics.median, "mean": statistics.fmean}[keep]
        return pick(blocks) * unit
    return best_seconds_per_call


RIGHT_HARNESS = harness()


def copy_ceiling_with(harness=RIGHT_HARNESS, factor=2, zeros=False, alloc=False, verify=True, after=False,
                      threads=None, key="gbps"):
    def copy_ceiling(nbytes, device, sync, min_time):
        src = torch.zeros(nbytes // 4) if zeros else torch.rand(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        if verify and not after:
            dst.copy_(src)
            sync()
            if not torch.equal(dst, src):
                raise RuntimeError("the copy differs from its source")
        op = (lambda: src.clone()) if alloc else (lambda: dst.copy_(src))
        seconds = harness(op, sync, min_time)
        if after and not torch.equal(dst, src):
            raise RuntimeError("the copy differs from its source")
        return {key: factor * src.numel() * 4 / seconds / 1e9, "threads": threads or torch.get_num_threads()}
    return copy_ceiling


def matmul_ceiling_with(harness=RIGHT_HARNESS, flops_per_fma=2, verify=True, reference="float64", strict=False):
    def matmul_ceiling(n, dtype, device, sync, min_time):
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        if verify:
            got = (a[:8] @ b).double()
            ref = a[:8].double() @ b.double() if reference == "float64" else (a[:8] @ b).double()
            same = torch.equal(got, ref) if strict else torch.allclose(got, ref, rtol=1e-2, atol=1e-2 * n ** 0.5)
            if not same:
                raise ValueError("the matmul disagrees with float64")
        seconds = harness(lambda: a @ b, sync, min_time)
        return {"gflops": flops_per_fma * n ** 3 / seconds / 1e9, "threads": torch.get_num_threads()}
    return matmul_ceiling


RIGHT = (RIGHT_HARNESS, copy_ceiling_with(), matmul_ceiling_with())


def _with(**parts):
    fns = dict(zip(("harness", "copy", "matmul"), RIGHT))
    fns.update(parts)
    return fns["harness"], fns["copy"], fns["matmul"]


def test_ceilings_right():
    for seed in range(4):
        assert lab00.check_ceilings(*RIGHT, seed=seed).passed


def test_ceilings_right_written_otherwise():
    """A deadline loop sized from one timed call, perf_counter_ns, checks.verify: all right."""
    from common.core.checks import verify

    def deadline(op, sync, min_time):
        op()
        sync()
        start = time.perf_counter_ns()
        op()
        sync()
        calls = max(1, math.ceil(1e6 / (time.perf_counter_ns() - start)))
        best, end = math.inf, time.perf_counter() + min_time
        while time.perf_counter() < end:
            best = min(best, _blocks_of(op, sync, calls) / calls)
        return best

    def copy_verified(nbytes, device, sync, min_time):
        src = torch.rand(nbytes // 4, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)
        verify(dst, src, "the copy", rtol=0, atol=0)
        return {"gbps": 2 * nbytes / deadline(lambda: dst.copy_(src), sync, min_time) / 1e9,
                "threads": torch.get_num_threads()}
    for seed in range(3):
        assert lab00.check_ceilings(deadline, copy_verified, matmul_ceiling_with(harness=deadline), seed=seed).passed


CEILING_MISTAKES = [  # (name, the three functions, the words that must name it)
    ("no sync", _with(harness=harness(sync_each=False)), "clock stopped before sync"),
    ("no warm-up", _with(harness=harness(warm=False)), "Warm up"),
    ("median block", _with(harness=harness(keep="median")), "median of your blocks"),
    ("mean block", _with(harness=harness(keep="mean")), "mean of your blocks"),
    ("one call per block", _with(harness=harness(single=True)), "each block holds ONE call"),
    ("fixed block count", _with(harness=harness(fixed_blocks=3)), "add up to min_time"),
    ("milliseconds", _with(harness=harness(unit=1e3)), "that is milliseconds"),
    ("seconds per block", _with(harness=harness(per_block=True)), "seconds of a whole block"),
    ("bytes once", _with(copy=copy_ceiling_with(factor=1)), "counts the bytes once"),
    ("write-allocate", _with(copy=copy_ceiling_with(factor=3)), "write-allocate"),
    ("FLOPs without the 2", _with(matmul=matmul_ceiling_with(flops_per_fma=1)), "counts multiply-adds"),
    ("timed on zeros", _with(copy=copy_ceiling_with(zeros=True)), "constant data"),
    ("allocation in the timed block", _with(copy=copy_ceiling_with(alloc=True)), "allocated inside a timed block"),
    ("copy never verified", _with(copy=copy_ceiling_with(verify=False)), "WHOLE destination"),
    ("verified after timing", _with(copy=copy_ceiling_with(after=True)), "only after timing"),
    ("matmul never verified", _with(matmul=matmul_ceiling_with(verify=False)), "computed in float64"),
    ("checked against float32", _with(matmul=matmul_ceiling_with(reference="float32")), "computed in float64"),
    ("verification without tolerance", _with(matmul=matmul_ceiling_with(strict=True)), "compare with a tolerance"),
    ("threads not reported", _with(copy=copy_ceiling_with(threads=1)), "torch.get_num_threads"),
    ("result not a dict", _with(copy=copy_ceiling_with(key="GB/s")), "return a dict"),
]


@pytest.mark.parametrize("name, fns, words", CEILING_MISTAKES, ids=[m[0] for m in CEILING_MISTAKES])
def test_ceilings_mistakes_named(name, fns, words):
    for seed in (1, 2, 3):
        with pytest.raises(CheckFailed, match=words):
            lab00.check_ceilings(*fns, seed=seed)


def test_ceilings_reference_is_caught():
    from common.core import ceilings

    def copy_by_reference(nbytes, device, sync, min_time):
        c = ceilings.measure_copy_bandwidth(nbytes, device, min_run_time=0.001)
        return {"gbps": c.value, "threads": 1}
    with pytest.raises(CheckFailed, match="called common.core.ceilings.measure_copy_bandwidth"):
        lab00.check_ceilings(RIGHT_HARNESS, copy_by_reference, RIGHT[2])


def test_ceilings_stub():
    def stub(*args):
        raise NotImplementedError("Exercise 0.3")
    assert lab00.check_ceilings(stub, stub, stub).status == "not attempted"
    assert lab00.check_ceilings(RIGHT_HARNESS, stub, stub).status == "not attempted"
