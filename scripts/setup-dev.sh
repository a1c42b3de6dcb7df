#!/usr/bin/env bash
# Set up a development machine from scratch: Debian packages (Slurm for the
# dev cluster), a real Apptainer (scripts/install-apptainer.sh), Slurm 24.11 beside
# the system's 22.05 (scripts/install-slurm.sh), enroot and pyxis (scripts/install-pyxis.sh), a virtualenv
# in .venv with hpc_llm[train,test] installed editable. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# slurmdbd + mariadb-server: the dev cluster's accounting (sacct); it starts its own
# MariaDB by hand, so the service the package would start is not needed.
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmdbd >/dev/null 2>&1 \
    || ! command -v mariadbd >/dev/null 2>&1; then
  echo "== installing slurm-wlm, slurmdbd, mariadb-server (Debian packages)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q slurm-wlm >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends slurmdbd mariadb-server >/dev/null
fi

# a real Apptainer (Debian sid's, with a private glibc; the container tests run it)
bash scripts/install-apptainer.sh

# a second Slurm beside 22.05: Debian trixie's 24.11 in /opt/slurm-24.11, with a private glibc
# (the tests marked slurm24 run a second dev cluster on it)
bash scripts/install-slurm.sh 24.11

# enroot and pyxis (srun --container-image), built from the vendored sources (shared/vendor beside the checkout)
# for both Slurm versions (container=pyxis's tests run them); where they cannot be built here it
# says why in one line and the pyxis tests skip with that reason
bash scripts/install-pyxis.sh

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
echo "== installing hpc_llm[train,test] (torch 2.7.0, llm-foundry 0.22.0, ...), as constraints/llmfoundry.txt pins"
.venv/bin/python -m pip install -q --upgrade pip
# the resolved versions, not a fresh resolution: the same environment on every machine, and no
# backtracking (scripts/freeze-constraints.py writes the file; tests/test_constraints.py checks it)
.venv/bin/python -m pip install -q -e '.[train,test]' -c constraints/llmfoundry.txt
# the torchtitan trainer's own venv (.venv-torchtitan: torch 2.14, torchtitan 0.3.0); its tests
# (tests/test_torchtitan.py, the trainer contract suite) run it
bash scripts/setup-torchtitan.sh
echo "== ready: .venv/bin/python -m hpc_llm +experiment=mpt_tiny"
