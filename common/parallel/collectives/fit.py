"""Alpha and the bandwidth fitted to measured times by least squares on relative error (`fit_alpha_beta`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from common.parallel.collectives.cost_model import bus_factor, check_collective, check_ranks, collective_time, steps


@dataclass
class Fit:
    """A fitted alpha-beta model of one collective over p ranks: t = steps*alpha + bus_factor*n/bandwidth."""

    collective: str
    p: int
    alpha_s: float
    bandwidth_Bps: float
    rms_rel_error: float = float("nan")

    @property
    def alpha_us(self) -> float:
        return self.alpha_s * 1e6

    @property
    def beta_gbps(self) -> float:
        """The fitted bandwidth in GB/s (beta = 1/bandwidth is the time per byte)."""
        return self.bandwidth_Bps / 1e9

    def predict(self, n_bytes):
        """Predicted seconds for one size or a sequence of sizes."""
        if isinstance(n_bytes, (int, float)):
            return collective_time(self.collective, n_bytes, self.p, max(self.alpha_s, 0.0), self.bandwidth_Bps)
        return [self.predict(float(n)) for n in n_bytes]

    def __str__(self) -> str:
        return (f"{self.collective} over {self.p} ranks: alpha = {self.alpha_us:.1f} us, bandwidth = "
                f"{self.beta_gbps:.2f} GB/s (rms relative error {self.rms_rel_error:.1%})")


def fit_alpha_beta(sizes_bytes: Sequence[float], seconds: Sequence[float], p: int,
                   collective: str = "all_reduce") -> Fit:
    """Least-squares fit of alpha (s) and bandwidth (bytes/s) to measured times of the ring/pairwise algorithm.

    The model is linear in x = (alpha, 1/bandwidth): t_i = steps * alpha + bus_factor * n_i * (1/bandwidth).
    Each equation is divided by t_i, so the fit minimises *relative* error: with sizes spanning several orders of
    magnitude, absolute least squares would let the largest messages decide everything and leave alpha to noise.
    """
    import numpy as np
    check_collective(collective)
    check_ranks(p)
    if p < 2:
        raise ValueError(f"p={p}: a collective over one rank moves nothing; fit with p >= 2")
    n = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape or len(n) < 2:
        raise ValueError(f"sizes_bytes and seconds must be 1-D of the same length >= 2 (got shapes {n.shape}, "
                         f"{t.shape})")
    if (n <= 0).any():
        raise ValueError(f"sizes_bytes must all be positive; got {n[n <= 0][0]!r}")
    if (t <= 0).any() or not np.isfinite(t).all():
        raise ValueError("seconds must all be positive and finite")
    if len(np.unique(n)) < 2:
        raise ValueError("need at least two different message sizes to separate alpha from bandwidth")
    a = np.stack([np.full_like(n, steps(collective, p)), bus_factor(collective, p) * n], axis=1) / t[:, None]
    x, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    alpha, inv_bw = float(x[0]), float(x[1])
    if inv_bw <= 0:
        raise ValueError("the fitted time per byte is not positive: the times do not grow with message size; "
                         "sweep larger messages")
    pred = steps(collective, p) * alpha + bus_factor(collective, p) * n * inv_bw
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return Fit(collective, p, alpha, 1.0 / inv_bw, rms)
