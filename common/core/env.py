"""Environment: profile, device, Triton mode, seeds and a printable inventory of this machine.

Call `setup()` in every notebook's set-up cell. It must run before anything imports triton, because on a machine
without a GPU it sets TRITON_INTERPRET=1 so that Triton kernels run under the interpreter on the CPU.
"""
from __future__ import annotations

import os
import platform
import random
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

PROFILES = ("auto", "quick", "full")
REPO_ROOT = Path(__file__).resolve().parents[2]

_current: "Env | None" = None


@dataclass
class Env:
    """What `setup` chose: read `profile`, `device` and `triton_mode` instead of re-detecting."""

    lab: str
    profile: str  # "quick" or "full" (never "auto" once resolved)
    device: str  # "cuda" or "cpu"
    device_name: str  # e.g. "NVIDIA H100 80GB HBM3" or the CPU model
    device_id: str  # ledger/baseline key: a hardware id such as "H100-SXM", else "cuda-other" or "cpu"
    triton_mode: str  # "compiled", "interpreted" or "unavailable"
    seed: int
    headless: bool  # True under papermill/nbval/CI: widgets fall back to static plots
    extras: dict = field(default_factory=dict)

    @property
    def quick(self) -> bool:
        return self.profile == "quick"

    def pick(self, quick, full):
        """Return the value for this profile: `env.pick(quick=256, full=8192)`."""
        return quick if self.profile == "quick" else full

    def summary(self) -> str:
        return (f"lab {self.lab} | profile {self.profile} | device {self.device} ({self.device_name}) | "
                f"triton {self.triton_mode} | seed {self.seed}")


def resolve_profile(profile: str, has_gpu: bool) -> str:
    """Validate a PROFILE value and resolve "auto" (env WORKBOOK_PROFILE may override "auto")."""
    if not isinstance(profile, str) or profile not in PROFILES:
        raise ValueError(f"PROFILE={profile!r} is not a profile; allowed: {', '.join(PROFILES)}")
    if profile == "auto":
        override = os.environ.get("WORKBOOK_PROFILE", "auto")
        if override not in PROFILES:
            raise ValueError(f"WORKBOOK_PROFILE={override!r} is not a profile; allowed: {', '.join(PROFILES)}")
        profile = override
    if profile == "auto":
        profile = "full" if has_gpu else "quick"
    return profile


def _cuda_available() -> bool:
    if os.environ.get("WORKBOOK_FORCE_CPU") == "1":
        return False
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # torch missing or broken driver: behave as a CPU machine
        return False


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def is_headless() -> bool:
    """True when no one is looking: papermill, nbval, CI, or WORKBOOK_HEADLESS=1."""
    return any(os.environ.get(k) for k in ("WORKBOOK_HEADLESS", "CI", "PAPERMILL_EXECUTION"))


def configure_triton(has_gpu: bool) -> str:
    """Set TRITON_INTERPRET before triton is imported; return the Triton mode."""
    if not has_gpu:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("triton was imported before common.setup(): restart the kernel and run the set-up "
                               "cell first, so Triton can be put in interpreter mode on this CPU-only machine")
        os.environ["TRITON_INTERPRET"] = "1"
    import importlib.util
    try:  # found, not imported: a lab that never launches a kernel pays nothing for it (about 0.7 s per notebook)
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return "unavailable"
    return "compiled" if has_gpu and os.environ.get("TRITON_INTERPRET") != "1" else "interpreted"


# torch.cuda.get_device_name() -> the hardware ids used in data/ and the ledger. Rules are tried in order, most specific
# first; each lists words that must all appear in the upper-cased name. A variant with its own memory system gets its
# own id (data/hardware.json "gpu_variants" holds its sourced facts); a name no rule claims, or one that cannot be
# told apart by name, is unknown (None) -- never a neighbour's datasheet.
_GPU_NAME_RULES = (
    (("GH200",), None),  # Grace Hopper: 96 GB HBM3 at 4 TB/s or 144 GB HBM3e at 4.9 TB/s; "H200" is a substring
    (("GB200",), "GB200"),
    (("B200",), "B200"),
    (("H200", "NVL"), "H200-NVL"),
    (("H200",), "H200-SXM"),
    (("H800",), "H800-SXM"),
    (("H100", "NVL"), "H100-NVL"),  # 94 GB, 3.9 TB/s: not the SXM's 80 GB at 3.35 TB/s
    (("H100",), "H100-SXM"),
    (("A100", "40GB"), "A100-40GB"),  # HBM2 at 1.555 TB/s: not the 80 GB's 2.039 TB/s
    (("A100",), "A100-SXM"),
)


def identify_gpu(name: str) -> str | None:
    """Map a CUDA device name to a hardware id ("H100-SXM", "H100-NVL", ...), or None when unknown.

    A PCIe card (other than the NVL parts, which carry their own ids) is unknown: its clocks and memory differ from
    the SXM module's. A name containing a known chip but no distinguishing word maps to the SXM module."""
    upper = name.upper()
    for words, hw_id in _GPU_NAME_RULES:
        if all(w in upper for w in words):
            if hw_id is not None and "PCIE" in upper and "NVL" not in hw_id:
                return None
            return hw_id
    return None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass
    try:
        import torch
        torch.manual_seed(seed)
    except ImportError:
        pass


def setup(lab: str, profile: str = "auto", seed: int = 0, quiet: bool = False) -> Env:
    """Resolve the profile and device for notebook `lab`, seed RNGs, set Triton's mode, and print the choice."""
    global _current
    has_gpu = _cuda_available()
    resolved = resolve_profile(profile, has_gpu)
    triton_mode = configure_triton(has_gpu)
    # Triton's interpreter runs a kernel's arithmetic in NumPy, which warns on an overflow or a NaN (a learner's
    # unmasked exp, say): the check names the wrong result; the warning would only print red to stderr
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton(\.|$)")
    seed_everything(seed)
    if has_gpu:
        import torch
        name = torch.cuda.get_device_name(0)
        device_id = identify_gpu(name) or "cuda-other"
    else:
        name, device_id = cpu_model(), "cpu"
    _current = Env(lab=lab, profile=resolved, device="cuda" if has_gpu else "cpu", device_name=name,
                   device_id=device_id, triton_mode=triton_mode, seed=seed, headless=is_headless())
    try:
        from common.core import plots
        plots.use_house_style()
    except ImportError:
        pass
    try:
        from common.core import checks
        checks.install_notebook_handler()
    except ImportError:
        pass
    if not quiet:
        print(_current.summary())
    return _current


def current() -> Env:
    """The Env of the last `setup` call (a CPU quick default when none was made, e.g. in tests)."""
    global _current
    if _current is None:
        _current = setup("adhoc", quiet=True)
    return _current


def inventory() -> dict:
    """Facts about this machine and its software, as a flat dict (measured values are elsewhere)."""
    import psutil
    info = {
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu_model": cpu_model(),
        "cpu_cores_logical": os.cpu_count(),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info.update(gpu_name=p.name, gpu_count=torch.cuda.device_count(), gpu_sms=p.multi_processor_count,
                        gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda,
                        gpu_capability=f"{p.major}.{p.minor}")
    except ImportError:
        info["torch"] = "not installed"
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = "not installed"
    info["triton_mode"] = "interpreted" if os.environ.get("TRITON_INTERPRET") == "1" else (
        "compiled" if info.get("cuda_available") else "unavailable")
    return info
