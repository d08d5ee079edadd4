# Sourced by test.sh: install what building and testing go-rdma needs.

# ensure_host_deps installs the C toolchain the cgo provider (internal/ibv)
# builds with, when root and missing. Building needs no rdma-core headers
# (internal/ibv/abi.h declares what it uses); libibverbs-dev and
# librdmacm-dev are here only for test.sh's ABI check, which compares
# abi.h with them (go test -tags rdmaheaders ./internal/ibv/abicheck). As
# root on amd64 it also installs the linux/arm64 cross compiler, for
# test.sh's cgo cross-build (the purego binding's ABI mirror checked for
# arm64); test.sh skips that build where it is missing otherwise.
ensure_host_deps() {
  local want=(gcc libc6-dev libibverbs-dev librdmacm-dev pkg-config) missing=()
  if [ "$(uname -m)" = x86_64 ] && [ "$(id -u)" = 0 ]; then
    want+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
  fi
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing packages: ${missing[*]} (install them as root: apt-get install ${missing[*]})" >&2
    return 1
  fi
  echo "installing ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}
