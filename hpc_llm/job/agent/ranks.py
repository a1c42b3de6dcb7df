"""How an agent gets its ranks: the training stack warmed once, each rank forked from it.

:class:`RankRuntime` is what the agent's loop (:mod:`~hpc_llm.job.agent.loop`) asks of the
ranks it runs, and all it asks: warm up (:mod:`~hpc_llm.job.agent.warm`), check the node
(:mod:`~hpc_llm.job.agent.node_check`), fork a rank (:mod:`~hpc_llm.job.agent.forker`), kill a
rank's process group, and name the node-local scratch. :class:`Forked` is the real one, returned
by :func:`hpc_llm.job.world.ranks`; the simulator's world returns a model of a training rank
instead (:mod:`hpc_llm.sim.ranks`), so that the agent's own code is what the simulator runs.
Stdlib only at import (the training stack loads in :meth:`Forked.warm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from hpc_llm.job import heartbeat


class RankRuntime(Protocol):
    def warm(self, payload_path: Path) -> tuple[Any, float]: ...
    def describe(self, payload: Any) -> str: ...
    def check_node(self, payload: Any) -> Any: ...
    def check_fork_safe(self) -> None: ...
    def scratch_dir(self, payload: Any, run_dir: Path, job_id: str | None, node_rank: int) -> Path | None: ...
    def fork_rank(
        self,
        *,
        payload: Any,
        payload_path: Path,
        board: heartbeat.Board,
        gen: int,
        rank: int,
        local_rank: int,
        env: dict[str, str],
        log_path: Path,
        close_fds: list[int],
    ) -> int: ...
    def kill_group(self, pid: int) -> None: ...
    def remove_stale_boards(self, directory: Path) -> list[Path]: ...


class Forked:
    """The real ranks: the training stack imported in the agent, each rank a fork of it."""

    def warm(self, payload_path: Path) -> tuple[Any, float]:
        from hpc_llm.job.agent import warm

        return warm.warm(payload_path)

    def describe(self, payload: Any) -> str:
        from hpc_llm.job.agent import warm

        return warm.describe(payload)

    def check_node(self, payload: Any) -> Any:
        """This node's own checks, before it trains or waits as a spare (hpc_llm's task only:
        another Hydra app's agent may have no torch)."""
        from hpc_llm.job.agent import node_check, warm

        if not warm.is_hpc_llm_task(payload):
            return node_check.NodeCheck()
        warm.check_fork_safe()
        return node_check.check(payload.config)

    def check_fork_safe(self) -> None:
        from hpc_llm.job.agent import warm

        warm.check_fork_safe()

    def scratch_dir(self, payload: Any, run_dir: Path, job_id: str | None, node_rank: int) -> Path | None:
        from hpc_llm.job.agent import warm

        return warm.scratch_dir(payload, run_dir, job_id, node_rank)

    def fork_rank(self, **kw: Any) -> int:
        from hpc_llm.job.agent import forker

        return forker.fork_rank(**kw)

    def kill_group(self, pid: int) -> None:
        from hpc_llm.job.agent import forker

        forker.kill_group(pid)

    def remove_stale_boards(self, directory: Path) -> list[Path]:
        return heartbeat.remove_stale_boards(directory)
