# Load the development environment: `source ./activate.sh` after ./setup.sh.
# It activates .venv and exports the managed variables of .substrax.env; a user's .env is untouched.
_substrax_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
if [ ! -f "$_substrax_root/.venv/bin/activate" ] || [ ! -f "$_substrax_root/.substrax.env" ]; then
    echo "activate.sh: run ./setup.sh first" >&2
    unset _substrax_root
    return 1 2>/dev/null || exit 1
fi
# shellcheck disable=SC1091
. "$_substrax_root/.venv/bin/activate"
# shellcheck disable=SC1091
. "$_substrax_root/.substrax.env"
unset _substrax_root
