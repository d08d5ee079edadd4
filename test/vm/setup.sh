#!/bin/bash
# Prepare everything test/vm/run.sh needs, idempotently:
#   - host packages: qemu, busybox-static, rdma-core userspace, perftest, ...
#     (installed with apt-get when missing and we are root; the guest runs the
#     host's own / read-only, so guest tools are exactly these host packages)
#   - the stock Debian kernel (the package linux-image-amd64 depends on),
#     extracted with dpkg -x into the cache and depmod'ed; the host never boots it
#   - a tiny busybox initramfs ("stage 1", guest/init1) that mounts the host's /
#     over virtio-9p; its module list is resolved from modules.dep
#
# Usage: test/vm/setup.sh [--env]
#   --env  print the resulting paths as shell assignments on stdout
#          (run.sh evals them); progress messages always go to stderr.
# Env:   RDMA_VM_CACHE  cache dir (default /var/cache/go-rdma-vm)
#        RDMA_VM_KVER   kernel version to use, e.g. 6.1.0-57-amd64 (default:
#                       whatever linux-image-amd64 depends on)
#
# Cache layout (keyed by kernel version, so a new kernel package gets a new dir):
#   $CACHE/kver                   kernel version resolved from apt (re-resolved
#                                 when /var/lib/apt/lists changes; apt-cache is slow)
#   $CACHE/<kver>/kernel/         dpkg -x of linux-image-<kver>
#   $CACHE/<kver>/vmlinux         the same kernel uncompressed, for direct PVH
#                                 boot (saves ~4 s per boot under TCG)
#   $CACHE/<kver>/initrd-<hash>.cpio.gz   stage 1; <hash> covers guest/init1 and
#                                 the module list, so edits rebuild it
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${RDMA_VM_CACHE:-/var/cache/go-rdma-vm}
PRINT_ENV=0
case "${1:-}" in
  --env) PRINT_ENV=1 ;;
  "") ;;
  *) echo "usage: $0 [--env]" >&2; exit 2 ;;
esac

T0=$(date +%s%N)
log() { printf 'setup: [%5.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*" >&2; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive

# Modules stage 1 needs to mount the host root: virtio PCI transport, 9p, and
# overlayfs (a tmpfs upper layer makes the read-only host / writable in the
# guest, so /job and /lib/modules/<kver> can be created as mount points).
STAGE1_MODULES="virtio_pci 9pnet_virtio 9p overlay"

PACKAGES=(qemu-system-x86 busybox-static cpio kmod rdma-core ibverbs-providers
  ibverbs-utils rdmacm-utils perftest libibverbs-dev librdmacm-dev iproute2 util-linux patch)

APT_UPDATED=0
apt_update_once() {
  [ "$APT_UPDATED" = 1 ] && return 0
  log "apt-get update"
  apt-get update -qq >&2 || die "apt-get update failed"
  APT_UPDATED=1
}

# ---- 1. host packages (dpkg-query is ~10 ms; apt only when something is missing)
# dpkg-query exits non-zero when it knows none of a package (a fresh
# machine): that is the answer here, not an error.
missing=$({ dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' "${PACKAGES[@]}" 2>/dev/null || true; } |
  awk '$1 == "ii" { ok[$2] = 1 } END { n = split(p, a, " "); for (i = 1; i <= n; i++) if (!ok[a[i]]) printf "%s ", a[i] }' \
      p="${PACKAGES[*]}")
if [ -n "$missing" ]; then
  [ "$(id -u)" = 0 ] || die "missing packages: $missing(run this script once as root)"
  log "installing: $missing"
  # shellcheck disable=SC2086
  if ! apt-get install -y -qq --no-install-recommends $missing >&2; then
    # Stale or empty package lists are the usual cause; refresh once and retry.
    apt_update_once
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >&2 || die "apt-get install failed"
  fi
fi

# ---- 2. which kernel
mkdir -p "$CACHE" 2>/dev/null || die "cannot create $CACHE (run as root once, or set RDMA_VM_CACHE)"
if [ -n "${RDMA_VM_KVER:-}" ]; then
  KVER=$RDMA_VM_KVER
elif [ -s "$CACHE/kver" ] && ! [ /var/lib/apt/lists -nt "$CACHE/kver" ]; then
  KVER=$(cat "$CACHE/kver")
else
  resolve() { apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { sub(/^linux-image-/, "", $2); print $2; exit }'; }
  # apt-cache fails outright without package lists (a fresh machine):
  # an empty answer, then, not the end of the script.
  KVER=$(resolve || true)
  if [ -z "$KVER" ] && [ "$(id -u)" = 0 ]; then apt_update_once; KVER=$(resolve || true); fi
  if [ -z "$KVER" ]; then
    # Offline / no lists: fall back to the newest kernel already in the cache.
    KVER=$({ find "$CACHE" -mindepth 2 -maxdepth 2 -name ready -printf '%h\n' 2>/dev/null || true; } |
      xargs -r -n1 basename | sort -V | tail -n1)
    [ -n "$KVER" ] || die "cannot resolve linux-image-amd64 with apt-cache and no cached kernel"
    log "apt-cache cannot resolve linux-image-amd64; using cached kernel $KVER"
  else
    # remember it (best effort: a non-root user may not own the cache)
    { echo "$KVER" > "$CACHE/kver.tmp.$$" && mv -f "$CACHE/kver.tmp.$$" "$CACHE/kver"; } 2>/dev/null || true
  fi
fi
KDIR=$CACHE/$KVER
MODDIR=$KDIR/kernel/lib/modules/$KVER
VMLINUZ=$KDIR/kernel/boot/vmlinuz-$KVER

# Everything below writes into the cache: serialize concurrent setups.
# (Only taken when something is missing, so the warm path stays lock-free.)
with_lock() {
  exec 9>"$CACHE/.lock"
  flock -w 600 9 || die "timed out waiting for $CACHE/.lock"
}

# ---- 3. kernel package: download, extract, depmod
if [ ! -e "$KDIR/ready" ]; then
  with_lock
  if [ ! -e "$KDIR/ready" ]; then
    PKG=linux-image-$KVER
    TMP=$(mktemp -d "$CACHE/.tmp.XXXXXX")
    chmod 755 "$TMP"  # mktemp makes it 0700; let non-root users boot the kernel too
    trap 'rm -rf "$TMP"' EXIT
    log "downloading $PKG"
    # As root apt-get download drops to user _apt, which cannot write to our
    # private temp dir; the sandbox buys nothing for a plain download.
    dl() { (cd "$TMP" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" "$PKG" >&2); }
    if ! dl; then
      [ "$(id -u)" = 0 ] || die "apt-get download $PKG failed"
      apt_update_once
      dl || die "apt-get download $PKG failed"
    fi
    log "extracting $(basename "$TMP"/*.deb) ($(du -h "$TMP"/*.deb | cut -f1))"
    dpkg -x "$TMP"/*.deb "$TMP/kernel"
    rm -f "$TMP"/*.deb
    rm -rf "$TMP/kernel/usr/share/doc"
    [ -f "$TMP/kernel/boot/vmlinuz-$KVER" ] || die "no boot/vmlinuz-$KVER in $PKG"
    log "depmod"
    depmod -b "$TMP/kernel" "$KVER"
    rm -rf "$KDIR"
    mv "$TMP" "$KDIR"
    trap - EXIT
    touch "$KDIR/ready"
    log "kernel $KVER ready in $KDIR ($(du -sh "$KDIR" | cut -f1))"
  fi
fi

# ---- 3c. siw.ko (soft-iWARP), built out of tree
# Debian's kernel has CONFIG_RDMA_SIW unset, so the VM would have rxe only.
# Build siw.ko from the linux-source-6.1 package that matches the kernel,
# against its linux-headers, install it as updates/siw.ko in the cached
# module tree (the guest's /lib/modules/<kver>) and depmod. Once per kernel
# and patch per machine: about 140 MB to download and a 15 s build, then
# nothing.
# siw-listener.patch: a connection that ends before siw accepted it
# would close the listener (every later dial refused, and a WARNING in
# siw_cep_put when the listener is destroyed); the stream's
# TestStreamListenerSurvivesAbortedConnects shows it.
SIW_KO=$MODDIR/updates/siw.ko
SIW_PATCH=$HERE/siw-listener.patch
SIW_READY=$KDIR/siw-ready-$(sha256sum "$SIW_PATCH" | cut -c1-12)
build_siw() {
  local hdr=/usr/src/linux-headers-$KVER ver tmp src
  if [ ! -e "$hdr/Makefile" ]; then
    [ "$(id -u)" = 0 ] || die "siw.ko needs linux-headers-$KVER to build (run this script once as root)"
    log "installing linux-headers-$KVER (to build siw.ko)"
    if ! apt-get install -y -qq --no-install-recommends "linux-headers-$KVER" make >&2; then
      apt_update_once
      apt-get install -y -qq --no-install-recommends "linux-headers-$KVER" make >&2 ||
        die "apt-get install linux-headers-$KVER failed"
    fi
  fi
  # The source of the very kernel package; the newest linux-source-6.1
  # when the archive no longer has that version (siw changes little
  # within 6.1, and it is built against the right headers either way).
  ver=$(apt-cache show "linux-image-$KVER" 2>/dev/null | sed -n 's/^Version: //p' | head -n1) || true
  tmp=$(mktemp -d "$CACHE/.siw.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  dls() { (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" "$1" >&2); }
  log "downloading linux-source-6.1${ver:+=$ver} (to build siw.ko)"
  if ! { [ -n "$ver" ] && dls "linux-source-6.1=$ver"; }; then
    [ "$(id -u)" = 0 ] && apt_update_once
    if ! { [ -n "$ver" ] && dls "linux-source-6.1=$ver"; }; then
      log "linux-source-6.1${ver:+=$ver} is not in the archive; using the newest"
      dls linux-source-6.1 || die "apt-get download linux-source-6.1 failed"
    fi
  fi
  # Only drivers/infiniband/sw/siw of the 140 MB tarball, streamed.
  dpkg-deb --fsys-tarfile "$tmp"/linux-source-6.1_*.deb | tar -xO ./usr/src/linux-source-6.1.tar.xz |
    tar -xJ -C "$tmp" linux-source-6.1/drivers/infiniband/sw/siw || die "cannot extract siw from linux-source-6.1"
  rm -f "$tmp"/*.deb
  patch -s -d "$tmp/linux-source-6.1" -p1 < "$SIW_PATCH" || die "cannot apply $SIW_PATCH"
  src=$tmp/linux-source-6.1/drivers/infiniband/sw/siw
  log "building siw.ko"
  make -s -C "$hdr" M="$src" CONFIG_RDMA_SIW=m modules >&2 || die "building siw.ko failed"
  install -D -m 644 "$src/siw.ko" "$SIW_KO"
  depmod -b "$KDIR/kernel" "$KVER"
  rm -rf "$tmp"
  trap - EXIT
  rm -f "$KDIR"/siw-ready*
  touch "$SIW_READY"
  log "siw.ko built and installed in $(dirname "$SIW_KO")"
}
if [ ! -e "$SIW_READY" ] || [ ! -e "$SIW_KO" ]; then
  with_lock
  if [ ! -e "$SIW_READY" ] || [ ! -e "$SIW_KO" ]; then build_siw; fi
fi

# ---- 3b. uncompressed kernel for direct PVH boot
# Under TCG, decompressing the xz bzImage (plus firmware setup) costs ~4 s of
# every boot. The kernel is built with CONFIG_PVH, so qemu can load the ELF
# vmlinux directly; decompress it once here. Falls back to vmlinuz if not.
VMLINUX=$KDIR/vmlinux
if [ ! -e "$VMLINUX" ] && [ ! -e "$VMLINUX.none" ]; then
  with_lock
  if [ ! -e "$VMLINUX" ] && [ ! -e "$VMLINUX.none" ]; then
    ok=0
    if grep -q '^CONFIG_PVH=y' "$KDIR/kernel/boot/config-$KVER" 2>/dev/null; then
      # Like the kernel's scripts/extract-vmlinux: try each compressed-stream
      # magic in the bzImage until one decompresses to an ELF file.
      for magic in $'\xfd7zXZ:xz -dc' $'\x28\xb5\x2f\xfd:zstd -qdc' $'\x1f\x8b\x08:gzip -dc'; do
        dec=${magic#*:}
        command -v "${dec%% *}" > /dev/null 2>&1 || continue
        while read -r off; do
          # trailing bytes after the stream make the decompressor complain; ignore
          tail -c "+$((off + 1))" "$VMLINUZ" | $dec > "$VMLINUX.tmp" 2>/dev/null || true
          if [ "$(head -c4 "$VMLINUX.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then ok=1; break 2; fi
        done < <(LC_ALL=C grep -abo "${magic%%:*}" "$VMLINUZ" 2>/dev/null | cut -d: -f1)
      done
    fi
    if [ "$ok" = 1 ]; then
      mv "$VMLINUX.tmp" "$VMLINUX"
      log "extracted vmlinux for PVH boot ($(du -h "$VMLINUX" | cut -f1))"
    else
      rm -f "$VMLINUX.tmp"
      touch "$VMLINUX.none"
      log "no PVH-bootable vmlinux; booting vmlinuz (slower under TCG)"
    fi
  fi
fi
[ -e "$VMLINUX" ] && BOOT_KERNEL=$VMLINUX || BOOT_KERNEL=$VMLINUZ

# ---- 4. stage 1 initramfs
# Resolve the module list (with dependencies, in load order) from modules.dep.
# Builtin modules have no entry there and are simply skipped.
declare -a ORDER=()
declare -A SEEN=()
add_module() {
  local name=$1 line dep
  [ -n "${SEEN[$name]:-}" ] && return 0
  SEEN[$name]=1
  # modules.dep uses file names where '-' and '_' are interchangeable
  line=$(grep -E "(^|/)${name//[-_]/[-_]}\.ko(\.[a-z]+)?:" "$MODDIR/modules.dep" | head -n1) || true
  if [ -z "$line" ]; then
    grep -qE "/${name//[-_]/[-_]}\.ko" "$MODDIR/modules.builtin" ||
      die "module $name neither in modules.dep nor modules.builtin"
    return 0
  fi
  for dep in ${line#*:}; do
    dep=${dep##*/}
    add_module "${dep%%.ko*}"
  done
  ORDER+=("${line%%:*}")
}
for m in $STAGE1_MODULES; do add_module "$m"; done

HASH=$( { cat "$HERE/guest/init1"; printf '%s\n' "${ORDER[@]}"; } | sha256sum | cut -c1-12)
INITRD=$KDIR/initrd-$HASH.cpio.gz
if [ ! -e "$INITRD" ]; then
  with_lock
  if [ ! -e "$INITRD" ]; then
    IR=$(mktemp -d "$CACHE/.initrd.XXXXXX")
    trap 'rm -rf "$IR"' EXIT
    mkdir -p "$IR/bin" "$IR/mods"
    cp /bin/busybox "$IR/bin/busybox"
    install -m 755 "$HERE/guest/init1" "$IR/init"
    for f in "${ORDER[@]}"; do
      case $f in # busybox insmod cannot read compressed modules
        *.ko.xz) xz -dc "$MODDIR/$f" > "$IR/mods/$(basename "${f%.xz}")" ;;
        *.ko.zst) zstd -qdc "$MODDIR/$f" > "$IR/mods/$(basename "${f%.zst}")" ;;
        *.ko) cp "$MODDIR/$f" "$IR/mods/" ;;
        *) die "unexpected module file $f" ;;
      esac
      basename "${f%%.ko*}" >> "$IR/mods/order"
    done
    (cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$IR"
    trap - EXIT
    log "built $(basename "$INITRD") ($(du -h "$INITRD" | cut -f1)), modules: ${ORDER[*]##*/}"
  fi
fi

log "ready: kernel $KVER, cache $KDIR"
if [ "$PRINT_ENV" = 1 ]; then
  printf 'VM_KVER=%q\nVM_KERNEL=%q\nVM_INITRD=%q\nVM_MODDIR=%q\n' "$KVER" "$BOOT_KERNEL" "$INITRD" "$MODDIR"
fi
