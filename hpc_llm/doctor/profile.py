"""``hpc-llm doctor --write-profile NAME``: a cluster profile from what doctor found.

The profile has the schema of ``conf/cluster/*.yaml`` (``cluster:`` and the per-node
``resources:`` of a GPU profile, as ``conf/cluster/h100.yaml``): the partition, the
user's default account and QOS (``sacctmgr``, with accounting), GPUs per node and their
type (GRES, ``nvidia-smi -L`` from the probe), CPUs and memory per node, the time
limit under MaxTime. What doctor cannot know (node-local scratch) is a commented line
to fill in. Where srun loads NVIDIA's pyxis and doctor checked an image (``--image``), the
profile makes pyxis the site's container with that image (``conf/config.yaml`` picks the
``container`` group before the ``cluster`` one, so a profile's ``override /container: pyxis``
wins, and ``container=...`` on the command line still wins over it); with pyxis and no image,
comment lines say how to run in one.

It goes to ``<dir>/cluster/NAME.yaml``, ``dir`` by default :func:`hpc_llm.config.site.user_dir`,
where ``cluster=NAME`` finds it; it is checked by composing ``cluster=NAME`` from a copy before it
is put in place (atomically), and an existing profile is replaced only with ``--force``. Login
node only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpc_llm.config.compose import compose
from hpc_llm.config.site import user_dir
from hpc_llm.errors import ConfigError
from hpc_llm.launch.sbatch.spec import slurm_time
from hpc_llm.slurm import parse, query

NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: what a GPU profile passes by name (as conf/cluster/h100.yaml)
ENV_PASSTHROUGH = (
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "HF_TOKEN",
)
#: a profile's default time limit when MaxTime allows more (a run requeues itself at each limit)
DEFAULT_TIME_S = 24 * 3600


def target(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """``<dir>/cluster/<name>.yaml``; a name hpc_llm's own profiles have is refused (it would win)."""
    from hpc_llm.paths import conf_dir

    if not NAME_OK.match(name) or name.endswith(".yaml"):
        raise ConfigError(f"--write-profile {name!r}: a profile name is letters, digits, '_', '-' and '.'")
    if (conf_dir() / "cluster" / f"{name}.yaml").is_file():
        own = sorted(p.stem for p in (conf_dir() / "cluster").glob("*.yaml"))
        raise ConfigError(
            f"--write-profile {name}: hpc_llm has a profile of that name, which cluster={name} would pick "
            f"instead of yours; pick another (hpc_llm's: {', '.join(own)})"
        )
    base = Path(directory).expanduser() if directory else user_dir()
    return base.resolve() / "cluster" / f"{name}.yaml"


def peak_flops(kind: str) -> tuple[float, str] | None:
    """Peak dense bf16 FLOP/s of a GPU named by a GRES type (``h100``) or ``nvidia-smi -L``
    (``NVIDIA H100 80GB HBM3``), and which it was taken as; None for one not known."""
    from hpc_llm.config.flops import PEAK_FLOPS

    text = kind.lower()
    if "h100" in text:
        key = "h100-pcie" if "pcie" in text else "h100-sxm"
    elif "h200" in text:
        key = "h200"
    elif "a100" in text:
        key = "a100"
    else:
        return None
    return PEAK_FLOPS[key], key


def _yaml(value: Any) -> str:
    """A scalar as YAML (strings quoted: JSON strings are YAML)."""
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def build(
    name: str,
    *,
    config: Mapping[str, str],
    partition: str,
    partition_info: Mapping[str, str],
    nodes: Sequence[parse.Node],
    assoc: parse.Associations | None,
    gpu_model: str | None = None,
    pyxis: bool | None = None,
    enroot: str = "",
    image: str | None = None,
) -> str:
    """The profile's YAML text, with comments saying where each value came from. ``config``:
    ``scontrol show config``; ``partition_info``: the partition's ``scontrol show partition``
    fields; ``nodes``: sinfo's nodes (those of ``partition`` are read); ``gpu_model``: what
    ``nvidia-smi -L`` said on a node; ``pyxis``: whether srun loads pyxis, ``enroot``: what the
    probe saw of enroot (``enroot 3.5.0 on n1``), ``image``: the pyxis image doctor checked."""
    nodes = [n for n in nodes if n.partition == partition]
    if not nodes:
        raise ConfigError(f"sinfo lists no node in partition {partition}: no profile to write")
    per_node = min(n.gpu_count for n in nodes)
    kinds = sorted({k for n in nodes for k, _c in n.gpus if k})
    cpus = min(n.cpus for n in nodes)
    mem = min(n.mem_mb for n in nodes)
    max_text = partition_info.get("MaxTime", "UNLIMITED")
    limit = query.time_limit_s(max_text)
    model = gpu_model
    peak = peak_flops(model or (kinds[0] if len(kinds) == 1 else ""))
    when = time.strftime("%Y-%m-%d")
    lines = [
        "# @package _global_",
        f"# Cluster profile '{name}', written by `hpc-llm doctor --write-profile {name}` on {when} from",
        f"# Slurm cluster {config.get('ClusterName', '?')} (Slurm {config.get(parse.VERSION_KEY, '?')}), "
        f"partition {partition}: {len(nodes)} node(s),",
        f"# {cpus} CPUs and {mem} MB each, GRES {', '.join(sorted({n.gres for n in nodes}))}, MaxTime {max_text}.",
        f"# Use it with cluster={name}; read it through before the first long run.",
        *pyxis_lines(name, pyxis, enroot, image),
        *(["defaults:", "  - override /container: pyxis"] if pyxis and image else []),
        "cluster:",
        f"  name: {_yaml(name)}",
        f"  device: {'gpu' if per_node else 'cpu'}",
        f"  partition: {_yaml(partition)}",
    ]
    if assoc is not None and (assoc.default_account or assoc.accounts):
        account = assoc.default_account or assoc.accounts[0]
        others = [a for a in assoc.accounts if a != account]
        lines.append(f"  account: {_yaml(account)}" + (f"  # also yours: {', '.join(others)}" if others else ""))
    else:
        lines.append("  # account: ...   # no Slurm accounting answered: the cluster's default is used")
    if assoc is not None and (assoc.default_qos or len(assoc.qos) == 1):
        qos = assoc.default_qos or assoc.qos[0]
        others = [q for q in assoc.qos if q != qos]
        lines.append(f"  qos: {_yaml(qos)}" + (f"  # also allowed: {', '.join(others)}" if others else ""))
    elif assoc is not None and assoc.qos:
        lines.append(f"  # qos: ...   # no default QOS; yours: {', '.join(assoc.qos)}")
    lines += [
        f"  exclusive: {'true' if per_node else 'false'}",
        "  # Node-local scratch for each rank's working directory (never a shared filesystem);",
        "  # doctor cannot tell which disk that is: set it, else $TMPDIR or /tmp is used.",
        "  # scratch: /local/scratch",
    ]
    if peak is not None:
        lines.append(f"  peak_flops_per_gpu: {peak[0]:.4g}  # {peak[1]}, dense bf16 (hpc-llm estimate)")
    elif per_node:
        what = model or (", ".join(kinds) if kinds else "GRES without a type")
        lines.append(f"  # peak_flops_per_gpu: ...   # GPU {what}: its dense bf16 FLOP/s, for hpc-llm estimate")
    lines.append(f"  env_passthrough: [{', '.join(ENV_PASSTHROUGH)}]")
    lines.append("resources:")
    if per_node:
        lines += [
            f"  tasks_per_node: {per_node}  # one rank per GPU",
            f"  gpus_per_node: {per_node}  # {gres_note(kinds, model)}",
        ]
        if len(kinds) == 1 and _has_gpu_type():
            lines.append(f"  gpu_type: {_yaml(kinds[0])}  # the GRES type: --gpus-per-node={kinds[0]}:{per_node}")
        lines.append(f"  cpus_per_task: {max(1, cpus // per_node)}  # {cpus} CPUs per node")
    else:
        lines += [
            "  gpus_per_node: 0",
            f"  # tasks_per_node x cpus_per_task may use up to {cpus} CPUs per node",
        ]
    lines.append(f"  # mem_per_node: \"0\"   # all of a node's memory ({mem} MB); unset: the partition's default")
    time_s = DEFAULT_TIME_S if limit is None else min(limit, DEFAULT_TIME_S)
    lines.append(f"  time: {_yaml(slurm_time(time_s))}  # MaxTime {max_text}; a run requeues itself at each limit")
    if peak is not None:
        lines += ["train:", "  precision: amp_bf16"]
    if pyxis and image:
        lines += ["container:", f"  image: {_yaml(image)}  # checked by doctor; container.image=... picks another"]
    return "\n".join(lines) + "\n"


def pyxis_lines(name: str, pyxis: bool | None, enroot: str, image: str | None) -> list[str]:
    """Comment lines on running in an enroot image, where srun loads pyxis (none otherwise)."""
    if not pyxis:
        return []
    found = f"# Containers: srun loads NVIDIA's pyxis ({enroot or 'enroot not checked'})"
    if image:
        return [
            f"{found}: every rank runs in the image doctor",
            f"# checked (docs/guides/containers.md); cluster={name} container=none runs without it.",
        ]
    return [
        f"{found}, so each rank can run in an enroot",
        f"# image: cluster={name} container=pyxis container.image=/shared/images/IMAGE.sqsh (docs/guides/",
        "# containers.md); `hpc-llm doctor container=pyxis container.image=IMAGE --write-profile NAME`",
        "# makes it this profile's default.",
    ]


def _has_gpu_type() -> bool:
    """Whether hpc_llm's resources take a GPU type (``resources.gpu_type``)."""
    from hpc_llm.config.schema import ResourcesConfig

    return "gpu_type" in ResourcesConfig.__dataclass_fields__


def gres_note(kinds: Sequence[str], model: str | None) -> str:
    if model:
        return model
    return f"GRES type {', '.join(kinds)}" if kinds else "GRES without a type"


def write(
    name: str,
    text: str,
    directory: str | os.PathLike[str] | None,
    *,
    force: bool,
) -> Path:
    """Check that ``cluster=<name>`` composes from ``text``, then put it in place atomically;
    an existing profile is refused unless ``force``."""
    final = target(name, directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".hpc_llm-profile-", dir=final.parent))
    try:
        copy = staging / "cluster" / final.name
        copy.parent.mkdir()
        copy.write_text(text)
        try:
            compose([f"cluster={name}", f"hydra.searchpath=[file://{staging}]"])
        except Exception as exc:  # noqa: BLE001 - the one line of whatever went wrong
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"the profile doctor wrote for {name} does not compose ({first}); nothing written")
        if force:
            os.replace(copy, final)
        else:
            try:
                os.link(copy, final)  # refuses to replace a profile that appeared meanwhile
            except FileExistsError:
                raise ConfigError(f"profile {final} exists already; pass --force to replace it") from None
        return final
    finally:
        shutil.rmtree(staging, ignore_errors=True)
