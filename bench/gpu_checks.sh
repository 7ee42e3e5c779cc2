#!/usr/bin/env bash
# The GPU checks, in one run on a lent GPU machine (its own CUDA build of torch; wheels
# for what it lacks in .whl/: google-crc32c, torchdata, nvidia-resiliency-ext, defusedxml).
# Writes each step's log under ${OUT:-/tmp/gpu-checks}. Budget: about 6 minutes.
set -uo pipefail
out=${OUT:-/tmp/gpu-checks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
"$py" -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { tail -20 "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
"$py" -c "import torch; print('torch', torch.__version__, 'cpus', __import__('os').cpu_count())" | tee -a "$out/device.txt"
start=$(date +%s)
timeout 330 "$py" -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$out/tests.log" | tail -25
echo "tests: $(($(date +%s) - start)) s"
for device in cuda cpu; do
  timeout 100 "$py" bench/restore_bench.py --dir /tmp/ftfleet-restore-bench --repeats "${REPEATS:-5}" --d-model 1024 \
    --layers 4 --vocab 20000 --threads 2 --device "$device" 2>&1 | tee "$out/restore-$device.log" | tail -11
done
echo "total: $(($(date +%s) - start)) s"
