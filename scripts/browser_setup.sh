#!/usr/bin/env bash
# Set-up for `make test-browser`: Playwright (from PyPI) in the venv and a system Chromium (Playwright's own
# browser download is not needed: the test drives the system one).
set -euo pipefail
PY="${1:-.venv/bin/python}"
if ! "$PY" -c "import playwright" 2>/dev/null; then
  echo "browser: installing playwright into the venv"
  "$PY" -m pip --disable-pip-version-check -q install "playwright>=1.40" 2>&1 | grep -v "is ignored: it is neither" || true
fi
if [ -n "${CHROMIUM:-}" ]; then
  echo "browser: using CHROMIUM=$CHROMIUM"; exit 0
fi
for b in chromium chromium-browser google-chrome google-chrome-stable; do
  if command -v "$b" >/dev/null; then echo "browser: using $(command -v "$b")"; exit 0; fi
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "browser: installing Debian's chromium (apt-get)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  command -v chromium >/dev/null && exit 0
fi
echo "browser: no Chromium found. Install one (Debian/Ubuntu: sudo apt-get install -y chromium), or set" >&2
echo "         CHROMIUM=/path/to/chrome, then run make test-browser again." >&2
exit 1
