"""A run's record: ``results.json`` and the attempts behind it. The one owner of both.

``results.json`` (in the run dir) is what reports, ``hpc-llm status`` and
the estimator read: the same fields whatever happened to the run (see
:func:`skeleton`). ``.hpc_llm/attempts.json`` lists every start of the run
(a Slurm requeue, a restart inside the allocation) and how each ended.

Two writers, never at the same time. Inside a generation of ranks, global rank 0
keeps a :class:`RunRecord`: it opens an attempt when it starts, notes
progress, and closes the attempt through exactly one of
:meth:`RunRecord.completed`, :meth:`RunRecord.failed` or
:meth:`RunRecord.stopped`. Between generations the job's supervisor
(:mod:`hpc_llm.job.supervisor`) decides what happens next and records it
in the attempts. Both end by writing results.json through
:func:`update_results`, so the summary of the attempts (restarts by cause,
goodput) is computed in one place. What the run has trained (the loss history,
tokens/s, MFU) rank 0 also keeps apart, in ``.hpc_llm/trained.json``, at every
checkpoint and as training ends (:meth:`RunRecord.trained`): an attempt killed
after that, before any close of its own, loses none of it. Files are replaced
atomically (temp file + rename), so a reader never sees half a record. Pure
(login node): no training stack.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hpc_llm import world
from hpc_llm.rundir import epoch
from hpc_llm.rundir.layout import RunDir

if TYPE_CHECKING:  # the job's supervisor imports this module: no omegaconf (tests/test_layers.py)
    from hpc_llm.config.plan import JobPlan

SCHEMA_VERSION = 2

#: causes that end the run: no budget, no retry
FINAL_CAUSES = ("user_error", "cancelled", "budget", "preflight_failed")
#: results.json statuses that say how a run ended (others: it is running, or died unheard)
SETTLED = frozenset({"completed", "failed"})


def skeleton(plan: JobPlan, status: str) -> dict[str, Any]:
    """Fields every results.json has, whatever happened to the run."""
    return {
        "schema_version": SCHEMA_VERSION,
        "experiment": plan.experiment,
        "status": status,
        "error": None,
        # as submitted: a run that went on with fewer nodes says so in size_changes
        "nodes": plan.full_nodes,
        "tasks_per_node": plan.tasks_per_node,
        "gpus_per_node": plan.gpus_per_node,
        "world_size": plan.full_nodes * plan.tasks_per_node,
        "device": plan.device,
        "parallelism": plan.parallelism,
        "batches_done": None,
        "tokens_done": None,
        "wallclock_s": None,
        "train_s": None,
        "fit_s": None,
        "tokens_per_sec": None,
        "mfu": None,
        "train_loss": None,
        "train_loss_first": None,
        "train_loss_history": [],
        "peak_memory_bytes": None,
        "peak_memory_bytes_per_rank": [],
        "checkpoint": None,
        "checkpoint_bytes": None,
        "restarts": 0,
        "slurm_job_ids": [],
        "eval": {},
        "conversion_ok": None,
        "inference_ok": None,
        "device_mesh": None,
        "run_dir": plan.run_dir,
    }


def run_info(cfg: Any) -> dict[str, Any]:
    """What was trained, for reports: model, parameters, data, duration, eval interval."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg.train, resolve=True) if cfg.get("train") is not None else {}
    train = cast("dict[str, Any]", container if isinstance(container, dict) else {})
    where = cfg.data.path or cfg.data.remote
    info: dict[str, Any] = {
        "model": None,
        "n_params": None,
        "flops_per_token": None,
        "data": str(cfg.data.name) + (f" ({where})" if where else ""),
        "max_duration": str(train.get("max_duration")),
        "eval_interval": str(cfg.eval.interval) if cfg.eval.evaluators else None,
        "global_train_batch_size": train.get("global_train_batch_size"),
        "max_seq_len": train.get("max_seq_len"),
    }
    model = train.get("model")
    if isinstance(model, dict) and model.get("name") in ("mpt_causal_lm", "hf_causal_lm", "torchtitan_llama3"):
        from hpc_llm.config.flops import model_size, train_seq_len

        try:  # a hub id hpc_llm cannot size offline leaves the label empty, the run goes on
            seq = train_seq_len(train)
            size = model_size(model, seq)
        except (KeyError, TypeError, ValueError):
            pass
        else:
            info.update(model=size.label, n_params=size.n_params, flops_per_token=size.flops_per_token(seq))
    return info


def write_json(path: Path, data: Any) -> Path:
    """Put one of the run's records in place, atomically (a temp file renamed over it), once this
    process's epoch allows it (:func:`hpc_llm.rundir.epoch.check`: a process that no longer holds
    the job raises :class:`~hpc_llm.rundir.epoch.Stale` and writes nothing; one that holds no epoch,
    the login side, always may). Every write of results.json, attempts.json, trained.json,
    progress, spares.json and the failure reports comes here."""
    epoch.check(f"writing {path.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{world.pid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    world.replace(tmp, path)
    return path


def iso(epoch: Any) -> str | None:
    """Epoch seconds as ISO 8601 in UTC, to the second (``2026-11-24T19:22:09Z``); None if not a time."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)):
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_iso_times(data: dict[str, Any]) -> dict[str, Any]:
    """Every epoch timestamp results.json carries gets a readable twin beside it, ``<name>_iso``
    (docs/reference/results-json.md): a person reading the file should not have to convert floats."""
    data["finished_at_iso"] = iso(data.get("finished_at"))
    prov = data.get("provenance")
    if isinstance(prov, dict) and "submitted_at" in prov:
        data["provenance"] = {**prov, "submitted_at_iso": iso(prov["submitted_at"])}
    events = data.get("watchdog_events")
    if isinstance(events, list):
        data["watchdog_events"] = [{**e, "time_iso": iso(e.get("time"))} if isinstance(e, dict) else e for e in events]
    return data


def write_results(run_dir: Path | str, data: dict[str, Any]) -> Path:
    return write_json(RunDir(run_dir).results, with_iso_times(data))


def read_results(run_dir: Path | str) -> dict[str, Any] | None:
    path = RunDir(run_dir).results
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def write_progress(run_dir: Path | str, data: dict[str, Any]) -> None:
    write_json(RunDir(run_dir).progress, data)


def read_progress(run_dir: Path | str) -> dict[str, Any]:
    """The live progress of a run ({} before it has any, or mid-write): batch, loss, tokens/s, phase,
    rewritten by rank 0 about once a second."""
    path = RunDir(run_dir).progress
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


@dataclass
class Attempt:
    """One start of training: a Slurm allocation (``restart``) and a generation of ranks inside it
    (``generation``)."""

    job_id: str | None
    #: SLURM_RESTART_COUNT of the allocation (0 for the first)
    restart: int
    started_at: float
    #: the generation of ranks inside the allocation (> 0 after a restart in place)
    generation: int = 0
    nodes: list[str] = field(default_factory=list)
    #: when Slurm started the allocation (queue wait ends here)
    alloc_started_at: float | None = None
    resumed_at_batch: int = 0
    last_batch: int = 0
    #: seconds spent training (fit start to the last batch noted)
    train_s: float = 0.0
    #: when the first batch of this attempt was done (training again after a stop)
    first_batch_at: float | None = None
    #: the phases of a start (epoch seconds): the agent forked the ranks, the rendezvous was
    #: done, the checkpoint was loaded (Composer's fit start)
    forked_at: float | None = None
    rendezvous_at: float | None = None
    loaded_at: float | None = None
    #: running (not ended yet, or died unrecorded) | completed | stopped | failed | lost
    state: str = "running"
    ended_at: float | None = None
    #: why it ended (hpc_llm.job.supervisor.policy's causes, FINAL_CAUSES) and what was done about it
    cause: str | None = None
    #: restart (in the allocation) | swap (restart with spares for left-out nodes) | requeue | fail | none
    action: str | None = None
    #: when the supervisor first saw the stop coming (a rank's failure, a dead node, a hang, a
    #: signal), when it decided what to do, and when every rank of the attempt was gone
    detected_at: float | None = None
    decided_at: float | None = None
    stopped_at: float | None = None
    error: str | None = None
    #: nodes blamed for the failure (left out of the next allocation)
    suspects: list[str] = field(default_factory=list)
    signal: str | None = None
    signal_time: float | None = None
    stopped_at_batch: int | None = None
    save_s: float | None = None
    #: the batch of the newest checkpoint this attempt saved (progress: it resets the failure count)
    checkpoint_batch: int | None = None
    #: the longest periodic checkpoint save seen (upper bound: save plus any eval at that batch)
    checkpoint_save_s: float | None = None
    signal_to_requeue_s: float | None = None
    requeued: bool = False
    #: nodes Slurm allocated, spares included (0: as many as ``nodes``): allocated node-seconds
    alloc_nodes: int = 0
    #: nodes this stop left out of the allocation, each replaced by a spare (action "swap")
    left_out: list[str] = field(default_factory=list)
    #: nodes the job gave back to Slurm after this stop (left out and still allocated: the job shrank)
    given_back: list[str] = field(default_factory=list)
    #: a ``network`` stop's nodes the batch host could not reach (blamed if it happens again)
    unreachable: list[str] = field(default_factory=list)
    #: straggler verdicts (hpc_llm.job.supervisor.stragglers): node, ratio, busy seconds per batch
    #: of every node, the action taken (warn | swap | exclude), when
    stragglers: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        known = {f.name for f in fields(cls)}
        if "ended" in data and "state" not in data:  # attempts.json written before the rename
            data = {**data, "state": data["ended"]}
        if "step" in data and "generation" not in data:  # written before "generation" was the word
            data = {**data, "generation": data["step"]}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def allocation(self) -> tuple[str | None, int]:
        return (self.job_id, self.restart)


#: what results.json shows of each attempt
ATTEMPT_SUMMARY = (
    "job_id",
    "restart",
    "generation",
    "nodes",
    "state",
    "cause",
    "action",
    "error",
    "suspects",
    "left_out",
    "stragglers",
    "alloc_nodes",
    "signal",
    "resumed_at_batch",
    "last_batch",
    "stopped_at_batch",
    "save_s",
    "signal_to_requeue_s",
    "queue_wait_s",
    "train_s",
)


@dataclass
class Attempts:
    path: Path
    items: list[Attempt] = field(default_factory=list)

    @classmethod
    def load(cls, run_dir: Path | str) -> Attempts:
        path = RunDir(run_dir).attempts
        items = [Attempt.from_dict(a) for a in json.loads(path.read_text())] if path.is_file() else []
        return cls(path, items)

    def save(self) -> None:
        write_json(self.path, [asdict(a) for a in self.items])

    @property
    def current(self) -> Attempt:
        return self.items[-1]

    def recomputed(self) -> dict[str, int]:
        """Batches trained in an attempt but trained again by the next one, by the cause of the stop."""
        out: dict[str, int] = {}
        for prev, nxt in zip(self.items, self.items[1:], strict=False):
            lost = max(0, prev.last_batch - nxt.resumed_at_batch)
            if lost:
                key = prev.cause or prev.state
                out[key] = out.get(key, 0) + lost
        return out

    def batches_lost(self) -> int:
        return sum(self.recomputed().values())

    def summary(self) -> dict[str, Any]:
        """What results.json says about the attempts: restarts by cause, queue waits and goodput."""
        items = self.items
        listed = []
        allocations: dict[tuple[str | None, int], list[float]] = {}
        productive_node_s = 0.0
        nodes_of: dict[tuple[str | None, int], int] = {}
        training_of: dict[tuple[str | None, int], int] = {}
        for i, a in enumerate(items):
            row = {k: v for k, v in asdict(a).items() if k in ATTEMPT_SUMMARY}
            prev = items[i - 1] if i else None
            new_allocation = prev is None or prev.allocation != a.allocation
            begin = _or(a.alloc_started_at, a.started_at)
            row["queue_wait_s"] = (
                round(max(0.0, begin - _or(prev.ended_at, prev.started_at)), 3)
                if prev is not None and new_allocation
                else 0.0
            )
            listed.append(row)
            end = _or(a.ended_at, a.started_at)
            span = allocations.setdefault(a.allocation, [begin, end])
            span[0], span[1] = min(span[0], begin), max(span[1], end)
            n = max(1, len(a.nodes))
            # spares are allocated too: they count against goodput (resources.spare_nodes)
            nodes_of[a.allocation] = max(nodes_of.get(a.allocation, 1), n, a.alloc_nodes)
            training_of[a.allocation] = max(training_of.get(a.allocation, 1), n)
            trained = max(0, a.last_batch - a.resumed_at_batch)
            kept = (
                trained
                if i == len(items) - 1
                else max(0, min(a.last_batch, items[i + 1].resumed_at_batch) - a.resumed_at_batch)
            )
            if trained:
                productive_node_s += a.train_s * kept / trained * n
        # a node given back after a swap (the job shrank) is paid for up to then, not to the end
        given_back_node_s = sum(
            len(a.given_back)
            * max(0.0, allocations[a.allocation][1] - _or(a.decided_at, _or(a.ended_at, a.started_at)))
            for a in items
        )
        allocated_node_s = (
            sum((end - begin) * nodes_of[key] for key, (begin, end) in allocations.items()) - given_back_node_s
        )
        spare_node_s = max(
            0.0,
            sum((end - begin) * max(0, nodes_of[key] - training_of[key]) for key, (begin, end) in allocations.items())
            - given_back_node_s,
        )
        causes: dict[str, int] = {}
        for a in items[:-1] if items and items[-1].state == "running" else items:
            if a.cause and a.cause != "completed":
                causes[a.cause] = causes.get(a.cause, 0) + 1
        requeues = [a.signal_to_requeue_s for a in items if a.signal_to_requeue_s is not None]
        first = items[0] if items else None
        last = items[-1] if items else None
        return {
            "restarts": max(len(items) - 1, last.restart if last else 0),
            "restarts_by_cause": causes,
            "batches_lost": self.batches_lost(),
            "batches_recomputed": self.recomputed(),
            "attempts": listed,
            "signal_to_requeue_s": requeues[-1] if requeues else None,
            "slurm_job_ids": sorted({a.job_id for a in items if a.job_id}, key=str),
            "total_wallclock_s": (
                round(_or(last.ended_at, last.started_at) - _or(first.alloc_started_at, first.started_at), 3)
                if first and last
                else None
            ),
            "allocated_node_s": round(allocated_node_s, 3),
            "spare_node_s": round(spare_node_s, 3),
            "size_changes": size_changes(items),
            "left_out_nodes": sorted({n for a in items for n in a.left_out}),
            "given_back_nodes": sorted({n for a in items for n in a.given_back}),
            #: node-seconds the job did not hold (nor pay for) because it gave nodes back after swaps
            "given_back_node_s": round(given_back_node_s, 3),
            "productive_node_s": round(productive_node_s, 3),
            "goodput": round(productive_node_s / allocated_node_s, 4) if allocated_node_s > 0 else None,
        }


def size_changes(items: list[Attempt]) -> list[dict[str, Any]]:
    """Each change of the number of nodes the run trained on (``resources.min_nodes``: it went on
    with fewer after losing some; a requeue grew it back): when, from how many to how many, and
    why (the stop before it). From the attempts' own node lists: nothing else to keep in step."""
    out: list[dict[str, Any]] = []
    trained = [a for a in items if a.nodes]
    for prev, a in zip(trained, trained[1:], strict=False):
        if len(prev.nodes) != len(a.nodes):
            out.append(
                {
                    "at": a.started_at,
                    "at_iso": iso(a.started_at),
                    "from_nodes": len(prev.nodes),
                    "to_nodes": len(a.nodes),
                    "why": prev.error or prev.cause,
                    "job_id": a.job_id,
                    "restart": a.restart,
                    "generation": a.generation,
                }
            )
    return out


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def update_results(run_dir: Path | str, attempts: Attempts, status: str, fields_: dict[str, Any]) -> dict[str, Any]:
    """Write results.json: what is there already, ``fields_`` and the summary of ``attempts``."""
    results = read_results(run_dir) or {"schema_version": SCHEMA_VERSION, "error": None}
    results.update(fields_)
    # what rank 0 kept of the training: an attempt killed after it trained (in the post-train
    # stage, before its save finished) wrote no results.json of its own
    fold_trained(results, read_trained(run_dir))
    results.update(attempts.summary())
    results["status"] = status
    results["finished_at"] = world.time()
    write_results(run_dir, results)
    return results


#: what only an attempt that trains measures: an attempt that trained nothing (one that resumed at
#: max_duration after a stop in the post-train stage) keeps the run's earlier figures
CARRIED_FIGURES = ("tokens_per_sec", "mfu")


def carry_training(results: dict[str, Any], earlier: dict[str, Any], resumed_at: int) -> None:
    """The run's loss history across attempts, in ``results`` (what this attempt writes): the
    earlier record's entries up to the batch this attempt resumed at, then this attempt's own
    (the batches after it were trained again, or never kept); ``train_loss`` and
    ``train_loss_first`` from that whole history. An attempt that trained nothing keeps the
    earlier record's loss and :data:`CARRIED_FIGURES` instead of writing null over them."""
    own = [(int(b), float(v)) for b, v in results.get("train_loss_history") or []]
    kept = [(int(b), float(v)) for b, v in earlier.get("train_loss_history") or [] if int(b) <= resumed_at]
    if not kept and not own and earlier.get("train_loss") is not None and results.get("train_loss") is None:
        results["train_loss"] = earlier["train_loss"]  # an older record without a history
    history = kept + [x for x in own if x[0] > resumed_at]
    if history:
        results["train_loss_history"] = [list(x) for x in history]
        results["train_loss"] = history[-1][1]
        results["train_loss_first"] = history[0][1]
    if not own:
        for key in CARRIED_FIGURES:
            if results.get(key) is None and earlier.get(key) is not None:
                results[key] = earlier[key]


#: what rank 0 keeps of the training apart from results.json (:func:`read_trained`)
TRAINING_FIGURES = ("train_loss", "train_loss_first", "train_loss_history", *CARRIED_FIGURES)


def read_trained(run_dir: Path | str) -> dict[str, Any] | None:
    """What the run has trained so far (``.hpc_llm/trained.json``: :data:`TRAINING_FIGURES`),
    kept by rank 0 at every checkpoint, as training ends and at every close; None before any."""
    path = RunDir(run_dir).trained
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def kept_training(run_dir: Path | str) -> dict[str, Any]:
    """The run's training figures so far: rank 0's kept ones, else (a run dir an older hpc_llm
    began, which kept none) the loss of its results.json."""
    kept = read_trained(run_dir)
    return kept if kept is not None else (read_results(run_dir) or {})


def fold_trained(results: dict[str, Any], kept: dict[str, Any] | None) -> None:
    """``results`` (a record the supervisor writes) with the training rank 0 kept: its loss and
    history (never older than any results.json rank 0 wrote: every close keeps them too), and
    the throughput where ``results`` has none."""
    if not kept:
        return
    if kept.get("train_loss_history"):
        for key in ("train_loss", "train_loss_first", "train_loss_history"):
            results[key] = kept.get(key)
    for key in CARRIED_FIGURES:
        if results.get(key) is None and kept.get(key) is not None:
            results[key] = kept[key]


class RunRecord:
    """The record of one run, kept by global rank 0 of a generation of ranks.

    Every way a generation ends goes through :meth:`completed`, :meth:`failed` or
    :meth:`stopped`; each closes the current attempt first and then writes
    results.json, so the two files always agree.
    """

    def __init__(self, run_dir: Path, plan: JobPlan, info: dict[str, Any], attempts: Attempts) -> None:
        self.run_dir = Path(run_dir)
        self.plan = plan
        self.info = info
        self.attempts = attempts

    @classmethod
    def open(
        cls,
        run_dir: Path,
        plan: JobPlan,
        info: dict[str, Any],
        *,
        job_id: str | None,
        restart: int,
        started_at: float,
        generation: int = 0,
        nodes: list[str] | None = None,
        alloc_started_at: float | None = None,
    ) -> RunRecord:
        """Load the attempts so far and start a new one."""
        attempts = Attempts.load(run_dir)
        attempts.items.append(
            Attempt(
                job_id=job_id,
                restart=restart,
                started_at=started_at,
                generation=generation,
                nodes=list(nodes or []),
                alloc_started_at=alloc_started_at,
            )
        )
        attempts.save()
        return cls(run_dir, plan, info, attempts)

    @property
    def current(self) -> Attempt:
        return self.attempts.current

    def note(self, **changes: Any) -> None:
        """Update the current attempt (progress, where it resumed) and save it."""
        for key, value in changes.items():
            setattr(self.current, key, value)
        self.attempts.save()

    def trained(self, figures: dict[str, Any]) -> dict[str, Any]:
        """Keep what this attempt has trained so far (``figures``: its loss history, tokens/s,
        MFU), with the run's earlier attempts' (as a close merges them, :func:`carry_training`).
        Rank 0 calls it at every checkpoint and as training ends, before the post-train stage:
        a stop that lands after that (a preemption or time limit in the post-train stage, where
        no batch boundary is left to stop at, so the ranks are killed before any close; a dead
        node) goes through no close of rank 0's, and the next close, and the supervisor's record
        of the stop, find the training here."""
        figures = {k: figures.get(k) for k in TRAINING_FIGURES}
        earlier = kept_training(self.run_dir)
        carry_training(figures, earlier, self.current.resumed_at_batch)
        return self._keep(figures, earlier)

    def _keep(self, figures: dict[str, Any], earlier: dict[str, Any]) -> dict[str, Any]:
        """Write the run's kept training (:func:`read_trained`): ``figures``' loss and history,
        and the last throughput measured, by this attempt or an earlier one."""
        kept = {k: figures.get(k) for k in TRAINING_FIGURES}
        kept["train_loss_history"] = [list(x) for x in kept["train_loss_history"] or []]
        for key in CARRIED_FIGURES:
            if kept[key] is None:
                kept[key] = earlier.get(key)
        write_json(RunDir(self.run_dir).trained, kept)
        return kept

    # -- the ways a step ends ---------------------------------------------------
    def completed(self, figures: dict[str, Any], *, batch: int) -> dict[str, Any]:
        """Training (and the post-train stage) finished: ``figures`` are the measurements."""
        return self._close("completed", "completed", figures, batch=batch, cause="completed")

    def failed(
        self,
        error: str,
        figures: dict[str, Any] | None = None,
        *,
        batch: int | None = None,
        cause: str | None = None,
        suspects: list[str] | None = None,
        status: str = "failed",
    ) -> dict[str, Any]:
        """The step failed: ``error`` says why (one line). Under a supervisor the status is
        ``interrupted`` until it has decided whether the run goes on."""
        if suspects:
            self.current.suspects = sorted(set(suspects))
        return self._close(status, "failed", {**(figures or {}), "error": error}, batch=batch, cause=cause)

    def stopped(
        self,
        figures: dict[str, Any],
        *,
        batch: int,
        cause: str | None,
        status: str = "interrupted",
        error: str | None = None,
    ) -> dict[str, Any]:
        """The step stopped on a signal (or a request) after saving a checkpoint."""
        return self._close(status, "stopped", {**figures, "error": error}, batch=batch, cause=cause)

    def _close(
        self, status: str, state: str, figures: dict[str, Any], *, batch: int | None, cause: str | None
    ) -> dict[str, Any]:
        a = self.current
        a.state, a.ended_at = state, world.time()
        if cause is not None:
            a.cause = cause
        if figures.get("error"):
            a.error = str(figures["error"])
        if batch is not None:
            a.last_batch = batch
        self.attempts.save()
        # the training kept so far, not results.json: an attempt killed after training wrote none
        earlier = kept_training(self.run_dir)
        results = skeleton(self.plan, status)
        results.update(self.info)
        results.update({k: v for k, v in figures.items() if v is not None or k not in results})
        carry_training(results, earlier, a.resumed_at_batch)
        if results.get("batches_done") is None and batch is not None:
            results["batches_done"] = batch
        results.update(self.attempts.summary())
        results["finished_at"] = world.time()
        write_results(self.run_dir, results)
        self._keep(results, earlier)
        return results
