#!/usr/bin/env bash
# The GPU check (issue 35): `bash benchmarks/gpu_check.sh [OUT.json]`, on a machine lent with a GPU
# (no network: the wheels `make gpu-wheels` put in .gpu-wheels/ are installed first when edgebed's
# dependencies are missing) or on any other (its CPU parts; it says which GPU steps it skipped).
# Its numbers go to one JSON file (default benchmarks/results/gpu_check.json); see gpu_check.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_JSON=${1:-benchmarks/results/gpu_check.json}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
if ! "$PY" -c "import pyroute2, zmq, pydantic, docker, yaml, mlxtend; import importlib.metadata as m; m.version('edgebed')" 2>/dev/null; then
  if ! ls .gpu-wheels/*.whl >/dev/null 2>&1; then
    echo "gpu_check: edgebed's dependencies are missing and there is no .gpu-wheels/ (make gpu-wheels)" >&2
    exit 3
  fi
  SITE=$(mktemp -d /tmp/edgebed-site.XXXXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .gpu-wheels/*.whl || exit 3
  # edgebed's own wheel gives its entry points (strategies, models, data sets); the code is this tree's
  export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" benchmarks/gpu_check.py --out "$OUT_JSON" "${@:2}"
rc=$?
# Step time against batch per model (CUDA; a short CPU run where there is none): fits a roofline entry.
"$PY" benchmarks/gpu_step_sweep.py --out "${OUT_JSON%.json}_step_sweep.csv" || echo "gpu_step_sweep: failed" >&2
exit $rc
