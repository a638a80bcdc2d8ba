"""The class hub's pieces without JupyterHub (`make test`; the class itself runs in tests/test_hub_class.py under
`make test-browser`): the roster, the passwords, each learner's share of the box and GPU device from a fake
`nvidia-smi -L`, the ports, the proxy, the learner's sandbox command, their copy of the labs, and collecting."""
from __future__ import annotations

import argparse
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.core.env import REPO_ROOT
from common.core.hub import accounts, collect, roster, server, settings, share
from common.core.hub.accounts import WORKBOOK

unix_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the hub runs on Linux")

SMI_MIG = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
  MIG 1g.10gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 1g.10gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
  MIG 2g.20gb     Device  2: (UUID: MIG-0d5e4c3b-1a2b-5c6d-8e9f-0a1b2c3d4e5f)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1e2f3a4b-5c6d-7e8f-9a0b-1c2d3e4f5a6b)
  MIG 1g.10gb     Device  0: (UUID: MIG-9a8b7c6d-5e4f-3a2b-1c0d-9e8f7a6b5c4d)
"""
SMI_PLAIN = """GPU 0: NVIDIA H200 (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)
GPU 1: NVIDIA H200 (UUID: GPU-bbbbbbbb-0000-0000-0000-000000000000)
"""


# ------------------------------------------------------------------------------------------------------- roster
def test_a_roster_gives_its_names_in_order():
    assert roster.parse("# class of 2026\nada\n\nbo_2  # late\ncy-3\n") == ["ada", "bo_2", "cy-3"]


@pytest.mark.parametrize("text, words", [
    ("ada\nbo\nada\n", ["'ada' is listed twice", "lines 1 and 3"]),
    ("ada\nAda Lovelace\n", ["line 2", "'Ada Lovelace' is not a valid learner name", "lower-case"]),
    ("ada\n3cy\n", ["line 2", "'3cy'", "starting with a letter"]),
    ("a" * 33 + "\n", ["line 1", "1-32 characters"]),
    ("root\n", ["line 1", "'root'", "keeps for itself"]),
    ("# nobody yet\n\n", ["names no learner"]),
])
def test_a_bad_roster_is_refused_naming_the_line(text, words):
    with pytest.raises(ValueError) as err:
        roster.parse(text, "roster learners.txt")
    for w in words:
        assert w in str(err.value), str(err.value)


def test_a_missing_roster_file_says_what_to_write(tmp_path):
    with pytest.raises(ValueError, match="ROSTER=.*is not a file: write one learner name per line"):
        roster.read(tmp_path / "nope.txt")


def test_passwords_are_made_once_kept_and_private(tmp_path):
    path = tmp_path / "hub" / "passwords.csv"
    first = roster.passwords(["ada", "bo"], path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(set(first.values())) == 2 and all(len(p) == 11 and p[5] == "-" for p in first.values())
    again = roster.passwords(["ada", "bo", "cy"], path)
    assert again["ada"] == first["ada"] and again["bo"] == first["bo"] and "cy" in again
    assert not set("01ilo") & set("".join(again.values()).replace("-", ""))


# ------------------------------------------------------------------------------------------- share of the box
def test_threads_are_cores_over_learners_at_least_one():
    assert share.threads_per_learner(64, 30) == 2
    assert share.threads_per_learner(2, 3) == 1
    assert share.threads_per_learner(16, 1) == 16
    env = share.thread_environment(2)
    assert {k: env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")} == \
        {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2"}


def test_memory_is_what_is_left_over_learners():
    assert share.memory_per_learner(96 * 1024, 30) == (96 * 1024 - 2048) // 30
    assert share.memory_per_learner(4096, 30) == 512  # never below 512 MB


def test_nvidia_smi_lists_mig_instances_before_gpus():
    migs = share.parse_nvidia_smi(SMI_MIG)
    assert [(d.visible[:12], d.gpu, d.mig) for d in migs] == [
        ("MIG-c6d4f1ef", 0, True), ("MIG-cba663e8", 0, True), ("MIG-0d5e4c3b", 0, True), ("MIG-9a8b7c6d", 1, True)]
    assert migs[2].label == "GPU 0 MIG 2g.20gb device 2"
    gpus = share.parse_nvidia_smi(SMI_PLAIN)
    assert [(d.visible, d.gpu, d.mig) for d in gpus] == [("0", 0, False), ("1", 1, False)]
    assert share.parse_nvidia_smi("") == [] and share.list_devices("none", SMI_MIG) == []


def test_mig_instances_go_round_robin_in_roster_order():
    devices = share.parse_nvidia_smi(SMI_MIG)
    got = share.assign(["ada", "bo", "cy", "dan"], devices)
    assert [got[n].visible for n in ("ada", "bo", "cy", "dan")] == [d.visible for d in devices]
    shared = share.assign(list("abcdef"), devices, allow_sharing=True)
    assert shared["e"] == devices[0] and shared["f"] == devices[1]
    assert share.sharing_lines(shared)[0] == "GPU 0 MIG 1g.10gb device 0: a, e"


def test_more_learners_than_mig_instances_says_how_many_share():
    with pytest.raises(ValueError) as err:
        share.assign([f"l{i}" for i in range(10)], share.parse_nvidia_smi(SMI_MIG))
    msg = str(err.value)
    assert "10 learners for 4 MIG instances" in msg
    assert "3 learners on 2 of the instances and 2 on the other 2" in msg  # 3 + 3 + 2 + 2 = 10
    assert "Create 6 more instances" in msg and "GPU_SHARING=1" in msg


def test_whole_gpus_are_shared_round_robin_without_an_error():
    got = share.assign(list("abc"), share.parse_nvidia_smi(SMI_PLAIN))
    assert [got[n].visible for n in "abc"] == ["0", "1", "0"]
    assert share.assign(list("ab"), []) == {"a": None, "b": None}


def test_a_gpu_list_from_the_instructor_is_mapped_to_its_gpu():
    devs = share.list_devices("MIG-9a8b7c6d-5e4f-3a2b-1c0d-9e8f7a6b5c4d, 0", SMI_MIG)
    assert [(d.visible[:12], d.gpu, d.mig) for d in devs] == [("MIG-9a8b7c6d", 1, True), ("0", 0, False)]
    by_uuid = share.list_devices("GPU-1e2f3a4b-5c6d-7e8f-9a0b-1c2d3e4f5a6b", SMI_MIG)[0]
    assert by_uuid.gpu == 1 and by_uuid.visible.startswith("GPU-1e2f")
    with pytest.raises(ValueError, match="'cuda:0' is not a GPU index"):
        share.list_devices("cuda:0", SMI_MIG)
    with pytest.raises(ValueError, match="names a device twice"):
        share.list_devices("0,0", SMI_PLAIN)


# ------------------------------------------------------------------------------------------ ports and proxy
def test_a_port_in_use_is_named_with_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        with pytest.raises(ValueError) as err:
            settings.check_ports("127.0.0.1", {"PORT": busy, "HUB_PORT": busy + 1 if busy < 65535 else 1024,
                                               "PROXY_API_PORT": 0})
    assert f"PORT={busy} is in use on 127.0.0.1" in str(err.value) and f"PORT={busy + 10}" in str(err.value)


@pytest.mark.parametrize("ports, words", [
    ({"PORT": 8000, "HUB_PORT": 8000, "PROXY_API_PORT": 8001}, "HUB_PORT=8000 is also PORT"),
    ({"PORT": 70000, "HUB_PORT": 8081, "PROXY_API_PORT": 8001}, "PORT=70000 must be a TCP port"),
    ({"PORT": 0, "HUB_PORT": 8081, "PROXY_API_PORT": 8001}, "PORT=0 must be an integer >= 1"),
])
def test_bad_ports_are_named(ports, words):
    with pytest.raises(ValueError, match=words):
        settings.check_ports("127.0.0.1", ports)


def test_no_npm_says_how_to_install_it(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(ValueError) as err:
        settings.find_proxy(tmp_path / "proxy", path=str(empty))
    assert "npm is not found" in str(err.value) and "apt-get install -y nodejs npm" in str(err.value)
    npm = empty / "npm"
    npm.write_text("#!/bin/sh\n")
    npm.chmod(0o755)
    with pytest.raises(ValueError, match="run `make hub`"):
        settings.find_proxy(tmp_path / "proxy", path=str(empty))
    local = tmp_path / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    local.parent.mkdir(parents=True)
    local.write_text("")
    assert settings.find_proxy(tmp_path / "proxy", path=str(empty)) == str(local)


def _settings(tmp_path, text="ada\nbo\ncy\n", **kw) -> settings.Settings:
    (tmp_path / "learners.txt").write_text(text)
    proxy = tmp_path / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
    proxy.parent.mkdir(parents=True, exist_ok=True)
    proxy.touch()
    kw.setdefault("smi_output", "")
    orig = settings.PROXY_DIR
    settings.PROXY_DIR = tmp_path / "proxy"
    try:
        return settings.build(tmp_path / "learners.txt", state_dir=tmp_path / "state", check_free=False,
                              **kw)
    finally:
        settings.PROXY_DIR = orig


def test_settings_are_checked_and_saved(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "find_proxy", lambda *a, **k: "/usr/bin/true")
    s = _settings(tmp_path, threads=2, memory_mb=3000, gpus="0,1", smi_output=SMI_PLAIN, idle_minutes=45)
    assert (s.threads, s.memory_mb, s.idle_timeout_s, s.proxy_api_port) == (2, 3000, 2700, 8001)
    assert s.device("cy").visible == "0" and s.server_share("bo").device.gpu == 1
    again = settings.Settings.load(s.save())
    assert again == s
    with pytest.raises(ValueError, match="MEMORY_MB=100 must be an integer >= 256"):
        _settings(tmp_path, memory_mb=100)
    with pytest.raises(ValueError, match="PROFILE='fast'; allowed: auto, quick, full"):
        _settings(tmp_path, profile="fast")
    with pytest.raises(ValueError, match="IDLE_MINUTES=-1"):
        _settings(tmp_path, idle_minutes=-1)
    with pytest.raises(ValueError, match="3 learners for 2 MIG instances"):
        _settings(tmp_path, gpus="MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f,MIG-9a8b7c6d-5e4f-3a2b-1c0d-9e8f7a6b5c4d",
                  smi_output=SMI_MIG)
    with pytest.raises(ValueError, match="not found: start the hub with `make hub ROSTER="):
        settings.Settings.load(tmp_path / "none.json")


def test_the_command_line_refuses_a_bad_roster(tmp_path, capsys):
    from common.core.hub import cli
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="cmd"))
    (tmp_path / "r.txt").write_text("ada\nada\n")
    args = parser.parse_args(["hub", "start", "--roster", str(tmp_path / "r.txt"), "--check-only", "--state",
                              str(tmp_path / "s")])
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("hub: roster") and "'ada' is listed twice" in err and not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------ the learner's server
def _learner(tmp_path, name="ada") -> accounts.Learner:
    return accounts.Learner(name, os.getuid(), os.getgid(), tmp_path / "homes" / name)


@unix_only
def test_the_sandbox_shows_the_learner_their_copy_and_nothing_of_the_others(tmp_path):
    who = _learner(tmp_path)
    tmp = tmp_path / "run"
    tmp.mkdir()
    cmd = server.command(who, ["jupyterhub-singleuser"], server.Share(2, 1024), tmp)
    binds = [(cmd[i], cmd[i + 1], cmd[i + 2]) for i in range(len(cmd) - 2) if cmd[i] in ("--bind", "--ro-bind")]
    inside = [dst for _, _, dst in binds]
    assert ("/home/ada" in inside and str(REPO_ROOT) in inside and str(REPO_ROOT / "common") in inside)
    assert not any("solutions" in dst or "homes/bo" in dst for dst in inside)
    writable = {dst for flag, _, dst in binds if flag == "--bind"}
    assert writable == {"/home/ada", str(REPO_ROOT)}  # the learner's home and their workbook, nothing else
    # /tmp's tmpfs comes before the workbook's bind (a checkout under /tmp is not hidden), common/ after the workbook
    pos = {dst: i for i, (_, _, dst) in enumerate(binds)}
    assert cmd.index("/tmp") < cmd.index(str(REPO_ROOT)) and pos[str(REPO_ROOT)] < pos[str(REPO_ROOT / "common")]
    assert "--unshare-pid" in cmd and "--disable-userns" in cmd and "--unshare-net" not in cmd  # the proxy reaches it
    assert cmd[-2:] == ["--", "jupyterhub-singleuser"]
    passwd = (tmp / "passwd").read_text()
    assert f"ada:x:{who.uid}:" in passwd and passwd.count("\n") == 3


def test_the_server_environment_carries_the_learner_share():
    who = accounts.Learner("ada", 1234, 1234, Path("/home/ada"))
    dev = share.parse_nvidia_smi(SMI_MIG)[1]
    env = server.environment(who, server.Share(3, 2048, dev), "2048 MB, memory cgroup")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    assert env["CUDA_VISIBLE_DEVICES"] == dev.visible and env["HOME"] == "/home/ada"
    plain = server.environment(who, server.Share(3, 2048), "")
    assert "CUDA_VISIBLE_DEVICES" not in plain and "WORKBOOK_PROFILE" not in plain
    assert server.environment(who, server.Share(3, 2048, None, "quick"), "")["WORKBOOK_PROFILE"] == "quick"


def test_a_server_gets_the_node_of_its_gpu_only(monkeypatch):
    present = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps", "/dev/nvidia0", "/dev/nvidia1"}
    monkeypatch.setattr(server.os.path, "exists", lambda p: p in present)
    monkeypatch.setattr(server.glob, "glob", lambda pattern: sorted(p for p in present if p[-1].isdigit()))
    mig = share.parse_nvidia_smi(SMI_MIG)[3]  # on GPU 1
    assert server.gpu_nodes(mig) == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps", "/dev/nvidia1"]
    unknown = share.Device("MIG-x", None, "MIG-x", mig=True)
    assert server.gpu_nodes(unknown)[-2:] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert server.gpu_nodes(None) == []


@unix_only
def test_rlimit_preexec_bounds_the_data_of_a_child():
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_DATA)[1] >> 20)"
    run = subprocess.run([sys.executable, "-c", code], preexec_fn=server.rlimit_preexec(3000), capture_output=True,
                         text=True)
    assert run.stdout.strip() == "3000"


# ----------------------------------------------------------------------------------- the learner's copy; collect
@unix_only
def test_a_learners_copy_has_the_labs_not_the_solutions_and_keeps_their_work(tmp_path):
    who = _learner(tmp_path)
    who.home.mkdir(parents=True)
    labs = accounts.lab_files()
    assert "00_orientation.ipynb" in labs and len(labs) == len(list((REPO_ROOT / "labs").glob("[0-9][0-9]_*.ipynb")))
    accounts.prepare_copy(who, labs, ["common", "data"])
    mine = who.workbook / "labs" / "00_orientation.ipynb"
    assert mine.read_bytes() == labs["00_orientation.ipynb"]
    assert sorted(p.name for p in who.workbook.iterdir()) == ["build", "common", "data", "labs"]
    settings_file = who.home / ".jupyter/lab/user-settings/@jupyterlab/notebook-extension/tracker.jupyterlab-settings"
    assert json.loads(settings_file.read_text()) == {"windowingMode": "none"}
    mine.write_text("my work")
    settings_file.write_text("{}")
    (who.workbook / "labs" / "01_measurement.ipynb").unlink()
    accounts.prepare_copy(who, labs, [])
    assert mine.read_text() == "my work" and settings_file.read_text() == "{}"  # never overwritten
    assert (who.workbook / "labs" / "01_measurement.ipynb").exists()  # a missing lab comes back
    assert not any("BEGIN SOLUTION" in p.read_text(errors="replace") for p in who.home.rglob("*.ipynb"))


@unix_only
def test_a_link_in_the_learners_home_is_never_followed(tmp_path):
    who = _learner(tmp_path)
    (who.home / WORKBOOK).mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, who.home / WORKBOOK / "labs")
    with pytest.raises(ValueError, match="follows no link"):
        accounts.prepare_copy(who, {"00_x.ipynb": b"{}"})
    os.unlink(who.home / WORKBOOK / "labs")
    (who.home / WORKBOOK / "labs").mkdir()
    os.symlink(elsewhere / "planted", who.home / WORKBOOK / "labs" / "00_x.ipynb")
    accounts.prepare_copy(who, {"00_x.ipynb": b"{}"})  # a link where a lab would go: left as it is
    assert list(elsewhere.iterdir()) == []


@unix_only
def test_collect_copies_a_lab_and_only_what_the_learner_owns(tmp_path, monkeypatch):
    monkeypatch.setattr(settings, "find_proxy", lambda *a, **k: "/usr/bin/true")
    s = _settings(tmp_path, text="ada\nbo\ncy\n")
    if os.geteuid() == 0:
        monkeypatch.setattr(accounts, "as_root", lambda: False)  # the dry run's homes, as in a laptop's
    for name, text in (("ada", "ada's 00"), ("bo", "bo's 00")):
        folder = Path(s.state_dir) / "homes" / name / "workbook" / "labs"
        folder.mkdir(parents=True)
        (folder / "00_orientation.ipynb").write_text(text)
        (folder / "01_measurement.ipynb").write_text("not lab 00")
    secret = tmp_path / "secret.ipynb"
    secret.write_text("someone else's")
    os.symlink(secret, Path(s.state_dir) / "homes" / "bo" / "workbook" / "labs" / "00_copy.ipynb")
    before = {p: p.stat().st_mtime_ns for p in Path(s.state_dir).rglob("*.ipynb")}
    out = tmp_path / "collected"
    found = collect.collect(s, 0, out)
    assert found == {"ada": ["00_orientation.ipynb"], "bo": ["00_orientation.ipynb"], "cy": []}
    assert (out / "ada" / "00_orientation.ipynb").read_text() == "ada's 00"
    assert not (out / "bo" / "00_copy.ipynb").exists()  # a link is not followed
    assert {p: p.stat().st_mtime_ns for p in Path(s.state_dir).rglob("*.ipynb")} == before
    collect.collect(s, 0, out)  # again: the collector's own folder is emptied first
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="files the collector did not write"):
        collect.collect(s, 0, tmp_path / "mine")
    assert collect.roster_file(s).read_text() == "ada\nbo\ncy\n"


def test_the_jupyterhub_config_sets_up_the_class(tmp_path, monkeypatch):
    pytest.importorskip("jupyterhub")  # `make hub` and `make test-browser` install it; `make test` need not have it
    from traitlets.config import Config
    from common.core.hub import plugins
    monkeypatch.setattr(settings, "find_proxy", lambda *a, **k: "/usr/bin/true")
    s = _settings(tmp_path, idle_minutes=20)
    c = Config()
    plugins.configure(c, s.save())
    assert c.Authenticator.allowed_users == {"ada", "bo", "cy"} and c.JupyterHub.hub_ip == "127.0.0.1"
    assert c.JupyterHub.spawner_class is plugins.WorkbookSpawner and c.JupyterHub.cleanup_servers
    culler = c.JupyterHub.services[0]["command"]
    assert "jupyterhub_idle_culler" in culler and "--timeout=1200" in culler
    assert c.Spawner.notebook_dir == str(REPO_ROOT)


def test_instructor_section_4_names_only_options_make_hub_has():
    """INSTRUCTOR.md section 4 is the tested procedure: every VAR= it tells the instructor to set is one the Makefile's
    hub target passes on, and the commands it gives exist."""
    import re
    guide = (REPO_ROOT / "INSTRUCTOR.md").read_text()
    section = guide.split("## 4. Running the labs on a shared GPU box")[1].split("**Without the hub**")[0]
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = makefile.split("\nhub: ")[1].split("\n\n")[0]
    told = set(re.findall(r"\b([A-Z][A-Z_]+)=", section)) - {"LAB", "GRADE_JOBS", "CELL_TIMEOUT", "NOTEBOOK_TIMEOUT"}
    assert {"ROSTER", "IP", "THREADS", "MEMORY_MB", "GPUS", "PROFILE", "IDLE_MINUTES"} <= told
    assert all(f"$({v})" in recipe for v in told), sorted(v for v in told if f"$({v})" not in recipe)
    for command in ("make hub ROSTER=learners.txt", "make collect LAB=", "python -m common hub remove-accounts",
                    "--check-only"):
        assert command in section, command
    assert "\ncollect: " in makefile and "hub collect --lab" in makefile
