"""``hpc-llm doctor``: what hpc_llm needs from a Slurm cluster, and whether this one has it.

    hpc-llm doctor [partition=NAME] [--run RUN_DIR] [--image PATH] [--json] [--no-probe]
                   [--write-profile NAME [--dir DIR] [--force]] [overrides...]

The job is composed as ``python -m hpc_llm <overrides> hydra/launcher=slurm`` would
compose it, and its real batch script's flags are put to the same checks a submit
makes (:mod:`hpc_llm.launch.sbatch.checks`: the partition can hold it, ``sbatch
--test-only``). Then what a long run relies on is read from ``scontrol show
config``, ``scontrol show partition``, ``sinfo`` and ``sacct`` (preemption that
signals and requeues, requeue itself, GraceTime against a checkpoint save, the time
limit, node-failure timeouts, accounting, GPUs), and one tiny probe job
(:mod:`hpc_llm.doctor.probe`) says what a compute node sees: the run dir,
the Python environment, the container image, Apptainer, enroot, GPUs (and ``srun --help``
whether srun loads NVIDIA's pyxis).

Each check is one row: what was found, OK / WARN / FAIL and, for a problem, what breaks
without it and what to ask the admin. Exit status 1 when a must-have is missing (a FAIL
row); WARN rows do not fail. Login node only: no training stack. The modules:

- ``facts``: what the job needs and what the cluster said (plain data);
- ``gather``: composing the job and asking Slurm and the probe job for the facts;
- ``probe``: the probe job, one tiny srun on a compute node;
- ``row``: one check's verdict;
- ``checks_scheduler``, ``checks_long_run``, ``checks_node``: the checks, pure (facts and
  needs in, a row out; tests/test_doctor.py checks them row by row), and ``checks``: all of
  them in order (:func:`~hpc_llm.doctor.checks.evaluate`) and the exit status;
- ``table``: the rows as a table or JSON;
- ``profile``: ``--write-profile``, a cluster profile from what was found;
- ``command``: the subcommand's arguments and run.
"""

from hpc_llm.doctor.command import add_parser, run

__all__ = ["add_parser", "run"]
