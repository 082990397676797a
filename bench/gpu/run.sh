#!/usr/bin/env bash
# The GPU suite's entry point (docs/developer.md: "The GPU suite"). In the repository root:
#   bash bench/gpu/run.sh gather [--check|--verify]   here: wheels the device image lacks -> .gpu-wheels/
#   bash bench/gpu/run.sh --cpu-smoke [--out DIR]     here: the whole driver at tiny shapes on the CPU
#   bash bench/gpu/run.sh [--part headline|rest | --only STEPS] [--out DIR]
#                                                     on the GPU machine, .gpu-wheels/ carried: install
#                                                     them offline, check the install, run the suite
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
# A part's time budget counts from here: the install below is part of the device command's minutes.
export VIDFORGE_GPU_SUITE_T0=${VIDFORGE_GPU_SUITE_T0:-$(date +%s.%N)}

if [[ "${1:-}" == "gather" ]]; then
    shift
    exec "$PY" bench/gpu/gather.py "$@"
fi

if [[ " $* " != *" --cpu-smoke "* ]]; then
    if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
        echo "no CUDA device visible to $PY: run this on the GPU machine, or pass --cpu-smoke" >&2
        exit 2
    fi
    # --target keeps the image's packages (its torch above all) untouched; the checkout's src/ goes
    # first, so the code that travelled is the code that runs even after the wheels were built. Every
    # gathered set that travelled (.gpu-wheels, .gpu-wheels-EXTRA: gather.py's EXTRA_SETS, each carried
    # in a call of its own) goes into the one site folder, which stays while the machine is held.
    site=${GPU_SUITE_SITE:-/tmp/vidforge-site}
    for wheels in .gpu-wheels .gpu-wheels-*; do
        if [[ -d "$wheels" ]]; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$site" "$wheels"/*.whl
        fi
    done
    if [[ -d "$site" ]]; then
        export PYTHONPATH="$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
    fi
    "$PY" bench/gpu/gather.py --installed >/dev/null  # names what is missing here, and stops
fi
exec "$PY" bench/gpu/suite.py "$@"
