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
