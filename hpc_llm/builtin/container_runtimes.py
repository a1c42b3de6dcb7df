"""Built-in container runtimes: ``none`` (the node's Python), ``apptainer`` and ``pyxis``.

With ``container=apptainer`` every srun task runs::

    apptainer exec [--nv] --bind <run dir> --bind <data> ... IMAGE python3 -u -m <entrypoint>

Binds are identity binds (same path inside and out), so every path in the
config means the same thing in the container. Ranks come from the SLURM_*
variables srun sets per task and MASTER_ADDR/PORT exported by the batch
script; Apptainer passes the host environment into the container by default,
which is why ``--cleanenv`` is refused. Secrets are passed by name through
``APPTAINERENV_<NAME>`` (Apptainer sets NAME inside from it): ``--env`` takes
NAME=VALUE, which would put the value on the command line (``ps``, logs).

With ``container=pyxis`` (NVIDIA's SPANK plugin; enroot runs the container) the batch script
exports pyxis's own variables, ``PYXIS_CONTAINER_IMAGE``, ``PYXIS_CONTAINER_MOUNTS``,
``PYXIS_CONTAINER_WORKDIR`` and ``PYXIS_CONTAINER_ENV``, which srun and slurmstepd read as
``--container-image`` and the rest: every srun step the job starts, the agent step and any
step a supervisor starts later (a restart, a swap, an agent that took the supervisor's place),
starts its tasks in the image, and the task command is the image's ``python3 -u -m ...``
unwrapped. Variables rather than srun options, because the mounts are only known on the node:
``$TMPDIR``, where the ranks work, is mounted when it is set there. pyxis passes the job's
environment into the container (the image's own values win, except for the names in
``PYXIS_CONTAINER_ENV``: ``container.env_passthrough``), so secrets pass by name through
sbatch's ``--export`` list, never by value.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import struct
from pathlib import Path

from omegaconf import DictConfig

from hpc_llm import hookimpl
from hpc_llm.config.plan import JobPlan
from hpc_llm.errors import ConfigError, warn_once
from hpc_llm.plugins.base import Bind, ContainerRuntime, Mounts

#: flags hpc_llm sets itself, or that would break the task (see module docstring)
REFUSED_FLAGS = {
    "--cleanenv": "it drops the SLURM_* rank variables and MASTER_ADDR srun gives each task",
    "-e": "it is --cleanenv, which drops the SLURM_* rank variables and MASTER_ADDR srun gives each task",
    "--containall": "it implies --cleanenv, which drops the SLURM_* rank variables srun gives each task",
    "-C": "it is --containall, which implies --cleanenv and drops the SLURM_* rank variables",
    "--nv": "set container.gpus (default: on when cluster.device=gpu)",
    "--bind": "list binds in container.binds",
    "-B": "list binds in container.binds",
    "--env": "pass variables by name with container.env_passthrough",
}
BIND_OPTIONS = ("ro", "rw")


def parse_bind(text: str) -> Bind:
    parts = str(text).split(":")
    if not parts[0] or len(parts) > 3:
        raise ConfigError(f"container.binds: {text!r} is not a bind; allowed: SRC, SRC:DEST or SRC:DEST:ro|rw")
    source = parts[0]
    dest = parts[1] if len(parts) > 1 and parts[1] else source
    mode = parts[2] if len(parts) > 2 else "rw"
    if mode not in BIND_OPTIONS:
        raise ConfigError(f"container.binds: {text!r} has mode {mode!r}; allowed: {', '.join(BIND_OPTIONS)}")
    for what, path in (("source", source), ("destination", dest)):
        if not path.startswith("/"):
            raise ConfigError(f"container.binds: {text!r}: the {what} must be an absolute path")
    return Bind(os.path.normpath(source), os.path.normpath(dest), mode)


def all_binds(section: DictConfig, mounts: Mounts) -> list[Bind]:
    """The automatic identity binds plus the user's, deduplicated; conflicts are an error."""
    binds = [Bind(mounts.run_dir, mounts.run_dir, origin="the run directory")]
    binds += [Bind(os.path.normpath(p.path), os.path.normpath(p.path), origin=p.purpose) for p in mounts.paths]
    if mounts.scratch:
        binds.append(Bind(mounts.scratch, mounts.scratch, origin="cluster.scratch"))
    binds += [parse_bind(b) for b in section.binds or []]
    by_dest: dict[str, Bind] = {}
    out: list[Bind] = []
    for b in binds:
        seen = by_dest.get(b.dest)
        if seen is None:
            by_dest[b.dest] = b
            out.append(b)
        elif (seen.source, seen.mode) != (b.source, b.mode):
            raise ConfigError(
                f"container.binds: conflicting binds for {b.dest} in the container: "
                f"{seen.spec()} ({seen.origin}) and {b.spec()} ({b.origin}); keep one"
            )
    # an automatic identity bind inside another identity bind adds nothing
    identity = [b.source for b in out if b.source == b.dest and b.mode == "rw"]
    out = [
        b
        for b in out
        if b.origin == "container.binds"
        or not (b.source == b.dest and b.mode == "rw")
        or not any(b.source != p and b.source.startswith(p.rstrip("/") + "/") for p in identity)
    ]
    # a parent bound after a child would hide it: mount parents first
    return sorted(out, key=lambda b: (b.dest.count("/"), b.dest))


#: a SIF file: a launch line (32 bytes), then this magic; then the global header, whose
#: data offset and size (little-endian int64 at 112 and 120) say how long the file is
SIF_MAGIC = b"SIF_MAGIC"
SQUASHFS_MAGIC = b"hsqs"
IMAGE_KINDS = "a .sif file, a squashfs image or a sandbox directory (build one with hpc-llm container build)"


def image_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an Apptainer image, or None.

    Hand-written because neither spython nor the apptainer CLI says this without
    starting a container (``apptainer inspect`` needs apptainer on the login
    node); reading a header catches a wrong file and a truncated copy before
    every node of a job fails on it.
    """
    if path.is_dir():
        if not (path / ".singularity.d").is_dir():
            return f"is a directory but not an Apptainer sandbox (it has no .singularity.d); allowed: {IMAGE_KINDS}"
        return None
    with open(path, "rb") as f:
        head = f.read(128)
    if head[32 : 32 + len(SIF_MAGIC)] == SIF_MAGIC and len(head) == 128:
        data_offset, data_size = struct.unpack_from("<2q", head, 112)
        size = path.stat().st_size
        if size < data_offset + data_size:
            return f"is a truncated SIF image: its header says {data_offset + data_size} bytes, the file has {size}"
        return None
    if head.startswith(SQUASHFS_MAGIC):
        return None
    return f"is not an Apptainer image (no SIF or squashfs header); allowed: {IMAGE_KINDS}"


def staged_image(section: DictConfig, mounts: Mounts) -> str:
    """Where ``container.stage=true`` copies the image on each node."""
    digest = hashlib.sha1(str(Path(section.image).resolve()).encode()).hexdigest()[:12]
    base = mounts.scratch or "/tmp"
    return f"{base}/hpc_llm-image-{digest}{Path(section.image).suffix or '.sif'}"


class NoContainer(ContainerRuntime):
    name = "none"
    description = "no container: tasks run on the node's Python"


class Apptainer(ContainerRuntime):
    name = "apptainer"
    description = "apptainer exec [--nv] --bind ... IMAGE (a .sif on a shared filesystem)"

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        image = section.image
        if not image:
            raise ConfigError("container.image is required for container=apptainer (path of a .sif image)")
        if "://" in str(image):
            raise ConfigError(
                f"container.image={image!r}: a registry URI would be pulled by every node; "
                "allowed: a local .sif file or sandbox directory (build one with hpc-llm container build)"
            )
        for flag in section.flags or []:
            bare = str(flag).split("=", 1)[0]
            if bare in REFUSED_FLAGS:
                raise ConfigError(f"container.flags: {flag!r} is not allowed: {REFUSED_FLAGS[bare]}")
        binds = [parse_bind(b) for b in section.binds or []]
        if os.path.isdir("/.singularity.d"):
            # a rank re-resolving its job inside the container: the image and the bind
            # sources are host paths, checked before submitting and by apptainer itself
            return
        path = Path(image).expanduser()
        if not path.exists():
            raise ConfigError(f"container.image={str(image)!r} does not exist")
        if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
            raise ConfigError(f"container.image={str(image)!r} is not readable by this user")
        problem = image_problem(path)
        if problem:
            raise ConfigError(f"container.image={str(image)!r} {problem}")
        if section.stage and path.is_dir():
            raise ConfigError(
                f"container.stage=true copies one image file to each node; container.image={str(image)!r} "
                "is a sandbox directory: build a .sif from it (apptainer build X.sif DIR) or set container.stage=false"
            )
        for bind in binds:
            if not os.path.exists(bind.source):
                raise ConfigError(f"container.binds: bind source {bind.source!r} does not exist")
        if shutil.which(section.executable) is None:
            warn_once(
                f"'{section.executable}' is not on PATH here; the job checks for it on every node "
                "before training (container.check)"
            )

    def _image(self, section: DictConfig, mounts: Mounts) -> str:
        return staged_image(section, mounts) if section.stage else str(Path(section.image).expanduser().resolve())

    def _gpus(self, section: DictConfig, mounts: Mounts) -> bool:
        return mounts.gpus if section.gpus is None else bool(section.gpus)

    def exec_prefix(self, section: DictConfig, mounts: Mounts) -> list[str]:
        cmd = [str(section.executable), "exec"]
        if self._gpus(section, mounts):
            cmd.append("--nv")
        for bind in all_binds(section, mounts):
            cmd += ["--bind", bind.spec()]
        cmd += [str(f) for f in section.flags or []]
        cmd.append(self._image(section, mounts))
        return cmd

    def wrap(self, section: DictConfig, mounts: Mounts, command: list[str]) -> list[str]:
        return [*self.exec_prefix(section, mounts), *command]

    def binds(self, section: DictConfig, mounts: Mounts) -> list[Bind]:
        return all_binds(section, mounts)

    def script_lines(self, section: DictConfig, mounts: Mounts, passthrough: list[str]) -> list[str]:
        lines: list[str] = []
        created = [p.path for p in mounts.paths if p.created_by_job]
        if created:
            lines += [
                "# bind sources the job writes to must exist before apptainer starts",
                f"mkdir -p {' '.join(shlex.quote(p) for p in created)}",
            ]
        if passthrough:
            lines.append("# by name into the container: Apptainer sets NAME from APPTAINERENV_NAME")
            lines += [f'if [ -n "${{{n}+x}}" ]; then export APPTAINERENV_{n}="${{{n}}}"; fi' for n in passthrough]
        # what each rank records in results.json (hpc_llm.job.rank.measure): the runtime's
        # version, which is not visible from inside the container otherwise
        exe = shlex.quote(str(section.executable))
        lines.append(f'export APPTAINERENV_HPC_LLM_APPTAINER_VERSION="$({exe} --version 2>/dev/null || true)"')
        per_node = '--nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --export=ALL'
        if mounts.scratch is None:
            lines += [
                "# ranks work in $TMPDIR when it is set (hpc_llm.job.rank.task): bind it too",
                'if [ -n "${TMPDIR:-}" ]; then '
                'export APPTAINER_BINDPATH="${APPTAINER_BINDPATH:+$APPTAINER_BINDPATH,}$TMPDIR"; fi',
            ]
        if section.stage:
            src = str(Path(section.image).expanduser().resolve())
            dst = self._image(section, mounts)
            # copy under a name private to this job and node, then rename: a job still
            # running from the staged image keeps its (old) file, and a "local" scratch
            # that is in fact shared (or a dev cluster's one disk) sees no two copies collide
            tmp = f'{shlex.quote(dst)}."$SLURM_JOB_ID.$SLURMD_NODENAME"'
            copy = (
                f"mkdir -p {shlex.quote(os.path.dirname(dst))} && cp -f {shlex.quote(src)} {tmp} "
                f"&& mv -f {tmp} {shlex.quote(dst)}"
            )
            lines += [
                "# stage the image on every node's local disk (container.stage=true)",
                f"srun {per_node} --kill-on-bad-exit=1 bash -c {shlex.quote(copy)}",
            ]
        if section.check:
            probe = shlex.join([*self.exec_prefix(section, mounts), str(section.python), "-c", "import hpc_llm"])
            node = "${SLURMD_NODENAME:-$(hostname)}"
            inner = (
                f'command -v {exe} >/dev/null || {{ echo "hpc_llm: {section.executable} not found on {node}" >&2; '
                f"exit 1; }}; out=$({probe} 2>&1) || "
                f'{{ echo "hpc_llm: container check failed on {node}: $out" >&2; exit 1; }}; '
                f'echo "hpc_llm: container check ok on {node}"'
            )
            lines += [
                "# one quick exec per node before training; a node that fails is named",
                f"srun {per_node} --kill-on-bad-exit=0 bash -c {shlex.quote(inner)} || "
                '{ echo "hpc_llm: container check failed; not training" >&2; exit 1; }',
            ]
        return lines


#: a squashfs superblock: magic, then (little-endian u64 at 40) the bytes the image uses
SQUASHFS_BYTES_USED_AT = 40
PYXIS_IMAGES = (
    "a squashfs file (a path starting with / or ., as pyxis reads it) or a registry reference in enroot's syntax, "
    "[USER@][REGISTRY#]IMAGE[:TAG|@sha256:DIGEST] (nvcr.io#nvidia/pytorch:24.05-py3)"
)
#: enroot's docker:// URI, as src/docker.sh (docker::_parse_uri) matches it: ported because enroot
#: says nothing before a node pulls (and the login node may have no enroot); pyxis prefixes
#: docker:// to a reference without a scheme
_ENROOT_USER = r"[A-Za-z0-9_.!~*'()%;:&=+$,@-]+"
_ENROOT_IMAGE = r"[a-z0-9/._-]+"
_ENROOT_TAG = r"[A-Za-z0-9._:-]+"
_ENROOT_DIGEST = r"sha256:[A-Za-z0-9]+"
_ENROOT_URI = re.compile(
    rf"^(?:{_ENROOT_USER}@)?(?:[^#/@]+#)?{_ENROOT_IMAGE}(?::{_ENROOT_TAG})?(?:@{_ENROOT_DIGEST})?$"
)
#: pyxis options hpc_llm sets itself (each from a key), or that would break the job
PYXIS_REFUSED_FLAGS = {
    "--container-image": "set container.image",
    "--container-mounts": "list mounts in container.binds",
    "--container-workdir": "the tasks work in the run directory, which hpc_llm mounts",
    "--container-env": "list the names in container.env_passthrough",
    "--container-name": "a named container outlives the step and its job on every node; hpc_llm does not remove it",
    "--container-save": "every task of every step would write the image back",
}
#: the pyxis options a job may add (container.flags), as pyxis's environment variables
PYXIS_FLAGS = {
    "--container-writable": ("PYXIS_CONTAINER_WRITABLE", "1"),
    "--container-readonly": ("PYXIS_CONTAINER_READONLY", "1"),
    "--container-remap-root": ("PYXIS_CONTAINER_REMAP_ROOT", "1"),
    "--no-container-remap-root": ("PYXIS_CONTAINER_REMAP_ROOT", "0"),
    "--container-mount-home": ("PYXIS_CONTAINER_MOUNT_HOME", "1"),
    "--no-container-mount-home": ("PYXIS_CONTAINER_MOUNT_HOME", "0"),
    "--container-entrypoint": ("PYXIS_CONTAINER_ENTRYPOINT", "1"),
    "--no-container-entrypoint": ("PYXIS_CONTAINER_ENTRYPOINT", "0"),
}


def is_registry_reference(image: str) -> bool:
    """pyxis's own rule: an image that does not start with / or . is no file but a reference."""
    return not image.startswith(("/", ".", "~"))


def registry_problem(image: str) -> str | None:
    """Why ``image`` is no registry reference enroot can pull, or None."""
    ref = image
    for scheme in ("docker://", "dockerd://"):
        if ref.startswith(scheme):
            ref = ref[len(scheme) :]
            break
    else:
        if "://" in ref:
            return f"has a scheme enroot does not pull from; allowed: {PYXIS_IMAGES}"
    head = ref.split("#", 1)[0] if "#" in ref else ""
    first = ref.split("/", 1)[0]
    if "#" not in ref and "/" in ref and ("." in first or ":" in first or first == "localhost"):
        # docker's REGISTRY/IMAGE: enroot reads it as an image of Docker Hub named so
        return f"names a registry the docker way; enroot separates it with '#': {first}#{ref.split('/', 1)[1]}"
    if not _ENROOT_URI.match(ref) or (head and not head.split("@")[-1]):
        return f"is not a registry reference enroot reads; allowed: {PYXIS_IMAGES}"
    return None


def squashfs_problem(path: Path) -> str | None:
    """Why ``path`` is no squashfs image enroot can unpack, or None (a wrong file or a truncated
    copy found here, before every node of a job fails on it)."""
    if path.is_dir():
        return f"is a directory; allowed: {PYXIS_IMAGES} (make one from it with mksquashfs DIR IMAGE.sqsh)"
    with open(path, "rb") as f:
        head = f.read(96)
    if not head.startswith(SQUASHFS_MAGIC) or len(head) < SQUASHFS_BYTES_USED_AT + 8:
        return f"is not a squashfs image (no squashfs superblock); allowed: {PYXIS_IMAGES}"
    (used,) = struct.unpack_from("<Q", head, SQUASHFS_BYTES_USED_AT)
    size = path.stat().st_size
    if size < used:
        return f"is a truncated squashfs image: its superblock says {used} bytes, the file has {size}"
    return None


def pyxis_mounts(section: DictConfig, mounts: Mounts) -> str:
    """``--container-mounts``'s value: the automatic identity mounts and the user's, parents
    first (:func:`all_binds`); pyxis's flags take ``+`` between them."""
    specs = []
    for bind in all_binds(section, mounts):
        if bind.source == bind.dest and bind.mode == "rw":
            specs.append(bind.source)
        else:
            specs.append(f"{bind.source}:{bind.dest}:{bind.mode}")
    for spec in specs:
        if "," in spec:
            raise ConfigError(f"container.binds: {spec!r}: pyxis separates mounts with ',', so no path may hold one")
    return ",".join(specs)


class Pyxis(ContainerRuntime):
    name = "pyxis"
    description = (
        "srun --container-image=IMAGE --container-mounts=... (NVIDIA pyxis + enroot; a squashfs or a registry image)"
    )

    def validate(self, section: DictConfig, plan: JobPlan) -> None:
        image = str(section.image or "")
        if not image:
            raise ConfigError(f"container.image is required for container=pyxis; allowed: {PYXIS_IMAGES}")
        for flag in section.flags or []:
            bare = str(flag).split("=", 1)[0]
            if bare in PYXIS_REFUSED_FLAGS:
                raise ConfigError(f"container.flags: {flag!r} is not allowed: {PYXIS_REFUSED_FLAGS[bare]}")
            if bare not in PYXIS_FLAGS or "=" in str(flag):
                raise ConfigError(
                    f"container.flags: {flag!r} is not a pyxis flag hpc_llm passes; allowed: {', '.join(PYXIS_FLAGS)}"
                )
        if section.stage:
            raise ConfigError(
                "container.stage=true: pyxis unpacks the image onto each node's own disk at every step already; "
                "allowed: false"
            )
        if section.gpus is not None:
            raise ConfigError(
                f"container.gpus={section.gpus}: with pyxis, enroot's nvidia hook gives each task the GPUs Slurm "
                "allots it (the image's NVIDIA_VISIBLE_DEVICES); allowed: null"
            )
        for name in section.env_passthrough or []:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
                raise ConfigError(f"container.env_passthrough: {name!r} is not a variable name")
        binds = [parse_bind(b) for b in section.binds or []]
        if is_registry_reference(image):
            problem = registry_problem(image)
            if problem:
                raise ConfigError(f"container.image={image!r} {problem}")
            return
        if os.environ.get("PYXIS_CONTAINER_IMAGE"):
            # a rank re-resolving its job inside the container: the image and the mount
            # sources are host paths, checked before submitting and by pyxis itself
            return
        path = Path(image).expanduser()
        if not path.exists():
            raise ConfigError(f"container.image={image!r} does not exist; allowed: {PYXIS_IMAGES}")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"container.image={image!r} is not readable by this user")
        problem = squashfs_problem(path)
        if problem:
            raise ConfigError(f"container.image={image!r} {problem}")
        for bind in binds:
            if not os.path.exists(bind.source):
                raise ConfigError(f"container.binds: bind source {bind.source!r} does not exist")

    def _image(self, section: DictConfig) -> str:
        image = str(section.image)
        return image if is_registry_reference(image) else str(Path(image).expanduser().resolve())

    def binds(self, section: DictConfig, mounts: Mounts) -> list[Bind]:
        return all_binds(section, mounts)

    def wrap(self, section: DictConfig, mounts: Mounts, command: list[str]) -> list[str]:
        # srun starts the container (the variables of script_lines); the task is the image's python
        pyxis_mounts(section, mounts)  # a path pyxis cannot mount is said now
        return command

    def here(self, section: DictConfig, mounts: Mounts, command: list[str]) -> list[str]:
        """``command`` in the image on this machine, outside Slurm (the check before the queue):
        ``enroot start`` of the squashfs itself (squashfuse: no unpack), with the same mounts."""
        exe = str(section.executable)
        cmd = [exe, "start"]
        if "/" in exe:
            # enroot execs its helpers (enroot-nsenter, enroot-switchroot) by name: an enroot
            # named by its path (a site's own prefix) needs its directory on PATH too
            path = os.environ.get("PATH", os.defpath)
            cmd = ["env", f"PATH={os.path.dirname(os.path.abspath(exe))}{os.pathsep}{path}", *cmd]
        for bind in all_binds(section, mounts):
            ro = ":none:x-create=auto,rbind,ro" if bind.mode == "ro" else ""
            cmd += ["--mount", f"{bind.source}:{bind.dest}{ro}"]
        return [*cmd, self._image(section), *command]

    def variables(self, section: DictConfig, mounts: Mounts) -> dict[str, str]:
        """pyxis's variables, as the batch script exports them (values not yet shell-quoted)."""
        out = {
            "PYXIS_CONTAINER_IMAGE": self._image(section),
            "PYXIS_CONTAINER_MOUNTS": pyxis_mounts(section, mounts),
            "PYXIS_CONTAINER_WORKDIR": mounts.run_dir,
        }
        names = [str(n) for n in section.env_passthrough or []]
        if names:
            out["PYXIS_CONTAINER_ENV"] = ",".join(names)
        for flag in section.flags or []:
            name, value = PYXIS_FLAGS[str(flag)]
            out[name] = value
        return out

    def script_lines(self, section: DictConfig, mounts: Mounts, passthrough: list[str]) -> list[str]:
        lines: list[str] = []
        created = [p.path for p in mounts.paths if p.created_by_job]
        if created:
            lines += [
                "# mount sources the job writes to must exist before pyxis mounts them",
                f"mkdir -p {' '.join(shlex.quote(p) for p in created)}",
            ]
        lines.append("# every srun step of this job starts its tasks in the image (pyxis reads these as its options)")
        for name, value in self.variables(section, mounts).items():
            if name == "PYXIS_CONTAINER_MOUNTS" and mounts.scratch is None:
                # ranks work in $TMPDIR when it is set (hpc_llm.job.rank.task): mount it too
                lines.append(f'export {name}={shlex.quote(value)}"${{TMPDIR:+,$TMPDIR}}"')
            else:
                lines.append(f"export {name}={shlex.quote(value)}")
        lines += [
            "# the code the job imports from outside the image (PYTHONPATH: hydra.launcher.snapshot's copy): mounted",
            'code="${PYTHONPATH:-}"; for d in ${code//:/ }; do',
            '  if [ -d "$d" ]; then PYXIS_CONTAINER_MOUNTS="$PYXIS_CONTAINER_MOUNTS,$d"; fi',
            "done",
        ]
        # what each rank records in results.json (hpc_llm.job.rank.measure): enroot's version
        # where the batch host has it on PATH
        lines.append('export HPC_LLM_ENROOT_VERSION="$(enroot version 2>/dev/null || true)"')
        if section.check:
            per_node = '--nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --export=ALL'
            py = shlex.quote(str(section.python))
            inner = (
                f'out=$({py} -c "import hpc_llm" 2>&1) && echo "hpc_llm: container check ok on $SLURMD_NODENAME" '
                '|| { echo "hpc_llm: container check failed on $SLURMD_NODENAME: $out"; exit 1; }'
            )
            lines += [
                "# one step per node before training (it unpacks the image once more); a node that fails is named",
                f"srun {per_node} --kill-on-bad-exit=0 sh -c {shlex.quote(inner)} || "
                '{ echo "hpc_llm: container check failed; not training" >&2; exit 1; }',
            ]
        return lines


@hookimpl
def hpc_llm_register_container_runtimes(register) -> None:
    register(NoContainer())
    register(Apptainer())
    register(Pyxis())
