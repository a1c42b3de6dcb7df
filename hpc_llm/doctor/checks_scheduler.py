"""``hpc-llm doctor``'s checks of where the job would go: Slurm answers, the partition holds
the job, ``sbatch --test-only`` accepts it, its time limit, the nodes that are up, their GPUs
(GRES). Pure: facts and needs in, a row out.
"""

from __future__ import annotations

from hpc_llm.doctor.facts import Facts, Needs
from hpc_llm.doctor.row import FAIL, OK, WARN, Row
from hpc_llm.errors import ConfigError
from hpc_llm.slurm import parse, query

#: node states in which a node runs jobs (sinfo %T, without its flags)
USABLE_STATES = ("idle", "mixed", "allocated", "completing", "planned", "reserved")


def gres_text(gpus: list[tuple[str | None, int]]) -> str:
    return ",".join(f"gpu:{k}:{n}" if k else f"gpu:{n}" for k, n in gpus) or "no GPUs"


def hhmmss(s: int | None) -> str:
    if s is None:
        return "UNLIMITED"
    from hpc_llm.launch.sbatch.spec import slurm_time

    return slurm_time(s)


def check_slurm(facts: Facts, needs: Needs, part: str | None) -> Row:
    c = facts.config
    host = next((v for k, v in c.items() if k.startswith("SlurmctldHost")), "?")
    return Row(
        "Slurm",
        f"{c.get(parse.VERSION_KEY, '?')}, cluster {c.get('ClusterName', '?')}, slurmctld {host}",
        OK,
        "scontrol, sinfo and sbatch answer from this machine",
    )


def check_partition(facts: Facts, needs: Needs, part: str | None) -> Row:
    from hpc_llm.launch.sbatch import checks as submit_checks

    try:  # the submit path's own check; Needs has the resources it reads (nodes, tasks, CPUs)
        found = submit_checks.placement(dict(facts.partitions), needs.partition, needs, needs.resources_key)
    except ConfigError as exc:
        return Row("partition", needs.partition or "(default)", FAIL, f"{exc}: nothing can be submitted")
    value = f"{found.name}{' (default)' if found.default else ''}: {found.nodes} nodes x {found.cpus_per_node} CPUs"
    if found.state != "up":
        return Row(
            "partition",
            f"{value}, {found.state}",
            WARN,
            f"partition {found.name} is {found.state}: jobs queue there but do not start",
        )
    return Row(
        "partition",
        value,
        OK,
        f"holds {needs.nodes} node(s) x {needs.tasks_per_node * needs.cpus_per_task} CPUs, as asked",
    )


def check_spares(facts: Facts, needs: Needs, part: str | None) -> Row | None:
    """Spare nodes (resources.spare_nodes) need Slurm >= 23.02.6; no row when none are asked for."""
    from hpc_llm.launch.sbatch import checks as submit_checks

    if not needs.spare_nodes:
        return None
    version = facts.config.get(parse.VERSION_KEY)
    value = f"{needs.spare_nodes} beside {needs.nodes} training node(s), --no-kill"
    why = submit_checks.spares_refused(needs, needs.resources_key, version)
    if why:
        return Row("spare nodes", value, FAIL, f"{why}: nothing can be submitted")
    return Row(
        "spare nodes",
        value,
        OK,
        f"Slurm {version}: a dead or left-out node's rank goes to a warm spare in the same job, no requeue",
    )


def check_test_only(facts: Facts, needs: Needs, part: str | None) -> Row:
    if facts.test_only is None:
        return Row(
            "sbatch --test-only",
            f"accepted: {needs.asked}" if needs.asked else "accepted",
            OK,
            "the scheduler would run the job's batch script as rendered",
        )
    return Row("sbatch --test-only", "refused", FAIL, facts.test_only)


def check_time_limit(facts: Facts, needs: Needs, part: str | None) -> Row:
    if part is None:
        return Row("time limit", hhmmss(needs.time_s), WARN, "no partition to compare with")
    max_text = facts.partition_info.get(part, {}).get("MaxTime")
    limit = query.time_limit_s(max_text)
    value = f"{hhmmss(needs.time_s)} asked, MaxTime {max_text or '?'} on {part}"
    if limit is not None and needs.time_s > limit:
        return Row(
            "time limit",
            value,
            FAIL,
            f"{needs.resources_key}.time is longer than partition {part} allows: Slurm refuses the job or leaves it "
            f"pending (PartitionTimeLimit); set {needs.resources_key}.time={hhmmss(limit)} or less (a run "
            "saves and requeues itself at each limit) or ask your admin for a longer MaxTime",
        )
    return Row("time limit", value, OK, "at the limit the run saves, requeues itself and resumes")


def check_nodes(facts: Facts, needs: Needs, part: str | None) -> Row:
    mine = [n for n in facts.nodes if n.partition == part]
    if part is None or not mine:
        return Row("nodes", "-", WARN, "sinfo lists no node for this partition")
    shapes: dict[tuple[int, int], list[str]] = {}
    for n in mine:
        shapes.setdefault((n.cpus, n.mem_mb), []).append(n.name)
    value = "; ".join(f"{len(names)} x {cpus} CPUs, {mem} MB" for (cpus, mem), names in sorted(shapes.items()))
    usable = [n for n in mine if n.state.rstrip("*~#!%$@^-").lower() in USABLE_STATES]
    if len(usable) < needs.nodes:
        states = ", ".join(sorted({n.state for n in mine}))
        return Row(
            "nodes",
            f"{value} ({len(usable)} up)",
            WARN,
            f"only {len(usable)} of the {len(mine)} nodes of {part} are up ({states}): "
            f"a {needs.nodes}-node job waits until enough are back",
        )
    return Row("nodes", value, OK, f"{len(usable)} of {len(mine)} up")


def check_gres(facts: Facts, needs: Needs, part: str | None) -> Row:
    mine = [n for n in facts.nodes if n.partition == part]
    per_node = {n.name: n.gpus for n in mine}
    kinds: dict[str, int] = {}
    for gpus in per_node.values():
        text = gres_text(gpus)
        kinds[text] = kinds.get(text, 0) + 1
    value = "; ".join(f"{text} on {count} node(s)" for text, count in sorted(kinds.items())) or "-"
    key = f"{needs.resources_key}.gpus_per_node"
    if needs.gpus_per_node <= 0:
        if any(per_node.values()):
            return Row(
                "GPUs (GRES)",
                value,
                WARN,
                f"the nodes have GPUs but this config asks for none ({key}=0): the ranks train on CPUs; "
                "use a GPU cluster profile (cluster=h100, or one --write-profile writes)",
            )
        return Row("GPUs (GRES)", value, OK, f"none asked ({key}=0)")
    kind = needs.gpu_type
    enough = [
        name
        for name, gpus in per_node.items()
        if sum(n for k, n in gpus if kind is None or k == kind) >= needs.gpus_per_node
    ]
    asked = f"{needs.gpus_per_node} {kind} GPUs" if kind else f"{needs.gpus_per_node} GPUs"
    if len(enough) < needs.nodes:
        fix = (
            f"set {key} (and {needs.resources_key}.gpu_type) to what a node has"
            if kind
            else f"set {key} to what a node has"
        )
        return Row(
            "GPUs (GRES)",
            value,
            FAIL,
            f"the job asks for {asked} per node on {needs.nodes} node(s), but only {len(enough)} node(s) of "
            f"{part} have them ({key}={needs.gpus_per_node}"
            + (f", {needs.resources_key}.gpu_type={kind}" if kind else "")
            + f"): {fix}, or ask your admin to configure the GPUs as GRES (gres.conf)",
        )
    return Row("GPUs (GRES)", value, OK, f"{needs.nodes} node(s) x {asked} asked")
