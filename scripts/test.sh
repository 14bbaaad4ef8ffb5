#!/usr/bin/env bash
# Test suite: build the environment if needed, then run pytest (GPU tests skip on CPU) in two processes: every test
# but those on the session's Ray cluster, then those (`-m ray_cluster`, tests/conftest.py). A Ray cluster that dies
# takes the process that started it along (its driver exits at once, with no report): in a process of their own the
# Ray tests cannot take the other tests' results with them; if that process dies without a report, Ray's logs are
# printed and it runs once more (a test that fails is never rerun).
#   scripts/test.sh --fast   the fast tier alone: no test that needs Megatron-Bridge, Transformer Engine, Ray or a GPU
#                            (tests/conftest.py: slow from the megatron_bridge fixture; an import of either skips)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh >&2

if [ "${1:-}" = "--fast" ]; then
    shift
    exec .venv/bin/python -m pytest -q --fast --durations=10 "$@"
fi

passed_or_none() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; } # 5: nothing selected (a path without such tests)

status=0
.venv/bin/python -m pytest -q --durations=30 -m "not ray_cluster" "$@" || status=$?
passed_or_none "$status" && status=0

report_dir=$(mktemp -d)
trap 'rm -rf "$report_dir"' EXIT
for attempt in 1 2; do
    ray_status=0
    .venv/bin/python -m pytest -q --durations=10 -m ray_cluster --junitxml="$report_dir/ray.xml" "$@" ||
        ray_status=$?
    if [ -f "$report_dir/ray.xml" ] || passed_or_none "$ray_status"; then
        break
    fi
    echo "test.sh: the Ray-cluster tests' process died without a report (exit $ray_status), attempt $attempt;" \
        "Ray's logs:" >&2
    for log in /tmp/ray/session_latest/logs/{raylet.out,gcs_server.out,python-core-driver-*.log}; do
        [ -f "$log" ] && { echo "--- $log" >&2; grep -vE '^\[state-dump\]|^[[:space:]]' "$log" | tail -n 30 >&2; }
    done
    { dmesg 2>/dev/null | grep -iE "out of memory|oom-kill|killed process" | tail -n 5 >&2; } || true
done
passed_or_none "$ray_status" || status=$ray_status
exit "$status"
