"""The tests' Apptainer image without a registry: a skeleton root filesystem whose /usr, this
checkout and its virtualenv come in through binds (shared by tests/test_containers.py and
benchmarks/container.py; no pytest here)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def host_binds() -> list[str]:
    """What the skeleton image needs from the host: /usr, the checkout (with .venv) and,
    when it lives elsewhere, the interpreter the virtualenv was made from."""
    binds = ["/usr", str(ROOT)]
    base = os.path.realpath(sys.base_prefix)
    if not any(base == b or base.startswith(b + "/") for b in binds):
        binds.append(base)
    return binds


def make_skeleton(root: Path, host: bool = True, venv_bin: Path = VENV_BIN) -> Path:
    """A root filesystem with nothing in it: /usr and the venv come in through binds. Its
    environment puts the venv first on PATH, as the shipped images put theirs (``host``:
    with the mount points and PATH for the host's /usr and venv; ``venv_bin``: another venv of
    the checkout, torchtitan's as containers/torchtitan.def installs it)."""
    for d in ("usr", "etc", "tmp", "var/tmp", "proc", "sys", "dev", "root", "home", ".singularity.d/env"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link in ("bin", "lib", "lib64", "sbin"):
        if not (root / link).is_symlink():
            (root / link).symlink_to(f"usr/{link}")
    for f in ("passwd", "group"):
        shutil.copy(f"/etc/{f}", root / "etc" / f)
    if not host:
        return root
    for bind in host_binds():  # mount points: a build in a user namespace cannot create them
        (root / bind.lstrip("/")).mkdir(parents=True, exist_ok=True)
    env = root / ".singularity.d" / "env" / "90-environment.sh"
    env.write_text(f"#!/bin/sh\nexport PATH={venv_bin}:$PATH\nexport PYTHONNOUSERSITE=1\n")
    env.chmod(0o755)
    return root


#: where the enroot test image keeps its own Python: a path that exists only inside the image, so
#: the interpreter a run records (provenance.job.executable) says the image's ran
IMAGE_VENV = "/opt/hpc_llm/venv"


def make_enroot_image(root: Path, image: Path, venv_bin: Path = VENV_BIN) -> Path:
    """The skeleton as an enroot image (a squashfs, as ``enroot import`` makes one), with a
    Python of its own at :data:`IMAGE_VENV`: a virtualenv (pyvenv.cfg, ``bin/python3`` ->
    ``/usr/bin/python3.X``) whose site-packages adds this checkout's venv (mounted from the host
    with /usr, :func:`host_binds`), and ``/etc/environment`` putting it first on PATH (enroot's
    image format: pyxis gives the task the image's PATH). mksquashfs with enroot's own options
    (ENROOT_SQUASH_OPTIONS: ``-comp lzo -noD``), in well under a second."""
    import subprocess
    import sysconfig

    make_skeleton(root, venv_bin=venv_bin)
    venv = root / IMAGE_VENV.lstrip("/")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    for name in ("python3", "python"):
        link = venv / "bin" / name
        if not link.is_symlink():
            link.symlink_to(f"/usr/bin/{version}")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    site = venv / "lib" / version / "site-packages"
    site.mkdir(parents=True, exist_ok=True)
    host_site = (
        subprocess.run(
            [str(venv_bin / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        or sysconfig.get_paths()["purelib"]
    )
    (site / "host_venv.pth").write_text(f"import site; site.addsitedir({host_site!r})\n")
    (root / "etc" / "environment").write_text(
        f"PATH={IMAGE_VENV}/bin:/usr/local/bin:/usr/bin:/bin\nPYTHONNOUSERSITE=1\n"
    )
    image.unlink(missing_ok=True)
    subprocess.run(
        ["mksquashfs", str(root), str(image), "-comp", "lzo", "-noD", "-all-root", "-noappend", "-quiet"],
        check=True,
        capture_output=True,
    )
    return image
