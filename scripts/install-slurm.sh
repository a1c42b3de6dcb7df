#!/usr/bin/env bash
# Install a second Slurm, Debian trixie's slurm-wlm 24.11.x, beside bookworm's 22.05 on a
# Debian bookworm dev machine or CI runner, without touching the system's Slurm or glibc.
# Idempotent; safe to re-run (it does nothing when the installed version is the one trixie
# has now). A dev cluster runs on it with `devcluster.up(slurm="24.11")`
# (hpc_llm/devcluster/cluster.py); see docs/design/verified/slurm.md, "Slurm 24.11 beside 22.05, verified".
#
# Why by hand: trixie's Slurm binaries need glibc >= 2.38 (bookworm has 2.36), and
# installing them as packages would replace bookworm's slurm-wlm. So, as
# scripts/install-apptainer.sh does: fetch trixie's .debs from the Debian archive apt already
# uses, verified by the archive keyring (InRelease -> Release SHA256 -> Packages.xz -> .deb
# SHA256), unpack them into a private prefix, trixie's libc6 into <prefix>/glibc, and point
# every Slurm ELF file (daemons, client commands, libslurmfull, the plugins) at that glibc and
# at the private library dir with patchelf (interpreter + DT_RPATH): no LD_LIBRARY_PATH, and
# what slurmstepd execs (the user's tasks) starts with the system's own loader and glibc.
#
#   scripts/install-slurm.sh [VERSION]    (VERSION: 24.11, the default)
#   prefix: /opt/slurm-24.11, or $HPC_LLM_SLURM_24_11_PREFIX (what devcluster.py reads too)
#
# The trixie packages it fetches (fixed; the versions are trixie's current ones):
#   slurmctld slurmd slurmdbd slurm-client slurm-wlm-basic-plugins slurm-wlm-mysql-plugin
#   libc6        (the private glibc, 2.41)
#   libhwloc15   (slurmd/slurmstepd want hwloc >= 2.12; bookworm has 2.9)
#   libjwt2      (auth/slurm's libjwt.so.2; bookworm has no libjwt.so.2)
# Every other library the Slurm files need (readelf NEEDED: liblz4, libnuma, libpam,
# libreadline.so.8, liblua5.1, libmunge, libmariadb.so.3 for accounting_storage/mysql,
# libjson-c.so.5, libyaml, libdbus, and libjwt's libb64/libjansson/libcrypto.so.3, hwloc's
# libudev) is bookworm's, installed from bookworm if missing (a new package, never an upgrade);
# the script checks after patching that every one of them resolves and has the symbol
# versions asked for.
#
# Layout: <prefix>/usr/{bin,sbin,lib/x86_64-linux-gnu/slurm-wlm} (the packages' files),
# <prefix>/glibc, <prefix>/lib (libhwloc, libjwt), <prefix>/bin (links to every command and
# daemon: PATH=<prefix>/bin:$PATH selects 24.11), <prefix>/plugins (-> the PluginDir).
# slurm.conf must say PluginDir=<prefix>/plugins, and slurmd must be started with
# `-d <prefix>/bin/slurmstepd`: its compiled-in slurmstepd is /usr/sbin/slurmstepd, which is
# 22.05's here.
set -euo pipefail

VERSION="${1:-24.11}"
if [ "$VERSION" != 24.11 ]; then
  echo "install-slurm: Slurm $VERSION is not installable; installable: 24.11" >&2
  exit 2
fi
PREFIX="${HPC_LLM_SLURM_24_11_PREFIX:-/opt/slurm-24.11}"
SUITE=trixie
REVISION=1  # of what this script makes of the packages (in the stamp: a new one reinstalls)
ARCH="$(dpkg --print-architecture)"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
LIBDIR=usr/lib/x86_64-linux-gnu
SLURM_PACKAGES=(slurmctld slurmd slurmdbd slurm-client slurm-wlm-basic-plugins slurm-wlm-mysql-plugin)
PRIVATE_LIBS=(libhwloc15 libjwt2)
# bookworm packages of the libraries left to the system (installed only where missing)
SYSTEM_LIBS=(liblz4-1 libnuma1 libpam0g libreadline8 liblua5.1-0 libmunge2 libmariadb3 libjson-c5
  libyaml-0-2 libdbus-1-3 libb64-0d libjansson4 libssl3 libudev1)
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
say() { echo "== install-slurm: $*"; }
die() { echo "install-slurm: $*" >&2; exit 1; }

[ "$ARCH" = amd64 ] || die "only amd64 is supported (this is $ARCH)"

# 1. the tools and the system's libraries (Debian packages; none of them upgrades one)
need=()
for pkg in patchelf curl xz-utils gpgv debian-archive-keyring "${SYSTEM_LIBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
  say "apt-get install ${need[*]}"
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. the Debian archive, verified (index, fetch_deb)
# shellcheck source=scripts/debian-archive.sh
source "$(dirname "$0")/debian-archive.sh"

declare -A FILE SHA VER
for pkg in "${SLURM_PACKAGES[@]}" "${PRIVATE_LIBS[@]}" libc6; do
  read -r f s v < <(index "$SUITE" "$pkg") || true
  [ -n "${f:-}" ] || die "$SUITE's index has no $pkg package"
  FILE[$pkg]="$f" SHA[$pkg]="$s" VER[$pkg]="$v"
done
slurm_version="${VER[slurmctld]}"
case "$slurm_version" in
  24.11.*) ;;
  *) die "$SUITE's slurmctld is $slurm_version, not 24.11.x" ;;
esac
want_stamp="install-slurm $REVISION: slurm $slurm_version glibc ${VER[libc6]} hwloc ${VER[libhwloc15]} jwt ${VER[libjwt2]}"
stamp="$PREFIX/.installed"
# (slurmctld -V: 24.11's client commands read slurm.conf before even --version)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ] && "$PREFIX/bin/slurmctld" -V >/dev/null 2>&1; then
  say "Slurm $slurm_version already installed in $PREFIX ($("$PREFIX/bin/slurmctld" -V))"
  exit 0
fi
say "Slurm $slurm_version ($SUITE) with its own glibc ${VER[libc6]} into $PREFIX"

# 3. unpack into a fresh prefix (built aside, then swapped in)
new="$PREFIX.new.$$"
$SUDO rm -rf "$new"
$SUDO mkdir -p "$new/glibc" "$new/lib" "$new/bin"
for pkg in "${SLURM_PACKAGES[@]}"; do
  $SUDO dpkg-deb -x "$(fetch_deb "${FILE[$pkg]}" "${SHA[$pkg]}")" "$new"
done
for pkg in "${PRIVATE_LIBS[@]}" libc6; do
  $SUDO dpkg-deb -x "$(fetch_deb "${FILE[$pkg]}" "${SHA[$pkg]}")" "$work/$pkg"
done
$SUDO cp -a "$work/libc6/$LIBDIR/." "$new/glibc/"
[ -e "$new/glibc/ld-linux-x86-64.so.2" ] || die "libc6 ${VER[libc6]} has no ld-linux-x86-64.so.2"
for pkg in "${PRIVATE_LIBS[@]}"; do
  $SUDO cp -a "$work/$pkg/$LIBDIR/." "$new/lib/"
done
# the packages' init scripts, units and default files are for a system install: not used.
# The PMIx plugins dlopen libpmix.so.2, which is not installed: slurmctld and slurmd load every
# mpi plugin at start-up and logged "mpi/pmix_v5: init: ... can not load PMIx library" for
# them (MpiDefault=none; srun --mpi=pmix is not available with this install).
$SUDO rm -rf "$new/etc" "$new/var" "$new/usr/lib/systemd" "$new/usr/lib/sysusers.d" "$new/usr/share/lintian"
$SUDO rm -f "$new/$LIBDIR"/slurm-wlm/mpi_pmix*.so

# 4. every Slurm ELF file (and the private libraries) uses the private glibc, then the private
# libraries and libslurmfull, then the system's. DT_RPATH (--force-rpath), not RUNPATH: an
# RPATH also serves what the object dlopen()s and the dependencies of those (the plugins'
# libmariadb, libjwt...), and the packages' own RUNPATH (/usr/lib/x86_64-linux-gnu/slurm-wlm)
# would find 22.05's libslurmfull.so.
rpath="$PREFIX/glibc:$PREFIX/lib:$PREFIX/$LIBDIR/slurm-wlm:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu"
elf() { [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
patched=0
while IFS= read -r -d '' f; do
  elf "$f" || continue
  if [ -n "$(patchelf --print-interpreter "$f" 2>/dev/null)" ]; then
    $SUDO patchelf --set-interpreter "$PREFIX/glibc/ld-linux-x86-64.so.2" "$f"
  fi
  $SUDO patchelf --force-rpath --set-rpath "$rpath" "$f"
  patched=$((patched + 1))
done < <(find "$new/usr/bin" "$new/usr/sbin" "$new/$LIBDIR/slurm-wlm" "$new/lib" -type f -print0)
say "patched $patched ELF files"

# 5. <prefix>/bin: every command and daemon under its usual name (Debian installs the daemons as
# <name>-wlm behind update-alternatives links)
for f in "$new"/usr/bin/* "$new"/usr/sbin/*; do
  name="$(basename "$f")"
  $SUDO ln -sfn "../usr/${f#"$new/usr/"}" "$new/bin/${name%-wlm}"
done
$SUDO ln -sfn "$LIBDIR/slurm-wlm" "$new/plugins"

# 6. swap it in, then check that every file resolves every library, symbol version included,
# with the private loader (a missing or too old one reads "not found")
$SUDO rm -rf "$PREFIX.old"
if [ -e "$PREFIX" ]; then $SUDO mv "$PREFIX" "$PREFIX.old"; fi
$SUDO mv "$new" "$PREFIX"
$SUDO rm -rf "$PREFIX.old"
bad=()
while IFS= read -r -d '' f; do
  elf "$f" || continue
  out="$(LD_TRACE_LOADED_OBJECTS=1 "$PREFIX/glibc/ld-linux-x86-64.so.2" "$f" 2>&1 || true)"
  if grep -q "not found" <<<"$out"; then bad+=("$f: $(grep "not found" <<<"$out" | head -1 | xargs)"); fi
  if grep -E "=> /(usr/)?lib/x86_64-linux-gnu/(libc|libm|libresolv)\.so" <<<"$out" >/dev/null; then
    bad+=("$f: loads the system's glibc")
  fi
done < <(find "$PREFIX/usr/bin" "$PREFIX/usr/sbin" "$PREFIX/$LIBDIR/slurm-wlm" -type f -print0)
[ "${#bad[@]}" -eq 0 ] || die "libraries not resolved with the private glibc: ${bad[*]}"
for d in slurmctld slurmd; do  # (slurmdbd -V reads slurmdbd.conf first)
  "$PREFIX/bin/$d" -V >/dev/null || die "$PREFIX/bin/$d -V fails"
done

echo "$want_stamp" | $SUDO tee "$stamp" >/dev/null
say "installed: $("$PREFIX/bin/slurmctld" -V) in $PREFIX (PATH=$PREFIX/bin:\$PATH; PluginDir=$PREFIX/plugins)"
