"""Plugin classes and their config schemas, for Hydra's plugin scan.

Hydra only instantiates plugins whose class lives under ``hydra_plugins``,
so these are thin subclasses of the implementations in ``hpc_llm.launchers``.
"""

from hpc_llm.launchers import local, slurm, sweeper
from hpc_llm.launchers.config import register_launcher_configs


class LocalLauncher(local.LocalLauncher):
    """``hydra/launcher=local`` (see hpc_llm.launchers.local)."""


class SlurmLauncher(slurm.SlurmLauncher):
    """``hydra/launcher=slurm`` (see hpc_llm.launchers.slurm)."""


class ValidatingSweeper(sweeper.ValidatingSweeper):
    """``hydra/sweeper=hpc_llm`` (see hpc_llm.launchers.sweeper)."""


register_launcher_configs()
