#!/usr/bin/env bash
# Install a real Apptainer on a Debian bookworm dev machine or CI runner, without
# touching the system's glibc. Idempotent; safe to re-run (it does nothing when
# the installed version is the one sid has now).
#
# Why by hand: Debian ships apptainer only in sid, and its binaries need glibc
# >= 2.38 (bookworm has 2.36). So: fetch sid's apptainer .deb and trixie's
# libc6 .deb from the Debian archive apt already uses, verified by the archive
# keyring (InRelease -> Release SHA256 -> Packages.xz -> .deb SHA256), unpack
# both into a private prefix, and point exactly two binaries (apptainer,
# starter) at that private glibc with patchelf. The tools apptainer runs
# (mksquashfs, squashfuse_ll) are the system's and keep the system glibc.
# See docs/design/verified/apptainer.md.
#
#   scripts/install-apptainer.sh [PREFIX]     (default /opt/apptainer; env APPTAINER_PREFIX)
#
# Not installed, on purpose: uidmap, containernetworking-plugins and fuse2fs
# upgrade bookworm system packages, so --fakeroot, --net and ext3 overlays are
# unavailable with this install.
set -euo pipefail

PREFIX="${1:-${APPTAINER_PREFIX:-/opt/apptainer}}"
BINDIR="${APPTAINER_BINDIR:-/usr/local/bin}"
ARCH="$(dpkg --print-architecture)"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
say() { echo "== install-apptainer: $*"; }
die() { echo "install-apptainer: $*" >&2; exit 1; }

[ "$ARCH" = amd64 ] || die "only amd64 is supported (this is $ARCH)"

# 1. the tools (Debian packages; none of them upgrades a system package)
need=()
for pkg in patchelf squashfs-tools squashfuse fuse3 curl xz-utils gpgv debian-archive-keyring; do
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

read -r app_file app_sha app_version < <(index sid apptainer) || true
[ -n "${app_file:-}" ] || die "sid's index has no apptainer package"
stamp="$PREFIX/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$app_version" ] && "$BINDIR/apptainer" --version >/dev/null 2>&1; then
  say "apptainer $app_version already installed in $PREFIX ($("$BINDIR/apptainer" --version))"
  exit 0
fi
read -r libc_file libc_sha libc_version < <(index trixie libc6) || true
[ -n "${libc_file:-}" ] || die "trixie's index has no libc6 package"
say "apptainer $app_version (sid) with its own glibc $libc_version (trixie) into $PREFIX"
app_deb="$(fetch_deb "$app_file" "$app_sha")"
libc_deb="$(fetch_deb "$libc_file" "$libc_sha")"

# 3. unpack into a fresh prefix (built aside, then swapped in)
new="$PREFIX.new.$$"
$SUDO rm -rf "$new"
$SUDO mkdir -p "$new/glibc"
$SUDO dpkg-deb -x "$app_deb" "$new"
$SUDO dpkg-deb -x "$libc_deb" "$work/libc6"
$SUDO cp -a "$work/libc6/usr/lib/x86_64-linux-gnu/." "$new/glibc/"
[ -e "$new/glibc/ld-linux-x86-64.so.2" ] || die "libc6 $libc_version has no ld-linux-x86-64.so.2"

# 4. exactly these two binaries use the private glibc (first, then the system's libraries)
for bin in usr/bin/apptainer usr/lib/x86_64-linux-gnu/apptainer/bin/starter; do
  $SUDO patchelf --set-interpreter "$PREFIX/glibc/ld-linux-x86-64.so.2" --force-rpath \
    --set-rpath "$PREFIX/glibc:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu" "$new/$bin"
done

# 5. a relocated apptainer reads <prefix>/usr/{etc,var}; starter reads <prefix>/usr/lib/{etc,var}
$SUDO mv "$new/etc" "$new/usr/etc"
$SUDO mkdir -p "$new/var"
$SUDO mv "$new/var" "$new/usr/var"
$SUDO mkdir -p "$new/usr/var/lib/apptainer/mnt/session"
$SUDO ln -sfn ../etc "$new/usr/lib/etc"
$SUDO ln -sfn ../var "$new/usr/lib/var"

# 6. root's default capabilities come from a file, listing what this machine's bounding
# set has (a VM without CAP_SYS_RESOURCE otherwise fails every root exec with
# "Requesting capability set ... while permitted capability set is ...")
conf="$new/usr/etc/apptainer/apptainer.conf"
$SUDO sed -i -E 's/^#? *root default capabilities *=.*/root default capabilities = file/' "$conf"
grep -q '^root default capabilities = file' "$conf" || die "could not set 'root default capabilities' in $conf"

$SUDO rm -rf "$PREFIX.old"
if [ -e "$PREFIX" ]; then $SUDO mv "$PREFIX" "$PREFIX.old"; fi
$SUDO mv "$new" "$PREFIX"
$SUDO rm -rf "$PREFIX.old"
$SUDO mkdir -p "$BINDIR"
$SUDO ln -sfn "$PREFIX/usr/bin/apptainer" "$BINDIR/apptainer"
$SUDO ln -sfn "$PREFIX/usr/bin/apptainer" "$BINDIR/singularity"  # spython calls 'singularity'

if [ "$(id -u)" = 0 ]; then
  capbnd="$(awk '/^CapBnd:/{print $2}' /proc/self/status)"
  caps=()
  i=0
  for name in CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP \
      LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE \
      SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_RESOURCE SYS_TIME \
      SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG \
      WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF CHECKPOINT_RESTORE; do
    if (( (16#$capbnd >> i) & 1 )); then caps+=("CAP_$name"); fi
    i=$((i + 1))
  done
  # (it warns once per capability that root may escalate: root is root already)
  out="$("$BINDIR/apptainer" capability add --user root "$(IFS=,; echo "${caps[*]}")" 2>&1)" \
    || die "apptainer capability add failed: $out"
fi

echo "$app_version" | $SUDO tee "$stamp" >/dev/null
say "installed: $("$BINDIR/apptainer" --version) -> $BINDIR/apptainer, $BINDIR/singularity"
