# Sourced by scripts/install-apptainer.sh and scripts/install-slurm.sh: packages from the
# Debian archive apt already uses, verified by the archive keyring (InRelease -> Release
# SHA256 -> Packages.xz -> .deb SHA256). The caller sets ARCH, KEYRING and defines say/die.
# Gives: $MIRROR, $work (a temp dir removed on exit), index SUITE PACKAGE, fetch_deb FILE SHA.

# the Debian archive apt uses (deb822 URIs: or one-line deb entries), over http
MIRROR="${DEBIAN_MIRROR:-}"
if [ -z "$MIRROR" ]; then
  MIRROR="$( (cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true) \
    | grep -oE '(https?)://[^ ]+/debian/?( |$)' | grep -v -- '-security' | head -1 | tr -d ' ' || true)"
fi
MIRROR="${MIRROR%/}"
[ -n "$MIRROR" ] || die "no Debian archive found in /etc/apt/sources.list(.d); set DEBIAN_MIRROR=http://deb.debian.org/debian"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# InRelease signed by the archive key -> Packages.xz by its SHA256 in Release -> the
# stanza of PACKAGE: prints "Filename SHA256 Version"
index() {
  local suite="$1" package="$2" dir="$work/$1"
  mkdir -p "$dir"
  if [ ! -s "$dir/Packages" ]; then
    curl -fsSL --retry 3 -o "$dir/InRelease" "$MIRROR/dists/$suite/InRelease"
    gpgv --quiet --keyring "$KEYRING" --output "$dir/Release" "$dir/InRelease" 2>"$dir/gpgv.log" \
      || die "signature of $MIRROR/dists/$suite/InRelease does not verify: $(tail -1 "$dir/gpgv.log")"
    local want
    want="$(awk -v f="main/binary-$ARCH/Packages.xz" '/^SHA256:/{s=1;next} /^[^ ]/{s=0} s && $3==f {print $1}' "$dir/Release")"
    [ -n "$want" ] || die "$suite's Release lists no main/binary-$ARCH/Packages.xz"
    curl -fsSL --retry 3 -o "$dir/Packages.xz" "$MIRROR/dists/$suite/main/binary-$ARCH/Packages.xz"
    echo "$want  $dir/Packages.xz" | sha256sum -c --quiet - || die "$suite Packages.xz: SHA256 mismatch"
    xz -dc "$dir/Packages.xz" >"$dir/Packages"
  fi
  awk -v p="$package" '
    /^Package: /{hit=($2==p)} hit && /^Version: /{v=$2} hit && /^Filename: /{f=$2} hit && /^SHA256: /{s=$2}
    /^$/{if (hit && f) {print f, s, v; exit} hit=0}' "$dir/Packages"
}

fetch_deb() {  # FILENAME SHA256 -> path of the verified .deb
  local name="$1" sha="$2" out="$work/$(basename "$1")"
  curl -fsSL --retry 3 -o "$out" "$MIRROR/$name"
  echo "$sha  $out" | sha256sum -c --quiet - || die "$name: SHA256 mismatch"
  echo "$out"
}

