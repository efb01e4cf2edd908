#!/usr/bin/env bash
# Create or refresh the development environment with uv (the dev and test dependency groups, plus
# the backend's group for this machine) and write the managed environment file .substrax.env,
# which `source ./activate.sh` loads. A user-owned .env is never read or written.
set -euo pipefail
cd "$(dirname "$0")"

usage() {
    cat <<'USAGE'
usage: ./setup.sh [--backend auto|cpu|cuda12|metal] [--python VERSION] [--extra NAME]...
                  [--recreate] [--force-clean] [--dry-run]

  --backend      JAX backend policy (default auto: cuda12 on Linux with a visible NVIDIA GPU,
                 metal on Apple Silicon, otherwise cpu)
  --python       create the environment with this Python version
  --extra NAME   also sync the workspace's dependency group NAME (repeatable), e.g. --extra docs;
                 a part's extra (wandb, mlflow, ...) is already in the test group
  --recreate     remove .venv before syncing
  --force-clean  remove .venv, .substrax.env and repo-local test and build artifacts first
  --dry-run      print the resolved backend and the commands, change nothing
USAGE
}

backend=auto
python_version=""
extras=()
recreate=0
force_clean=0
dry_run=0
while [ $# -gt 0 ]; do
    case "$1" in
        --backend) [ $# -ge 2 ] || { usage >&2; exit 2; }; backend="$2"; shift 2 ;;
        --python) [ $# -ge 2 ] || { usage >&2; exit 2; }; python_version="$2"; shift 2 ;;
        --extra) [ $# -ge 2 ] || { usage >&2; exit 2; }; extras+=("$2"); shift 2 ;;
        --recreate) recreate=1; shift ;;
        --force-clean) force_clean=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "setup.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done

case "$backend" in
    auto)
        if [ "$(uname -s)" = Linux ] && command -v nvidia-smi >/dev/null 2>&1 \
            && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
            resolved=cuda12
        elif [ "$(uname -s)" = Darwin ] && [ "$(uname -m)" = arm64 ]; then
            resolved=metal
        else
            resolved=cpu
        fi ;;
    cpu|cuda12|metal) resolved="$backend" ;;
    *) echo "setup.sh: --backend must be auto, cpu, cuda12 or metal, got '$backend'" >&2; exit 2 ;;
esac

# The dev tools and the test dependencies, named so that a change of default groups keeps them.
sync=(uv sync --locked --group dev --group test)
[ -n "$python_version" ] && sync+=(--python "$python_version")
[ "$resolved" != cpu ] && sync+=(--group "$resolved")
# The names under a TOML table's header ("name = [" lines), e.g. the root's dependency groups.
table_keys() { sed -n "/^\[$2\]/,/^\[/p" "$1" | sed -n 's/^\([A-Za-z0-9_-]*\) *= *\[.*/\1/p'; }
groups="$(table_keys pyproject.toml dependency-groups | tr '\n' ' ')"
part_extras="$(for p in packages/*/pyproject.toml; do table_keys "$p" project.optional-dependencies; done \
    | sort -u | tr '\n' ' ')"
notes=()
for extra in ${extras[@]+"${extras[@]}"}; do
    if ! [[ "$extra" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]]; then
        echo "setup.sh: --extra '$extra' is not a name: give one group or extra per --extra" >&2
        exit 2
    elif [[ " $groups " == *" $extra "* ]]; then
        sync+=(--group "$extra")
    elif [[ " $part_extras " == *" $extra "* ]]; then
        notes+=("extra $extra: already installed (the test group holds every part with every extra)")
    else
        echo "setup.sh: --extra '$extra' is neither a dependency group of the workspace" \
            "(${groups% }) nor an extra of a part (${part_extras% })" >&2
        exit 2
    fi
done
write_env=(uv run --locked --no-sync python -m substrax.runtime.managed_env write
    --prefix SUBSTRAX --backend "$resolved" --output .substrax.env)

echo "backend: $resolved (asked for $backend)"
for note in ${notes[@]+"${notes[@]}"}; do echo "$note"; done
if [ "$dry_run" = 1 ]; then
    [ "$force_clean" = 1 ] && echo "rm -rf .venv .substrax.env .pytest_cache build site"
    [ "$recreate" = 1 ] && [ "$force_clean" = 0 ] && echo "rm -rf .venv"
    echo "${sync[*]}"
    echo "${write_env[*]}"
    exit 0
fi

command -v uv >/dev/null 2>&1 || { echo "setup.sh: uv is not installed: see https://docs.astral.sh/uv/" >&2; exit 1; }
if [ "$force_clean" = 1 ]; then
    rm -rf .venv .substrax.env .pytest_cache build site
elif [ "$recreate" = 1 ]; then
    rm -rf .venv
fi
"${sync[@]}"
"${write_env[@]}"
echo "wrote .substrax.env; run: source ./activate.sh"
