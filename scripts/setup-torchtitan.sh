#!/usr/bin/env bash
# The torchtitan trainer's environment (trainer=torchtitan): .venv-torchtitan beside .venv, with
# hpc_llm[torchtitan] (torch 2.14.1, torchtitan 0.3.0) as constraints/torchtitan.txt pins.
# Its own venv because torch 2.14 cannot share one with LLM Foundry's torch 2.7; the login
# process (.venv) cloudpickles each job's payload and these ranks unpickle it, so both venvs
# pin the same Python minor and the same hydra-core, omegaconf and cloudpickle (the
# constraints of both say so; tests/test_constraints.py checks). Idempotent.
#   bash scripts/setup-torchtitan.sh && .venv/bin/python -m hpc_llm +experiment=llama3_tiny
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${HPC_LLM_TORCHTITAN_VENV:-.venv-torchtitan}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
echo "== installing hpc_llm[torchtitan] (torch 2.14.1, torchtitan 0.3.0) into $VENV, as constraints/torchtitan.txt pins"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[torchtitan]' -c constraints/torchtitan.txt
echo "== ready: .venv/bin/python -m hpc_llm +experiment=llama3_tiny"
