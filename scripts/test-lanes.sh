#!/usr/bin/env bash
# The suite in two lanes (docs/testing.md, "Lanes"):
#   1. every test not marked `alone`, spread over TEST_WORKERS processes (pytest-xdist; a
#      module's tests stay in one process, so its servers start once);
#   2. the `alone` tests, one at a time on an otherwise idle machine: they assert how long
#      something takes as its user waits (time limits, leases, shutdown grace), and another
#      lane's work on the same cores would be measured with them.
# Both lanes always run; the exit status is the first failing lane's (no test selected in a
# lane is not a failure).
#
#   scripts/test-lanes.sh PYTHON [MARKER_EXPRESSION] [-- PYTEST_ARGS...]
set -uo pipefail
python=$1
shift
select=""
if [[ $# -gt 0 && $1 != "--" ]]; then
    select="($1) and "
    shift
fi
[[ ${1:-} == "--" ]] && shift
workers=${TEST_WORKERS:-2}

status=0
lane() {
    "$python" -m pytest "$@"
    local code=$?
    if [[ $code -ne 0 && $code -ne 5 && $status -eq 0 ]]; then
        status=$code
    fi
}
lane -n "$workers" --dist loadfile -m "${select}not alone" "$@"
lane -p no:xdist -m "${select}alone" "$@"
exit "$status"
