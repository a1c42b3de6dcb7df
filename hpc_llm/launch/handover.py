"""The callable submitit is given for each job, and why it is never what runs.

submitit submits a job by pickling a callable (``SlurmExecutor.submit(fn)``) into the job's
``.submitit`` folder, where its own batch script would run it in every srun task
(``python -m submitit.core._submit <folder>``). hpc_llm keeps submitit for what it does well
(``sbatch``, its job ids, arrays, the job folder) but renders the batch script itself from
``sbatch_templates/``: that script ``exec``s the job's supervisor, whose agents fork the ranks
on the run directory's payload (``.hpc_llm/job.pkl``), so submitit's ``_submit`` never runs.
Its API still takes a callable, and :class:`RankEntry` is the honest one to give it: the job's
own entry point on that payload (one rank of it, were ``_submit`` ever run by hand). It lives in
a module of its own that imports nothing, so pickling it costs the login side nothing; the
in-job side is imported only if it is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class RankEntry:
    def __init__(self, payload: str) -> None:
        self.payload = payload

    def __call__(self) -> Any:
        from hpc_llm.job.rank import entry

        entry.configure_logging()
        return entry.run_payload(Path(self.payload))
