"""Memory and throughput of a weight format: bytes per parameter with its scales, how many parameters fit in a GPU's
HBM, and the batch at which a decode GEMM in that format becomes compute-bound."""
from __future__ import annotations


def bytes_per_param(elem_bits: int, scale_bits: int = 0, block_elems: int | None = None) -> float:
    """Bytes per element: elem_bits / 8 plus one scale of scale_bits per block_elems elements."""
    if elem_bits <= 0:
        raise ValueError(f"elem_bits={elem_bits}: must be positive")
    if scale_bits and not block_elems:
        raise ValueError("a scale needs block_elems (elements sharing it)")
    return elem_bits / 8 + (scale_bits / 8 / block_elems if scale_bits else 0.0)


STORAGE = {  # format -> (bytes per parameter incl. scales, the hardware dtype its GEMMs run in)
    "FP32": (4.0, "tf32"),
    "BF16": (2.0, "bf16"),
    "FP8 (1x128 FP32 scales)": (bytes_per_param(8, 32, 128), "fp8"),
    "FP8 (128x128 FP32 scales)": (bytes_per_param(8, 32, 128 * 128), "fp8"),
    "MXFP8": (bytes_per_param(8, 8, 32), "fp8"),
    "MXFP4": (bytes_per_param(4, 8, 32), "fp4"),
    "NVFP4": (bytes_per_param(4, 8, 16), "fp4"),
}


def max_params_billion(hbm_gb: float, bytes_per_parameter: float, reserve_fraction: float = 0.0) -> float:
    """Parameters (in billions) whose weights fit in hbm_gb GB (1e9 bytes), keeping reserve_fraction free."""
    if hbm_gb <= 0 or bytes_per_parameter <= 0 or not 0 <= reserve_fraction < 1:
        raise ValueError(f"hbm_gb={hbm_gb}, bytes_per_parameter={bytes_per_parameter}, "
                         f"reserve_fraction={reserve_fraction}: need positive sizes and 0 <= reserve < 1")
    return hbm_gb * (1 - reserve_fraction) / bytes_per_parameter


# Weight formats for the critical batch: (label, bytes per weight incl. scales, GEMM dtype, dtype used where the
# GPU has no tensor cores for the GEMM dtype -- the weights are dequantized to it in registers -- and a note).
WEIGHT_FORMATS = [
    ("BF16 (W16A16)", 2.0, "bf16", None, "weights and math in BF16"),
    ("FP8 W8A8 (128x128 FP32 scales)", bytes_per_param(8, 32, 128 * 128), "fp8", None,
     "both operands FP8 (DeepSeek-V3)"),
    ("W8A16 (8-bit weights, BF16 math)", bytes_per_param(8), "bf16", None,
     "weight-only: 8-bit weights dequantized to BF16"),
    ("W4A16 (4-bit weights, BF16 scale per 128)", bytes_per_param(4, 16, 128), "bf16", None,
     "weight-only: 4-bit weights dequantized to BF16"),
    ("NVFP4 W4A4", bytes_per_param(4, 8, 16), "fp4", "fp8", "FP4 tensor cores; on Hopper dequantized to FP8"),
    ("MXFP4 W4A4", bytes_per_param(4, 8, 32), "fp4", "fp8", "FP4 tensor cores; on Hopper dequantized to FP8"),
]


def critical_batch(gpu_id: str, weight_bytes: float, gemm_dtype: str, fallback_dtype: str | None = None) -> dict:
    """Tokens M* at which a weight-bound GEMM (M tokens through a K x N layer, weights read once) becomes
    compute-bound: intensity 2 M K N / (K N weight_bytes) = 2 M / weight_bytes meets the ridge peak / HBM bandwidth,
    so M* = ridge * weight_bytes / 2 (dense peak of the dtype the GEMM runs in; activations' bytes neglected).
    Where the GPU lacks `gemm_dtype` tensor cores, the GEMM runs in `fallback_dtype` (None: raise)."""
    from common.facts import hardware
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes={weight_bytes}: must be positive")
    dtype, note = gemm_dtype, ""
    try:
        ridge = hardware.ridge_point(gpu_id, gemm_dtype)
    except hardware.UnsupportedDtype:
        if fallback_dtype is None:
            raise
        dtype, note = fallback_dtype, f"no {gemm_dtype} tensor cores: dequantized to {fallback_dtype}"
        ridge = hardware.ridge_point(gpu_id, fallback_dtype)
    peak = hardware.peak_tflops(gpu_id, dtype)
    m_star = ridge * weight_bytes / 2
    return {"gemm_dtype": dtype, "dense_tflops": peak, "hbm_tbs": hardware.gpu(gpu_id).hbm_bandwidth_tbs,
            "ridge": ridge, "m_star": m_star, "note": note,
            "arithmetic": f"{peak:g} TFLOP/s / {hardware.gpu(gpu_id).hbm_bandwidth_tbs:g} TB/s = {ridge:.1f} FLOP/B;"
                          f" x {weight_bytes:.4g} B / 2 = {m_star:.1f}"}
