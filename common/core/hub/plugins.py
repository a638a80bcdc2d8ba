"""The workbook's JupyterHub classes and configuration (this module imports jupyterhub; nothing in `make test` does).

`RosterAuthenticator`: learners log in with their roster name and the password the hub made for them
(`<state>/passwords.csv`). `WorkbookSpawner`: a LocalProcessSpawner that starts each learner's Jupyter server in its
sandbox (`server`), in their own copy of the workbook (`accounts`), with their share of the box. `configure(c, path)`
is what `hub/jupyterhub_config.py` does with the settings `python -m common hub start` checked and saved.
"""
from __future__ import annotations

import csv
import hmac
import os
import shutil
import sys
import tempfile
from pathlib import Path

from jupyterhub.auth import Authenticator
from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Unicode

from common.core import bwrap
from common.core.env import REPO_ROOT
from common.core.hub import accounts, server
from common.core.hub.settings import Settings


class RosterAuthenticator(Authenticator):
    """Roster name + the hub-made password; the roster itself is `allowed_users`."""
    passwords_file = Unicode(help="CSV of learner,password (mode 0600), written by `python -m common hub start`",
                             config=True)

    async def authenticate(self, handler, data):
        name = self.normalize_username(data.get("username", ""))
        with open(self.passwords_file, newline="") as f:
            known = {row["learner"]: row["password"] for row in csv.DictReader(f)}
        if name in known and hmac.compare_digest(known[name].encode(), data.get("password", "").encode()):
            return name
        self.log.warning("failed login for %r", name)
        return None


class WorkbookSpawner(LocalProcessSpawner):
    """A learner's server in its own sandbox and copy of the workbook, with its threads, memory and GPU device."""
    settings_file = Unicode(help="settings.json written by `python -m common hub start`", config=True)

    _tmp: Path | None = None
    _cgroup: bwrap.Cgroup | None = None

    def _settings(self) -> Settings:
        return Settings.load(Path(self.settings_file))

    def _learner(self) -> accounts.Learner:
        return accounts.learner(self.user.name, Path(self._settings().state_dir))

    def make_preexec_fn(self, name):
        limited = self._cgroup is not None and "memory" in self._cgroup.kinds()
        return server.rlimit_preexec(None if limited else self._settings().memory_mb)

    def user_env(self, env):
        s = self._settings()
        limited = self._cgroup is not None and "memory" in self._cgroup.kinds()
        note = f"{s.memory_mb} MB, " + ("memory cgroup" if limited else "RLIMIT_DATA per process")
        env.update(server.environment(self._learner(), s.server_share(self.user.name), note))
        return env

    async def start(self):
        s = self._settings()
        who = self._learner()
        accounts.prepare_copy(who, accounts.lab_files(), server.mountpoints())
        self._cleanup()
        self._tmp = Path(tempfile.mkdtemp(prefix=f"workbook-hub-{who.name}-"))
        self._tmp.chmod(0o755)
        if os.geteuid() == 0:
            self._cgroup = bwrap.Cgroup(f"workbook-hub-{who.name}-{self._tmp.name[-8:]}", s.memory_mb,
                                        server.PROCESSES)
        argv = [sys.executable, "-m", "jupyterhub.singleuser"]
        self.cmd = server.command(who, argv, s.server_share(self.user.name), self._tmp, self._cgroup)
        self.log.info("%s: %d thread(s), %d MB, device %s", who.name, s.threads, s.memory_mb,
                      (s.device(self.user.name) or "none"))
        return await super().start()

    async def poll(self):
        status = await super().poll()
        if status is not None:
            self._cleanup()
        return status

    async def stop(self, now=False):
        await super().stop(now=now)
        self._cleanup()

    def _cleanup(self) -> None:
        """Every process left in the server's cgroup (or, as root, of the learner's uid) killed; cgroup and the
        generated files removed."""
        if self._cgroup is not None:
            self._cgroup.kill()
            self._cgroup.remove()
            self._cgroup = None
        if os.geteuid() == 0 and self._tmp is not None:
            bwrap.wait_for_uid(self._learner().uid, seconds=2)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def configure(c, settings_path: Path) -> Settings:
    """Set the JupyterHub config `c` from the saved settings; returns them."""
    s = Settings.load(settings_path)
    state = Path(s.state_dir)
    c.JupyterHub.ip, c.JupyterHub.port = s.ip, s.port
    c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", s.hub_port
    c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
    c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server
    c.ConfigurableHTTPProxy.command = [s.proxy]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s.proxy_api_port}"
    c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
    if s.ssl_cert:
        c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = s.ssl_cert, s.ssl_key
    c.JupyterHub.authenticator_class = RosterAuthenticator
    c.RosterAuthenticator.passwords_file = str(state / "passwords.csv")
    c.Authenticator.allowed_users = set(s.learners)
    c.JupyterHub.spawner_class = WorkbookSpawner
    c.WorkbookSpawner.settings_file = str(Path(settings_path).resolve())
    c.Spawner.notebook_dir = str(REPO_ROOT)
    c.Spawner.default_url = "/lab/tree/labs"
    c.Spawner.env_keep = ["LANG", "LC_ALL"]
    # window.jupyterapp in the learner's own page (the class test drives JupyterLab through it; the page's scripts
    # hold the same app anyway)
    c.Spawner.args = ["--LabApp.expose_app_in_browser=True"]
    c.Spawner.http_timeout = 120  # a JupyterLab starting on a loaded box (30 at once) may need it
    c.Spawner.start_timeout = 180
    cull_every = max(10, min(300, s.idle_timeout_s // 4))
    c.JupyterHub.services = [{"name": "idle-culler", "command": [
        sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={s.idle_timeout_s}", f"--cull-every={cull_every}"]}]
    c.JupyterHub.load_roles = [{"name": "idle-culler", "services": ["idle-culler"],
                                "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}]
    return s
