#!/usr/bin/env bash
# Install numcheck and everything it needs into a virtual environment (default .venv).
#
#   bash ci/install.sh            CPU machine: the CPU wheel of torch 2.13.0 first, then numcheck
#   NUMCHECK_TORCH=keep bash ci/install.sh --system-site-packages
#                                 GPU machine whose Python already has a CUDA build of torch:
#                                 the venv sees it and pip installs no torch at all
#
# NUMCHECK_VENV picks the venv's folder; NUMCHECK_TORCH the torch requirement ("keep": none);
# NUMCHECK_WHEEL a built wheel to install (not editable: what `pip install numcheck` gives)
# instead of this checkout in editable mode;
# NUMCHECK_EXTRAS the extras (default test,torchao,triton: torchao's quantizers and float8
# training are checked against numcheck's references when it is installed; Triton kernels run
# in Triton's interpreter on the CPU; "test" alone skips those).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${NUMCHECK_VENV:-$here/.venv}
torch_req=${NUMCHECK_TORCH:-torch==2.13.0}
py=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$py" -m venv "$@" "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
if [ "$torch_req" != keep ]; then
  # Installed alone and first: with torch present, numcheck's own `torch>=2.4` pulls nothing,
  # so pip can never swap in a multi-GB CUDA build on a CPU machine.
  # shellcheck disable=SC2086  # word-split on purpose: the spec may carry pip options
  "${pip[@]}" $torch_req
fi
extras=${NUMCHECK_EXTRAS:-test,torchao,triton}
if [ -n "${NUMCHECK_WHEEL:-}" ]; then
  "${pip[@]}" "$NUMCHECK_WHEEL[$extras]"
else
  "${pip[@]}" -e "$here[$extras]"
fi
"$venv/bin/python" -c "import torch, numcheck; print('numcheck', numcheck.__version__, 'torch', torch.__version__)"
