"""Baseline for overhead.py: LLM Foundry's own entry point on a resolved config.

Run under Composer's launcher (``composer -n N``), exactly as LLM Foundry's
scripts/train/train.py is.
"""

import sys

from llmfoundry.command_utils import train_from_yaml

if __name__ == "__main__":
    trainer = train_from_yaml(sys.argv[1], sys.argv[2:])
    ts = trainer.state.timestamp
    print(f"BASELINE tokens={int(ts.token)} fit_s={ts.total_wct.total_seconds():.3f}", flush=True)
