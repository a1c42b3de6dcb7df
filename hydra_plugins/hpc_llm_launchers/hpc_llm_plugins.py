"""Plugin classes and their config schemas, for Hydra's plugin scan.

Hydra only instantiates plugins whose class lives under ``hydra_plugins``,
so these are thin subclasses of the implementations in ``hpc_llm.launch``.
"""

from hpc_llm.config.launcher_options import register_launcher_configs
from hpc_llm.launch import local, slurm, sweeper


class LocalLauncher(local.LocalLauncher):
    """``hydra/launcher=local`` (see hpc_llm.launch.local)."""


class SlurmLauncher(slurm.SlurmLauncher):
    """``hydra/launcher=slurm`` (see hpc_llm.launch.slurm)."""


class ValidatingSweeper(sweeper.ValidatingSweeper):
    """``hydra/sweeper=hpc_llm`` (see hpc_llm.launch.sweeper)."""


register_launcher_configs()
