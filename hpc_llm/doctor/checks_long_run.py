"""``hpc-llm doctor``'s checks of what a run that outlives one allocation relies on:
preemption that signals and requeues, GraceTime against a checkpoint save, requeue itself,
KillWait, the requeue delay, node-failure timeouts, accounting. Pure: facts and needs in, a
row out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpc_llm.doctor.facts import Facts, Needs
from hpc_llm.doctor.row import FAIL, OK, WARN, Row
from hpc_llm.slurm import parse

#: after SIGTERM the supervisor records the stop and asks for the requeue (its scontrol
#: calls time out after 10 s): KillWait shorter than this may SIGKILL it first
KILL_WAIT_MIN_S = 10
#: what a stop needs besides the save itself: the ranks exit, the supervisor records and requeues
#: (the dev cluster's 20 s GraceTime holds a tiny model's save and all of that)
STOP_MARGIN_S = 10


def leading_int(text: str | None, default: int = 0) -> int:
    """The number a setting starts with: ``10 sec`` -> 10, ``2`` -> 2; ``default`` for anything else."""
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else default


def listed(text: str | None) -> set[str]:
    """A comma-separated setting (SlurmctldParameters, AuthInfo) as its items, ``k=v`` kept whole."""
    if not text or text == "(null)":
        return set()
    return {item.strip() for item in text.split(",") if item.strip()}


@dataclass(frozen=True)
class Preemption:
    preemptable: bool
    mode: str
    #: who preempts it, or why nothing does
    why: str


def preemption_of(facts: Facts, part: str) -> Preemption:
    config = facts.config
    ptype = config.get("PreemptType", "preempt/none")
    cluster_mode = config.get("PreemptMode", "OFF").upper()
    info = facts.partition_info.get(part, {})
    mode = (info.get("PreemptMode") or cluster_mode).upper()
    if ptype in ("preempt/none", "", "(null)"):
        return Preemption(False, mode, "PreemptType=preempt/none: this cluster preempts no job")
    if cluster_mode == "OFF":
        return Preemption(False, "OFF", "PreemptMode=OFF cluster-wide: preemption is disabled")
    if mode == "OFF":
        return Preemption(False, mode, f"PreemptMode=OFF on partition {part}: its jobs are never preempted")
    if ptype == "preempt/partition_prio":
        tier = leading_int(info.get("PriorityTier"), 1)
        mine = {n.name for n in facts.nodes if n.partition == part}
        above = sorted(
            {
                n.partition
                for n in facts.nodes
                if n.name in mine
                and n.partition != part
                and leading_int(facts.partition_info.get(n.partition, {}).get("PriorityTier"), 1) > tier
            }
        )
        if not above:
            return Preemption(False, mode, f"no partition of a higher PriorityTier shares the nodes of {part}")
        return Preemption(True, mode, f"by jobs of partition {', '.join(above)}")
    return Preemption(True, mode, f"by {ptype}")


def check_preemption(facts: Facts, needs: Needs, part: str | None) -> Row:
    if part is None:
        return Row("preemption", "-", WARN, "no partition to look at")
    p = preemption_of(facts, part)
    value = f"PreemptType={facts.config.get('PreemptType', '?')}, PreemptMode={p.mode} on {part}"
    if not p.preemptable:
        return Row("preemption", value, OK, f"{p.why}: nothing to save for")
    modes = set(p.mode.split(","))
    if "REQUEUE" in modes:
        return Row("preemption", value, OK, f"preempted {p.why}: Slurm requeues the job, the run resumes")
    if "CANCEL" in modes:
        return Row(
            "preemption",
            value,
            FAIL,
            f"preempted {p.why}, a job is cancelled, not requeued: the run ends at its first preemption; ask your "
            f"admin for PreemptMode=REQUEUE on partition {part}, or use a partition that is not preempted "
            "(hydra.launcher.partition=...)",
        )
    return Row(
        "preemption",
        value,
        WARN,
        f"preempted {p.why}, a job is suspended in place with its memory held: the other nodes' collectives "
        f"may time out while it waits; PreemptMode=REQUEUE on partition {part} is what hpc_llm expects",
    )


def check_preempt_signal(facts: Facts, needs: Needs, part: str | None) -> Row:
    params = facts.config.get("SlurmctldParameters", "(null)")
    value = f"SlurmctldParameters={params}"
    if part is None or not preemption_of(facts, part).preemptable:
        return Row("preemption signal", value, OK, "not needed: the partition is not preempted")
    if needs.signal is None:
        return Row(
            "preemption signal",
            value,
            WARN,
            "fault.enabled=false: the job asks for no --signal, so a preemption stops it without a save",
        )
    if "preempt_send_user_signal" in listed(params):
        return Row(
            "preemption signal",
            value,
            OK,
            f"the job's --signal={needs.signal} comes at preemption too: the ranks save before GraceTime ends",
        )
    return Row(
        "preemption signal",
        value,
        FAIL,
        "preemption will kill without the --signal warning, so no checkpoint is saved (each preemption loses "
        "the work since the last periodic checkpoint): ask your admin for "
        "SlurmctldParameters=preempt_send_user_signal",
    )


def check_requeue(facts: Facts, needs: Needs, part: str | None) -> Row:
    setting = facts.config.get("JobRequeue", "1")
    value = f"JobRequeue={setting}"
    if setting.strip() == "1":
        return Row("requeue", value, OK, "batch jobs may be requeued (preemption, node failure, the time limit)")
    if needs.requeue:
        return Row("requeue", f"{value}, --requeue", OK, "not requeued by default, but hpc_llm's jobs ask --requeue")
    return Row(
        "requeue",
        value,
        FAIL,
        "jobs are not requeued: a preemption, node failure or time limit ends the run; "
        "submit with --requeue or ask your admin for JobRequeue=1",
    )


def check_grace_time(facts: Facts, needs: Needs, part: str | None) -> Row:
    info = facts.partition_info.get(part or "", {})
    grace = leading_int(info.get("GraceTime"), 0)
    save = "unknown" if needs.save_s is None else f"{_secs(needs.save_s)} ({needs.save_from})"
    value = f"GraceTime={grace} s on {part}; checkpoint save {save}"
    if part is None or not preemption_of(facts, part).preemptable:
        return Row("grace time", value, OK, "not needed: the partition is not preempted")
    if needs.save_s is None:
        return Row(
            "grace time",
            value,
            WARN,
            f"no checkpoint save time to compare with ({needs.save_from}); run once and pass --run RUN_DIR",
        )
    need = needs.save_s + STOP_MARGIN_S
    if grace < needs.save_s:
        return Row(
            "grace time",
            value,
            FAIL,
            f"a preempted job has {grace} s from the signal to SIGTERM, less than a checkpoint save takes: "
            "each preemption loses the work since the last periodic checkpoint; ask your admin for "
            f"GraceTime={need:.0f} or more on partition {part}",
        )
    if grace < need:
        return Row(
            "grace time",
            value,
            WARN,
            f"a save fits, but with {grace - needs.save_s:.0f} s left for the ranks to exit and the supervisor "
            f"to requeue ({STOP_MARGIN_S} s wanted); GraceTime={need:.0f} would be safe",
        )
    return Row("grace time", value, OK, "a preempted job has time to save its checkpoint")


def _secs(x: float) -> str:
    """A save time as a person reads it: ``45 s``, ``2.5 s``, ``under 0.1 s``."""
    return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s" if x >= 0.1 else "under 0.1 s"


def check_kill_wait(facts: Facts, needs: Needs, part: str | None) -> Row:
    wait = leading_int(facts.config.get("KillWait"), 30)
    value = f"KillWait={wait} s"
    if wait < KILL_WAIT_MIN_S:
        return Row(
            "kill wait",
            value,
            WARN,
            f"after SIGTERM (time limit, end of GraceTime) the supervisor has {wait} s before SIGKILL to record "
            "the stop and requeue the job; a killed supervisor leaves a job that hit its time limit ended, "
            f"not requeued; ask your admin for KillWait={KILL_WAIT_MIN_S} or more",
        )
    return Row("kill wait", value, OK, "time after SIGTERM for the supervisor to record the stop and requeue")


def check_requeue_delay(facts: Facts, needs: Needs, part: str | None) -> Row:
    expire = parse.cred_expire_s(facts.config)
    said = "AuthInfo" if any(i.startswith("cred_expire=") for i in listed(facts.config.get("AuthInfo"))) else "default"
    return Row(
        "requeue delay",
        f"cred_expire={expire} s ({said})",
        OK,
        f"a requeued job may start again {expire} s after it stopped, plus the scheduler's cycle",
    )


def check_node_failure(facts: Facts, needs: Needs, part: str | None) -> Row:
    timeout = leading_int(facts.config.get("SlurmdTimeout"), 300)
    value = f"SlurmdTimeout={timeout} s"
    hang = f"fault.hang_timeout_s={needs.hang_timeout_s:g}" if needs.hang_timeout_s else "no hang watch"
    if timeout == 0:
        return Row(
            "node failure",
            value,
            WARN,
            "a dead node is never marked DOWN by a timeout: its job is not requeued by Slurm and waits "
            f"for hpc_llm's hang watch ({hang}) to stop it",
        )
    return Row(
        "node failure",
        value,
        OK,
        f"a dead node is DOWN about {timeout} s after it stops answering; its job then ends NODE_FAIL and is "
        f"requeued without it ({hang} catches a hung step)",
    )


def check_accounting(facts: Facts, needs: Needs, part: str | None) -> Row:
    kind = facts.config.get("AccountingStorageType", "accounting_storage/none")
    age = leading_int(facts.config.get("MinJobAge"), 300)
    value = f"{kind}, MinJobAge={age} s"
    if kind.endswith("/none"):
        return Row(
            "accounting",
            value,
            WARN,
            "no Slurm accounting: hpc-llm status and report work from squeue and the runs' own files, without "
            "each attempt's Slurm state (PREEMPTED, NODE_FAIL, ...) or GPU-hours, and a job that died before "
            f"writing anything is shown as ENDED once slurmctld forgets it ({age} s); ask your admin for "
            "AccountingStorageType=accounting_storage/slurmdbd",
        )
    if facts.accounting is not None:
        return Row(
            "accounting",
            value,
            WARN,
            f"sacct does not answer ({facts.accounting}): status and report fall back to squeue and the runs' "
            "own files until it does",
        )
    return Row("accounting", f"{value}, sacct answers", OK, "status and report show every attempt Slurm ran")
