#!/usr/bin/env bash
# On a GPU machine: every tlaunch.torch mode with NCCL (tests/test_torch_gpu.py), then the
# launch benchmark with NCCL (bench/torch_launch.py --backend nccl), both written to OUT.
#
#   bench/gpu_check.sh OUT [WHEELS]
#
# WHEELS: a folder of wheels to install first (into /tmp/site, on PYTHONPATH), for a machine
# that has torch but not tlaunch's other dependencies and cannot reach a package index.
# Runs from the checkout's root with `python3` (the interpreter that has torch with CUDA).
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT [WHEELS]}
mkdir -p "$out"
if [ -n "${2:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$2"/*.whl ||
    exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
{
  nvidia-smi -L
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
    "nccl", ".".join(map(str, torch.cuda.nccl.version())), "gpus", torch.cuda.device_count())'
} 2>&1 | tee "$out/machine.txt"
# -W default: a third-party import's warning on this machine is not the test's failure (CI's runs
# keep warnings as errors).
python3 -m pytest -v -p no:cacheprovider -W default tests/test_torch_gpu.py 2>&1 | tee "$out/pytest.log"
tests=${PIPESTATUS[0]}
python3 bench/torch_launch.py --backend nccl --reps "${REPS:-7}" --out "$out/torch_launch_nccl.json" 2>&1 |
  tee "$out/bench.log"
bench=${PIPESTATUS[0]}
echo "tests exit $tests, bench exit $bench"
[ "$tests" = 0 ] && [ "$bench" = 0 ]
