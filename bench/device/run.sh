#!/usr/bin/env bash
# On a lent GPU machine, at the working tree's root, with .gpu/ carried (bench/device/prepare.sh): install
# the carried wheels, put mosquitto on PATH, and run issue 13's GPU checks, each with a time limit, the
# outputs under $OUT (the device tool brings that folder back). Steps (default: all):
#   tests   the GPU tests (page-locked buffer, staging, overlapped sync)
#   rounds  bench/rounds.py: the sync round, 1.6 MB and 45 MB
#   swarm   bench/swarm.py at the size (4 x 15,000 samples, 10 epochs), blocking, syncFrequency 8;
#           SWARM_ARGS replaces the last four arguments (e.g. "--sync-frequency 128 --sync-frequency 8
#           --mode blocking": both frequencies took 297 s on an H200; on 2026-11-27 `tests rounds swarm`
#           with that took 372 s and `swarm` with --mode overlapped 279 s: both modes do not fit this
#           step's 400 s, so run them in two calls, the second within 30 s while the machine is warm)
#   compare bench/compare.py of .gpu/base (prepare.sh --base REV) against the working tree: the 1.6 MB
#           round, 3 pairs back to back and 3 with 30 ms of pretend training a round (as a GPU trains)
#   chain   bench/chain.py: when each SL did each step of a 1.6 MB round, by role, with 30 ms of pretend
#           training a round and back to back (about 25 s each on 2 cores)
# Example: the device tool's command `bash bench/device/run.sh tests rounds`. Another command there needs
# this script's pip install and exports first: without that PATH the SN finds no mosquitto and falls back
# to amqtt, which that machine lacks.
set -u
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps .gpu/whl/*.whl 2>&1 | tail -2
export PATH=$PWD/.gpu/mq/usr/sbin:$PATH LD_LIBRARY_PATH=$PWD/.gpu/mq/lib PYTHONUNBUFFERED=1
steps=${*:-tests rounds swarm}
{ nproc; nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import torch; print(torch.__version__)"; } \
  | tee "$OUT/machine.txt"
for step in $steps; do
  echo "=== $step"
  case "$step" in
    tests)  # without the project's addopts: --strict-config fails on an ini option whose plugin is missing
      timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/test_staging.py tests/test_overlap_sync.py 2>&1 | tee "$OUT/tests.txt" | tail -4 ;;
    rounds)
      timeout 120 python3 bench/rounds.py 2>&1 | tee "$OUT/rounds.txt" | grep -E "^sync round" | cut -c1-600 ;;
    swarm)
      # shellcheck disable=SC2086 # SWARM_ARGS is a list of arguments
      timeout 400 python3 bench/swarm.py --per-node 15000 --epochs 10 \
        ${SWARM_ARGS:---sync-frequency 8 --mode blocking} 2>&1 | tee "$OUT/swarm.txt" | grep -E "^overhead" | cut -c1-900 ;;
    compare)
      [ -d .gpu/base ] || { echo "no .gpu/base: run bench/device/prepare.sh --base REV here" >&2; continue; }
      { timeout 150 python3 bench/compare.py .gpu/base . --pairs 3 --rounds 300
        timeout 150 python3 bench/compare.py .gpu/base . --pairs 3 --rounds 150 --work-s 0.03
      } 2>&1 | tee "$OUT/compare.txt" | grep -E "round:|CPU a round" ;;
    chain)
      { timeout 120 python3 bench/chain.py --rounds 300 --work-s 0.03
        timeout 120 python3 bench/chain.py --rounds 300 --work-s 0
      } 2>&1 | tee "$OUT/chain.txt" | grep -E "^chain|^rounds with|program answered" ;;
    *) echo "no step $step (tests, rounds, swarm, compare, chain)" >&2 ;;
  esac
done
