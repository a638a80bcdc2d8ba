"""The hub's settings, checked before anything starts: the roster, the ports, the proxy, the sandbox, each learner's
share of the box. `python -m common hub start` writes them to `<state>/settings.json`, which `hub/jupyterhub_config.py`
reads; a bad value stops the start with a message that names it and says what to do."""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.core import validate
from common.core.env import REPO_ROOT
from common.core.hub import roster, share

DEFAULT_STATE = REPO_ROOT / "build" / "hub"
PROXY_DIR = REPO_ROOT / "build" / "hub" / "proxy"  # where scripts/hub_setup.sh installs the proxy with npm
PROXY_PACKAGE = "configurable-http-proxy@5"
NPM_HINT = ("install Node.js and npm (Debian/Ubuntu: `sudo apt-get install -y nodejs npm`; elsewhere "
            "https://nodejs.org), then run `make hub` again: it installs the proxy with "
            f"`npm install --prefix build/hub/proxy {PROXY_PACKAGE}`")


@dataclass
class Settings:
    learners: list[str]
    ip: str = "127.0.0.1"
    port: int = 8000
    hub_port: int = 8081
    proxy_api_port: int = 8001
    idle_timeout_s: int = 3600
    threads: int = 1
    memory_mb: int = 2048
    devices: dict = field(default_factory=dict)  # learner -> share.Device as a dict, or None
    state_dir: str = str(DEFAULT_STATE)
    proxy: str = ""
    ssl_cert: str = ""
    ssl_key: str = ""
    profile: str = "auto"  # what the labs' PROFILE = "auto" resolves to for every learner (WORKBOOK_PROFILE)

    def device(self, name: str) -> share.Device | None:
        d = self.devices.get(name)
        return share.Device(**d) if d else None

    def server_share(self, name: str):
        from common.core.hub.server import Share
        return Share(self.threads, self.memory_mb, self.device(name), self.profile)

    def save(self, path: Path | None = None) -> Path:
        path = Path(path or Path(self.state_dir) / "settings.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> "Settings":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path} not found: start the hub with `make hub ROSTER=learners.txt` (it checks the "
                             f"roster, ports and proxy, makes the accounts, then runs jupyterhub with "
                             f"hub/jupyterhub_config.py)")
        return cls(**json.loads(path.read_text()))


def port_in_use(ip: str, port: int) -> bool:
    """True when nothing may listen on ip:port now (another program holds it)."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
        try:
            s.bind((ip, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise ValueError(f"IP={ip!r} cannot be listened on here ({exc.strerror}); use 127.0.0.1 for this machine "
                             f"only, or 0.0.0.0 for the room") from None
    return False


def check_ports(ip: str, ports: dict[str, int]) -> None:
    """Each of {parameter: port} valid, distinct and free (the public one on `ip`, the others on 127.0.0.1)."""
    seen = {}
    for name, port in ports.items():
        validate.whole(name, port, minimum=1, meaning="a TCP port, 1-65535")
        if port > 65535:
            raise ValueError(f"{name}={port!r} must be a TCP port, 1-65535")
        if port in seen:
            raise ValueError(f"{name}={port} is also {seen[port]}: the hub needs three different ports")
        seen[port] = name
        where = ip if name == "PORT" else "127.0.0.1"
        if port_in_use(where, port):
            raise ValueError(f"{name}={port} is in use on {where} (another program, or a hub already running: "
                             f"`ss -ltnp | grep :{port}` shows which); choose another, e.g. `make hub {name}="
                             f"{port + 10}`")


def find_proxy(proxy_dir: Path = PROXY_DIR, path: str | None = None) -> str:
    """The configurable-http-proxy command: the one `make hub` installed under build/hub/proxy, else one on PATH (or
    on `path`); else a ValueError saying how to get it (with npm, or how to install npm)."""
    local = Path(proxy_dir) / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.exists():
        return str(local)
    found = shutil.which("configurable-http-proxy", path=path)
    if found:
        return found
    if shutil.which("npm", path=path):
        raise ValueError(f"configurable-http-proxy (JupyterHub's proxy) is not installed: run `make hub` (it runs "
                         f"`npm install --prefix {proxy_dir} {PROXY_PACKAGE}`), or `npm install -g "
                         f"{PROXY_PACKAGE}`")
    raise ValueError(f"configurable-http-proxy (JupyterHub's proxy, an npm package) is not installed and npm is not "
                     f"found: {NPM_HINT}")


def memory_limit_kind() -> str:
    """How a learner's memory is bounded on this box: 'memory cgroup' (root, and the host lets us make cgroups) or
    'RLIMIT_DATA per process'."""
    from common.core import bwrap
    probe = bwrap.Cgroup(f"workbook-hub-probe-{os.getpid()}", 64, 64)
    kinds = probe.kinds()
    probe.remove()
    return "memory cgroup" if "memory" in kinds else "RLIMIT_DATA per process"


def build(roster_file: Path, ip: str = "127.0.0.1", port: int = 8000, hub_port: int = 8081,
          proxy_api_port: int | None = None, idle_minutes: float = 60, threads: int | None = None,
          memory_mb: int | None = None, gpus: str = "auto", gpu_sharing: bool = False,
          state_dir: Path = DEFAULT_STATE, smi_output: str | None = None, ssl_cert: str = "", ssl_key: str = "",
          profile: str = "auto", check_free: bool = True) -> Settings:
    """Settings from the instructor's choices, every one checked (a ValueError names the first bad one)."""
    names = roster.read(roster_file)
    proxy_api_port = port + 1 if proxy_api_port is None else proxy_api_port
    ports = {"PORT": port, "HUB_PORT": hub_port, "PROXY_API_PORT": proxy_api_port}
    if check_free:
        check_ports(ip, ports)
    idle = validate.number("IDLE_MINUTES", idle_minutes, meaning="minutes a server may sit idle before it is stopped")
    threads = share.threads_per_learner(share.cores(), len(names)) if threads in (None, 0) else \
        validate.whole("THREADS", threads, meaning="CPU threads per learner")
    memory = share.memory_per_learner(share.total_memory_mb(), len(names)) if memory_mb in (None, 0) else \
        validate.whole("MEMORY_MB", memory_mb, minimum=256, meaning="memory per learner, in MB")
    devices = share.assign(names, share.list_devices(gpus, smi_output), gpu_sharing)
    from common.core.env import PROFILES
    if profile not in PROFILES:
        raise ValueError(f"PROFILE={profile!r}; allowed: {', '.join(PROFILES)} (what the labs' PROFILE = \"auto\" "
                         f"resolves to for every learner; quick on a MIG slice keeps the sizes small)")
    if bool(ssl_cert) != bool(ssl_key):
        raise ValueError("SSL_CERT and SSL_KEY go together: give both files (or neither, for plain HTTP)")
    for name, f in (("SSL_CERT", ssl_cert), ("SSL_KEY", ssl_key)):
        if f and not Path(f).is_file():
            raise ValueError(f"{name}={f!r} is not a file")
    return Settings(learners=names, ip=ip, port=port, hub_port=hub_port, proxy_api_port=proxy_api_port,
                    idle_timeout_s=int(idle * 60), threads=threads, memory_mb=memory,
                    devices={n: (asdict(d) if d else None) for n, d in devices.items()},
                    state_dir=str(Path(state_dir).resolve()), proxy=find_proxy(), ssl_cert=ssl_cert,
                    ssl_key=ssl_key, profile=profile)


def summary(s: Settings, memory_kind: str, passwords_file: Path) -> str:
    """What the instructor reads when the hub starts."""
    scheme = "https" if s.ssl_cert else "http"
    host = s.ip if s.ip not in ("0.0.0.0", "::", "") else socket.gethostname()
    gpus = share.sharing_lines({n: s.device(n) for n in s.learners}) or ["none (CPU only)"]
    lines = [f"hub: {len(s.learners)} learners, log in at {scheme}://{host}:{s.port}/",
             f"     passwords: {passwords_file} (hand each learner theirs)",
             f"     each learner: {s.threads} CPU thread(s) (OMP/MKL/OpenBLAS), {s.memory_mb} MB ({memory_kind}), "
             f"servers stopped after {s.idle_timeout_s // 60} idle minutes, labs' profile {s.profile}",
             "     GPU devices: " + "; ".join(gpus),
             "     " + ("as root: one Unix user per learner, homes 0700" if os.geteuid() == 0 else
                        "not root (a dry run): every learner's server runs as you, homes under " + str(
                            Path(s.state_dir) / "homes")),
             "     stop: Ctrl-C (stops every learner's server); collect and grade: make collect LAB=NN"]
    return "\n".join(lines)
