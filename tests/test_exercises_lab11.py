import math

import pytest

from common import kvcache, sharing
from common.checks import CheckFailed
from common.exercises import lab11


def _stub(*a):
    raise NotImplementedError("Exercise 11.x")


def test_kv_bytes_per_token():
    assert lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * kv * 2 * d * b).passed
    with pytest.raises(CheckFailed, match="all .* query heads"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * h * 2 * d * b)
    with pytest.raises(CheckFailed, match="both K and V"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: l * kv * d * b)
    with pytest.raises(CheckFailed, match="one layer"):
        lab11.check_kv_bytes_per_token(lambda l, h, kv, d, b: kv * 2 * d * b)
    assert lab11.check_kv_bytes_per_token(_stub).status == "not attempted"


def test_mla_bytes_per_token():
    assert lab11.check_mla_bytes_per_token(lambda l, r, p, b: l * (r + p) * b).passed
    with pytest.raises(CheckFailed, match="RoPE key"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: l * r * b)
    with pytest.raises(CheckFailed, match="ONE latent"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: 2 * l * (r + p) * b)
    with pytest.raises(CheckFailed, match="MLA bytes per token"):
        lab11.check_mla_bytes_per_token(lambda l, r, p, b: 128 * l * (r + p) * b)
    assert lab11.check_mla_bytes_per_token(_stub).status == "not attempted"


def test_paged_waste():
    assert lab11.check_paged_waste(lambda ls, b: sum(math.ceil(n / b) * b - n for n in ls)).passed
    with pytest.raises(CheckFailed, match="exact multiple"):
        lab11.check_paged_waste(lambda ls, b: sum((n // b + 1) * b - n for n in ls))
    with pytest.raises(CheckFailed, match="EMPTY slots"):
        lab11.check_paged_waste(lambda ls, b: sum(n % b for n in ls))
    with pytest.raises(CheckFailed, match="expected"):
        lab11.check_paged_waste(lambda ls, b: sum((n // b) * b - n for n in ls))
    assert lab11.check_paged_waste(_stub).status == "not attempted"


def test_shared_utilisation():
    assert lab11.check_shared_utilisation(sharing.shared_utilisation).passed

    def mig_uncapped(d, n, m):
        return min(n, 7) * d if m == "mig" else sharing.shared_utilisation(d, n, m)

    def mig_unlimited(d, n, m):
        return n * min(d, 1 / 7) if m == "mig" else sharing.shared_utilisation(d, n, m)

    def mps_uncapped(d, n, m):
        return n * d if m == "mps" else sharing.shared_utilisation(d, n, m)

    def slicing_adds(d, n, m):
        return min(1.0, n * d) if m == "time-slicing" else sharing.shared_utilisation(d, n, m)

    for wrong, match in [(mig_uncapped, "hard slice"), (mig_unlimited, "at most 7"), (mps_uncapped, "cannot exceed"),
                         (slicing_adds, "one context at a time")]:
        with pytest.raises(CheckFailed, match=match):
            lab11.check_shared_utilisation(wrong)
    assert lab11.check_shared_utilisation(_stub).status == "not attempted"
