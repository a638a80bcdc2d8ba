#!/usr/bin/env bash
# Create .venv from nothing and install the workbook (editable) with its dependencies.
# torch: TORCH_SPEC overrides (e.g. TORCH_SPEC="torch==2.14.1"); otherwise a base Python that already has a CUDA
# build of torch is reused (the venv sees it through --system-site-packages, so no multi-GB download), and
# everywhere else the CPU build torch==2.13.0 is pinned.
set -euo pipefail
PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-}"
start=$(date +%s)

has_cuda_torch=$("$PY" - <<'PYEOF' 2>/dev/null || echo no
import torch
print("yes" if torch.version.cuda and torch.cuda.is_available() else "no")
PYEOF
)
if [ -z "$TORCH_SPEC" ] && [ "$has_cuda_torch" = "yes" ]; then
  echo "setup: reusing the CUDA torch of $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
  "$PY" -m venv --system-site-packages "$VENV"
  TORCH_SPEC=""
else
  "$PY" -m venv "$VENV"
  TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade pip setuptools wheel 2>&1 | grep -v "is ignored: it is neither" || true
if [ -n "$TORCH_SPEC" ]; then
  echo "setup: installing $TORCH_SPEC"
  "${PIP[@]}" install "$TORCH_SPEC" 2>&1 | grep -v "is ignored: it is neither" || true
fi
echo "setup: installing the workbook and its dependencies"
"${PIP[@]}" install -e . 2>&1 | grep -v "is ignored: it is neither" || true
# jsonschema's optional IRI format checker, rfc3987-syntax (pulled in by jupyter-events' jsonschema[format-nongpl]),
# builds an Earley grammar when it is imported: 1.7-2 s in every process that imports nbformat (each pytest worker,
# each graded notebook's runner; `import nbformat, nbclient` 2.4 s with it, 0.4 s without). No schema the workbook or
# Jupyter validates needs the "iri" format; jsonschema leaves it unchecked without the package.
"${PIP[@]}" uninstall -y rfc3987-syntax 2>&1 | grep -v "not installed" || true
"$VENV/bin/python" - <<'PYEOF'
import sys
import common, nbval, papermill, torch
try:
    import triton
    tv = triton.__version__
except ImportError:
    if sys.platform.startswith("linux"):
        raise
    tv = ("not available on this platform: labs 03, 04 and 14 run their Triton cells only where Triton is installed "
          "(Linux or WSL); each says so and goes on")
print("setup: ok, torch", torch.__version__, "| triton", tv)
PYEOF
echo "setup: done in $(( $(date +%s) - start )) s"
