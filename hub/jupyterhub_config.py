# The workbook's JupyterHub for a class, read by `jupyterhub -f hub/jupyterhub_config.py`. Start it with
# `make hub ROSTER=learners.txt` (INSTRUCTOR.md section 4): that checks the roster, the ports and the proxy, makes the
# learners' accounts and passwords, saves the settings to build/hub/settings.json, then runs jupyterhub with this file.
# Everything it configures is in common/core/hub/plugins.py (configure).
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common.core.hub.plugins import configure  # noqa: E402

configure(c, Path(os.environ.get("WORKBOOK_HUB_SETTINGS") or REPO / "build" / "hub" / "settings.json"))  # noqa: F821
