# Sourced by test.sh and example.sh: install what building go-rdma needs.

# ensure_host_deps installs the C toolchain and libibverbs headers that the
# cgo provider (internal/ibv) builds against, when root and missing.
ensure_host_deps() {
  local want=(gcc libc6-dev libibverbs-dev librdmacm-dev pkg-config) missing=()
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
