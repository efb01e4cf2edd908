#!/usr/bin/env bash
# Run the accelerator benchmark and the transformer example's GPU preset on a machine that has
# jax with CUDA, flax, optax and orbax installed, but no package registry; results go to $OUT.
#
#     OUT=/some/dir bash benchmarks/device_run.sh
#
# This repository's packages are not installed there: the script installs them from wheels
# carried in build/device-wheels/ (ignored by git: .gitignore's build/) with
# `pip install --no-deps --no-index --target`, into a folder it puts on PYTHONPATH, together
# with the few pure-Python dependencies that jax, flax, optax and orbax do not bring (each only
# if the machine lacks it). Prepare that folder before the session, on a machine with uv and a
# registry, from the repository root:
#
#     rm -rf build/device-wheels
#     uv build --all-packages --wheel -o build/device-wheels
#     python3 -m pip download --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d build/device-wheels/deps \
#         pydantic pydantic-core annotated-types typing-inspection platformdirs crc32c pathspec
#
# (pydantic-core and crc32c are compiled: the wheels must match the device's Python, assumed
# 3.12 on x86_64 Linux, where jax 0.11.2 runs; for another, download the same list with its
# --python-version into deps-cpXY/, e.g. build/device-wheels/deps-cp313, which the script then
# takes instead. pip also
# fetches typing-extensions, which the device has through flax: it is installed only where the
# device's is older than pydantic asks for.)
# Then carry the folder with the working tree: run(command="bash benchmarks/device_run.sh",
# carry=["build/device-wheels"]). The whole folder is a few MB.
#
# What it leaves in $OUT:
#   environment.txt             Python, jax and the GPU (nvidia-smi), what was installed
#   accelerator.json, .txt      benchmarks/accelerator.py --json, and what it printed
#   transformer_lm_gpu.txt      examples/transformer_lm.py --preset gpu, what it printed
#   transformer_lm_gpu/         its summary.json and metrics log (not its profile: too large)
#
# Knobs (environment): PYTHON (python3), DEVICE_PLATFORMS (cuda), BENCH_ARGS (e.g. "--quick" or
# "--only precision mfu"), BENCH_TIMEOUT (340 s), EXAMPLE_ARGS (e.g. "--steps 100 --batch-size
# 16"), EXAMPLE_TIMEOUT (200 s), SKIP_EXAMPLE=1. Each part runs under `timeout` (together they fit
# one 600 s device command, with a minute to spare); the benchmark rewrites its JSON after each
# goal, so a part cut short still leaves what it measured. Both share jax's compilation cache
# (JaxRuntime's default directory), so the example finds the GPU preset's step the benchmark
# compiled. The exit status is the first failing part's.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT"
WHEELS=${WHEELS:-$ROOT/build/device-wheels}
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || PYTHON=python
SITE=$(mktemp -d)/site
mkdir -p "$SITE"

log() { echo "[device_run] $*" | tee -a "$OUT/environment.txt"; }

# --- install --------------------------------------------------------------------------------
shopt -s nullglob
wheels=("$WHEELS"/substrax*.whl)
if ((${#wheels[@]} == 0)); then
    log "no substrax wheels in $WHEELS: build them first (see this script's header)"
    exit 2
fi
# A dependency is installed only where the machine lacks it (or has it older than substrax
# needs): the prefixes of the wheels to take from deps/.
needed=$("$PYTHON" - <<'PY'
from importlib import metadata

def version(name):
    try:
        return tuple(int(p) for p in metadata.version(name).split(".")[:2] if p.isdigit())
    except metadata.PackageNotFoundError:
        return None

# distribution: (the oldest version substrax takes, the wheels that come with it)
wanted = {
    "pydantic": ((2, 10), "pydantic- pydantic_core- annotated_types- typing_inspection-"),
    "platformdirs": ((4, 0), "platformdirs-"),
    "crc32c": ((2, 7), "crc32c-"),
    "pathspec": ((0, 12), "pathspec-"),
    "typing_extensions": ((4, 16), "typing_extensions-"),  # what pydantic 2.14 asks for
}
for name, (oldest, wheels) in wanted.items():
    have = version(name)
    if have is None or have < oldest:
        print(wheels)
PY
)
# compiled wheels for another Python than deps/'s 3.12 sit in deps-cpXY/ (e.g. deps-cp313)
tag=$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
DEPS=$WHEELS/deps
[[ -d $WHEELS/deps-$tag ]] && DEPS=$WHEELS/deps-$tag
for prefix in $needed; do
    found=("$DEPS"/"$prefix"*.whl)
    if ((${#found[@]} == 0)); then
        log "the machine lacks ${prefix%-} and $DEPS holds no wheel of it"
    else
        wheels+=("${found[@]}")
    fi
done
log "installing into $SITE: ${wheels[*]##*/}"
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    # one pip call: the substrax wheels share the substrax/ namespace folder, which a second
    # --target call would refuse to merge into
    "$PYTHON" -m pip install --quiet --no-deps --no-index --no-compile --target "$SITE" \
        "${wheels[@]}" 2>&1 | tee -a "$OUT/environment.txt"
else  # no pip: a wheel is a zip of what goes on the path
    for wheel in "${wheels[@]}"; do "$PYTHON" -m zipfile -e "$wheel" "$SITE"; done
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export JAX_PLATFORMS=${DEVICE_PLATFORMS:-cuda}
export PYTHONUNBUFFERED=1

{
    "$PYTHON" --version
    "$PYTHON" -c 'import jax, jaxlib, flax, optax, orbax.checkpoint as ocp; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__, "optax", optax.__version__, "orbax", ocp.__version__); print(jax.devices())'
    "$PYTHON" -c 'import substrax.spmd, substrax.checkpoint, substrax.tracking, substrax.callbacks; print("substrax imports from", substrax.spmd.__file__)'
    git -C "$ROOT" log -1 --format='substrax at %h %s' 2>/dev/null || true
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
} 2>&1 | tee -a "$OUT/environment.txt"

status=0
# --- the benchmark --------------------------------------------------------------------------
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
timeout "${BENCH_TIMEOUT:-340}" "$PYTHON" benchmarks/accelerator.py --json "$OUT/accelerator.json" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/accelerator.txt"
part=${PIPESTATUS[0]}
log "benchmarks/accelerator.py exited $part"
((status == 0)) && status=$part

# --- the example's GPU preset ---------------------------------------------------------------
if [[ -z ${SKIP_EXAMPLE:-} ]]; then
    runs=$(mktemp -d)
    # shellcheck disable=SC2086  # EXAMPLE_ARGS is a list of arguments
    AVITAI_OUTPUT_DIR=$runs timeout "${EXAMPLE_TIMEOUT:-200}" "$PYTHON" examples/transformer_lm.py \
        --preset gpu ${EXAMPLE_ARGS:-} 2>&1 | tee "$OUT/transformer_lm_gpu.txt"
    part=${PIPESTATUS[0]}
    log "examples/transformer_lm.py --preset gpu exited $part"
    ((status == 0)) && status=$part
    mkdir -p "$OUT/transformer_lm_gpu"
    cp "$runs"/transformer_lm/summary.json "$runs"/transformer_lm/logs/*.jsonl \
        "$OUT/transformer_lm_gpu/" 2>/dev/null || true
fi
exit "$status"
