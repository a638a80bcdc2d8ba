import pytest

from common.checks import CheckFailed
from common.exercises import lab00

B = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


def test_copy_bytes():
    assert lab00.check_copy_bytes(lambda n, d: 2 * n * B[d]).passed
    with pytest.raises(CheckFailed, match="counts only the read"):
        lab00.check_copy_bytes(lambda n, d: n * B[d])
    with pytest.raises(CheckFailed, match="expected"):
        lab00.check_copy_bytes(lambda n, d: 2 * n * 4)
    assert lab00.check_copy_bytes(lambda n, d: (_ for _ in ()).throw(NotImplementedError())).status == "not attempted"


def test_matmul_flops():
    assert lab00.check_matmul_flops(lambda m, n, k: 2 * m * n * k).passed
    with pytest.raises(CheckFailed, match="each is 2 FLOPs"):
        lab00.check_matmul_flops(lambda m, n, k: m * n * k)
    with pytest.raises(CheckFailed, match="expected"):
        lab00.check_matmul_flops(lambda m, n, k: 2 * m * n * n)


def _predict(m, n, k, b, f, bw):
    return max(2 * m * n * k / f, (m * k + k * n + m * n) * b / bw)


def test_predict_matmul_seconds():
    assert lab00.check_predict_matmul_seconds(_predict).passed
    with pytest.raises(CheckFailed, match="added compute time and memory time"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: 2 * m * n * k / f + (m * k + k * n + m * n) * b / bw)
    with pytest.raises(CheckFailed, match="predicted seconds"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: 2 * m * n * k / f)
    with pytest.raises(CheckFailed, match="predicted seconds"):
        lab00.check_predict_matmul_seconds(lambda m, n, k, b, f, bw: max(2 * m * n * k / f, (m * k + k * n) * b / bw))
