#!/usr/bin/env bash
# Set-up for `make hub` and the class test of `make test-browser`: JupyterHub and its idle culler (PyPI) in the venv,
# and JupyterHub's proxy, configurable-http-proxy (npm), under build/hub/proxy. Installed on demand; `make test` needs
# none of it.
set -euo pipefail
PY="${1:-.venv/bin/python}"
PROXY_DIR="${2:-build/hub/proxy}"
if ! "$PY" -c "import jupyterhub, jupyterhub_idle_culler" 2>/dev/null; then
  echo "hub: installing jupyterhub and jupyterhub-idle-culler into the venv"
  "$PY" -m pip --disable-pip-version-check -q install "jupyterhub>=5,<7" "jupyterhub-idle-culler>=1.4" 2>&1 \
    | grep -v "is ignored: it is neither" || true
fi
if [ -x "$PROXY_DIR/node_modules/.bin/configurable-http-proxy" ] || command -v configurable-http-proxy >/dev/null; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "hub: JupyterHub's proxy (configurable-http-proxy, an npm package) is missing and npm is not found. Install" >&2
  echo "     Node.js and npm (Debian/Ubuntu: sudo apt-get install -y nodejs npm; elsewhere https://nodejs.org), then" >&2
  echo "     run make hub again (it runs npm install --prefix $PROXY_DIR configurable-http-proxy@5)." >&2
  exit 1
fi
echo "hub: installing configurable-http-proxy into $PROXY_DIR (npm)"
mkdir -p "$PROXY_DIR"
npm install --silent --no-audit --no-fund --prefix "$PROXY_DIR" "configurable-http-proxy@5" >/dev/null 2>&1 || \
  npm install --no-audit --no-fund --prefix "$PROXY_DIR" "configurable-http-proxy@5"
