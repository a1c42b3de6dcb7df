#!/usr/bin/env bash
# The README's test command as a newcomer runs it: from a fresh clone of this checkout's HEAD,
# set up from nothing, on a machine that is idle or (--busy) has a training run beside it the
# whole time. A green suite on the developer's own machine says little about a faster or a
# slower one (tests/test_faults.py once assumed a slow machine); this is how to look.
#
#   bash scripts/fresh-clone-test.sh [--busy] [DIR]
#
# DIR (default: ~/hpc_llm-fresh-<time>) must be outside /tmp: the dev cluster's jobs get a
# private /tmp. The clone gets its own .venv; ~/.hpc_llm is left alone (the suite and the load
# keep their state under DIR). Prints the suite's summary line and its wall-clock time.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
busy=0
if [ "${1:-}" = "--busy" ]; then busy=1; shift; fi
dir="${1:-$HOME/hpc_llm-fresh-$(date +%Y%m%d-%H%M%S)}"
case "$dir" in /tmp/*) echo "fresh-clone-test: $dir is under /tmp; Slurm jobs get a private /tmp" >&2; exit 2;; esac
[ -e "$dir" ] && { echo "fresh-clone-test: $dir exists; give a new directory" >&2; exit 2; }

git clone -q --no-hardlinks "$src" "$dir"
cd "$dir"
echo "== fresh clone of $(git rev-parse --short HEAD) in $dir"
# the README's second command, exactly as the README gives it
cmd="$(awk '/^```bash$/{n++; next} n==1 && /pytest/{print; exit}' README.md)"
[ -n "$cmd" ] || { echo "fresh-clone-test: no test command in README.md's first code block" >&2; exit 2; }
echo "== $cmd"

load_pid=""
stop_load() { [ -z "$load_pid" ] || kill -- "-$load_pid" 2>/dev/null || true; }
trap stop_load EXIT
if [ "$busy" = 1 ]; then
  # the load waits for the clone's .venv (setup-dev.sh makes it), then trains mpt_tiny on one
  # rank over and over beside the suite: a machine shared with another user's training
  mkdir -p "$dir/.busy"
  setsid bash -c '
    cd "$1"
    until [ -x .venv/bin/python ] && .venv/bin/python -c "import llmfoundry" 2>/dev/null; do sleep 10; done
    while true; do
      HPC_LLM_RUNS="$1/.busy/runs" HPC_LLM_HOME="$1/.busy/home" .venv/bin/python -m hpc_llm \
        +experiment=mpt_tiny resources.tasks_per_node=1 eval=none train.max_duration=3000ba \
        >> "$1/.busy/load.log" 2>&1 || sleep 5
      rm -rf "$1/.busy/runs"
    done' _ "$dir" &
  load_pid=$!
  echo "== load: mpt_tiny training on one rank beside the suite (log $dir/.busy/load.log)"
fi

start=$(date +%s)
set +e
bash -c "$cmd" > "$dir/suite.log" 2>&1
rc=$?
set -e
end=$(date +%s)
tail -n 40 "$dir/suite.log"
echo "== $( [ "$busy" = 1 ] && echo busy || echo idle ) machine: exit $rc, $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s (setup included); log $dir/suite.log"
exit "$rc"
