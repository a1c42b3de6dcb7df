#!/usr/bin/env bash
# Build enroot and NVIDIA's pyxis (the SPANK plugin behind `srun --container-image`) for the dev
# clusters: enroot once, and one spank_pyxis.so per dev-cluster Slurm version (22.05, and 24.11
# when scripts/install-slurm.sh installed it), into a prefix of the project's own. Idempotent:
# nothing is rebuilt when the stamp says the same sources, Slurm versions and recipe were built.
#
#   scripts/install-pyxis.sh            (setup-dev.sh runs it)
#   prefix:  /opt/hpc_llm-pyxis, or $HPC_LLM_PYXIS_PREFIX (what hpc_llm.devcluster.pyxis reads too)
#   sources: shared/vendor in the folder holding the checkout, or $HPC_LLM_VENDOR: enroot-*.tar.gz,
#            pyxis-*.tar.gz, slurm-24.11.*-headers.tar.gz (neither enroot nor pyxis is packaged by
#            Debian, and CI reaches only the package registries)
#
# Where they cannot be built or run here (no sources, no user namespaces, no squashfs-tools) it
# says why in one line, writes that line to <prefix>.why (the pyxis tests skip with it) and exits
# 0: the rest of the set-up goes on.
#
# Why by hand: enroot's release build compiles its helpers statically against musl, which is a
# git submodule the source archive lacks; with FORCE_GLIBC=1 they link glibc, and bookworm's glibc
# (2.36) has no strlcpy, so they take it from Debian's libbsd (static, with libmd). pyxis must be
# compiled against the spank.h of the Slurm it loads into ("Incompatible plugin version"
# otherwise): 22.05's headers come from Debian's libslurm-dev, 24.11's from the vendored headers
# (slurm_version.h made from its .in, as Slurm's configure would).
#
# Layout: <prefix>/enroot/{bin,lib,etc} (enroot's own `make install prefix=`: the script bakes its
# paths in), <prefix>/slurm-<version>/spank_pyxis.so, <prefix>/.installed (the stamp).
set -euo pipefail
cd "$(dirname "$0")/.."

PREFIX="${HPC_LLM_PYXIS_PREFIX:-/opt/hpc_llm-pyxis}"
# the vendored sources: shared/vendor in the folder that holds this checkout (CI lays it there)
VENDOR="${HPC_LLM_VENDOR:-$(dirname "$PWD")/shared/vendor}"
REVISION=1  # of this recipe (in the stamp: a new one rebuilds)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
say() { echo "== install-pyxis: $*"; }
# one line, kept where the tests read it, and a success exit: pyxis is optional for the set-up
cannot() {
  echo "== install-pyxis: not installed: $*"
  echo "$*" | $SUDO tee "$PREFIX.why" >/dev/null
  exit 0
}

enroot_src=$(ls "$VENDOR"/enroot-*.tar.gz 2>/dev/null | head -1 || true)
pyxis_src=$(ls "$VENDOR"/pyxis-*.tar.gz 2>/dev/null | head -1 || true)
headers_src=$(ls "$VENDOR"/slurm-24.11.*-headers.tar.gz 2>/dev/null | head -1 || true)
[ -n "$enroot_src" ] && [ -n "$pyxis_src" ] || cannot "no enroot/pyxis sources in $VENDOR (set HPC_LLM_VENDOR)"

# enroot runs containers in a user namespace; pyxis execs it from slurmstepd
if ! unshare -U -r true 2>/dev/null; then
  cannot "this machine has no user namespaces (unshare -U fails), which enroot needs"
fi

# Debian packages: the compilers' inputs (libbsd-dev, libmd-dev, libslurm-dev for 22.05's spank.h)
# and what enroot runs (squashfs-tools: unsquashfs/mksquashfs; jq, curl: its image import)
need=()
for pkg in build-essential libbsd-dev libmd-dev libslurm-dev squashfs-tools jq curl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  say "apt-get install ${need[*]}"
  { $SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q \
    --no-install-recommends "${need[@]}" >/dev/null; } || cannot "apt-get install ${need[*]} failed"
fi

# the Slurm versions to build for: the system's, and 24.11 where install-slurm.sh put it
declare -A INCLUDE VERNUM
v2205="$(slurmd -V 2>/dev/null | awk '{print $2}' || true)"
case "$v2205" in
  22.05.*) INCLUDE[22.05]=/usr/include VERNUM[22.05]="$v2205" ;;
  *) cannot "no Slurm 22.05 (slurmd -V: '${v2205:-none}')" ;;
esac
prefix2411="${HPC_LLM_SLURM_24_11_PREFIX:-/opt/slurm-24.11}"
v2411="$("$prefix2411/bin/slurmd" -V 2>/dev/null | awk '{print $2}' || true)"
if [[ "$v2411" == 24.11.* ]]; then
  [ -n "$headers_src" ] || cannot "Slurm $v2411 is installed but $VENDOR has no slurm-24.11.*-headers.tar.gz"
  VERNUM[24.11]="$v2411"
fi

sha() { sha256sum "$1" | cut -c1-16; }
want="install-pyxis $REVISION: enroot $(sha "$enroot_src") pyxis $(sha "$pyxis_src")"
want+=" headers ${headers_src:+$(sha "$headers_src")} slurm ${VERNUM[*]}"
if [ -f "$PREFIX/.installed" ] && [ "$(cat "$PREFIX/.installed")" = "$want" ] \
  && "$PREFIX/enroot/bin/enroot" version >/dev/null 2>&1; then
  say "enroot $("$PREFIX/enroot/bin/enroot" version) and pyxis for Slurm ${!VERNUM[*]} already in $PREFIX"
  $SUDO rm -f "$PREFIX.why"
  exit 0
fi

started=$SECONDS
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
new="$PREFIX.new.$$"
$SUDO rm -rf "$new"
$SUDO mkdir -p "$new"

# enroot, against glibc + Debian's static libbsd (see the top)
tar -xzf "$enroot_src" -C "$work"
src="$(echo "$work"/enroot-*)"
# the submodules the archive lacks: makeself only serves `enroot bundle` (a stub says so), and
# linux-headers only the musl build
touch "$src/deps/makeself/.stamp" "$src/deps/linux-headers/.stamp"
mkdir -p "$src/deps/dist/linux/include" "$src/deps/dist/makeself/bin"
printf '#!/bin/sh\necho "enroot-makeself is not installed (hpc_llm builds enroot without it)" >&2\nexit 1\n' \
  > "$src/deps/dist/makeself/bin/enroot-makeself"
chmod +x "$src/deps/dist/makeself/bin/enroot-makeself"
libdir=/usr/lib/x86_64-linux-gnu
CPPFLAGS="-DLIBBSD_OVERLAY -isystem /usr/include/bsd" \
  make -s -C "$src" -j2 FORCE_GLIBC=1 prefix="$PREFIX/enroot" \
  LDLIBS="$libdir/libbsd.a $libdir/libmd.a" >"$work/enroot.log" 2>&1 \
  || cannot "enroot failed to build: $(tail -1 "$work/enroot.log")"
# installed into the new tree, its baked-in paths those of the final prefix
$SUDO make -s -C "$src" FORCE_GLIBC=1 prefix="$PREFIX/enroot" DESTDIR="$new.destdir" \
  LDLIBS="$libdir/libbsd.a $libdir/libmd.a" install >>"$work/enroot.log" 2>&1 \
  || cannot "enroot failed to install: $(tail -1 "$work/enroot.log")"
$SUDO mv "$new.destdir$PREFIX/enroot" "$new/enroot"
$SUDO rm -rf "$new.destdir"

# pyxis, once per Slurm version (CPPFLAGS in the environment: on make's command line it would
# replace the Makefile's -D_GNU_SOURCE)
tar -xzf "$pyxis_src" -C "$work"
psrc="$(echo "$work"/pyxis-*)"
if [ -n "${VERNUM[24.11]:-}" ]; then
  tar -xzf "$headers_src" -C "$work"
  hdr="$(echo "$work"/slurm-24.11.*-headers)"
  IFS=. read -r major minor micro <<<"${VERNUM[24.11]}"
  num=$(printf '0x%02x%02x%02x' "$major" "$minor" "${micro%%[!0-9]*}")
  sed "s/^#undef SLURM_VERSION_NUMBER$/#define SLURM_VERSION_NUMBER $num/" \
    "$hdr/slurm/slurm_version.h.in" > "$hdr/slurm/slurm_version.h"
  INCLUDE[24.11]="$hdr"
fi
for v in "${!VERNUM[@]}"; do
  make -s -C "$psrc" clean >/dev/null
  CPPFLAGS="-I${INCLUDE[$v]}" make -s -C "$psrc" -j2 >"$work/pyxis-$v.log" 2>&1 \
    || cannot "pyxis failed to build for Slurm $v: $(tail -1 "$work/pyxis-$v.log")"
  $SUDO install -D -m 644 "$psrc/spank_pyxis.so" "$new/slurm-$v/spank_pyxis.so"
done

$SUDO rm -rf "$PREFIX.old"
if [ -e "$PREFIX" ]; then $SUDO mv "$PREFIX" "$PREFIX.old"; fi
$SUDO mv "$new" "$PREFIX"
$SUDO rm -rf "$PREFIX.old" "$PREFIX.why"
"$PREFIX/enroot/bin/enroot" version >/dev/null || cannot "the enroot built does not run ($PREFIX/enroot/bin/enroot version)"
echo "$want" | $SUDO tee "$PREFIX/.installed" >/dev/null
say "enroot $("$PREFIX/enroot/bin/enroot" version) and pyxis $(basename "$psrc" | cut -d- -f2) for Slurm ${!VERNUM[*]} in $PREFIX ($((SECONDS - started)) s)"
