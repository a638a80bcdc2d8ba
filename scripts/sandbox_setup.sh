#!/usr/bin/env bash
# Set-up for `make grade` and `make test`: bubblewrap (Debian's `bubblewrap`), the sandbox every graded notebook runs
# in. Installed with apt-get when run as root; otherwise says how.
set -euo pipefail
if command -v bwrap >/dev/null; then exit 0; fi
if [ "$(uname -s)" != "Linux" ]; then
  echo "sandbox: bubblewrap is Linux-only; grading needs a Linux machine (or --unsafe-no-sandbox)" >&2; exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "sandbox: installing Debian's bubblewrap (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
  command -v bwrap >/dev/null && exit 0
fi
if [ -n "${CI:-}" ] || [ -n "${WORKBOOK_NEED_SANDBOX:-}" ]; then  # CI and `make grade` must have the sandbox
  echo "sandbox: bubblewrap (bwrap) not found. Install it (Debian/Ubuntu: sudo apt-get install -y bubblewrap; Fedora:" >&2
  echo "         sudo dnf install bubblewrap), then run again." >&2
  exit 1
fi
echo "sandbox: bubblewrap not found: the grading tests will be skipped (sudo apt-get install -y bubblewrap to run them)"
exit 0
