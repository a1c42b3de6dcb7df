"""A plain Hydra app (not hpc_llm's task): what any task function sees under a launcher.

It registers an OmegaConf resolver in the launching process only; a launcher
that does not hand Hydra's state to the job process fails ``${twice:...}``.
Each job writes what it saw to ``seen.json`` in its output directory.
"""

import json
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

OmegaConf.register_new_resolver("twice", lambda x: 2 * int(x))


@hydra.main(config_path=".", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    hc = HydraConfig.get()
    seen = {
        "cfg": OmegaConf.to_container(cfg, resolve=True),
        "has_hydra_node": "hydra" in cfg,
        "job_name": hc.job.name,
        "num": hc.job.num,
        "output_dir": hc.runtime.output_dir,
        "cwd": os.getcwd(),
        "env_set": os.environ.get("APP_ENV_SET"),
    }
    Path(hc.runtime.output_dir, "seen.json").write_text(json.dumps(seen, sort_keys=True))
    return int(seen["cfg"]["doubled"])


if __name__ == "__main__":
    main()
