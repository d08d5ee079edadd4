#!/usr/bin/env bash
# Proves that a program importing go-rdma builds without rdma-core's
# headers, as on a stock Go machine (gcc, cgo on, no libibverbs-dev): with
# the C compiler's header search hiding infiniband/ and rdma/, it builds a
# fresh module with one main.go that calls rdma.Devices(), with an empty
# build cache (a warm one hid the failure once), with CGO_ENABLED=1 and
# then 0, and runs each binary. With -o DIR it leaves the two binaries
# there (DIR/app1, DIR/app0), for test/vm/apptests.sh to run on rxe and
# siw in the VM.
#
# It needs no privileges (it runs in a chroot or an unprivileged
# container): rather than hide the directories with a mount namespace, it
# gives the compiler, through CGO_CFLAGS, -nostdinc and its own search
# list again, in which each directory holding infiniband/ or rdma/ is
# replaced by a copy made of symlinks that leaves those two out. Before
# the builds it checks that the hiding works: a cgo package that includes
# <infiniband/verbs.h> (then <rdma/rdma_cma.h>) builds with the system's
# search (where the headers are installed, as test.sh's deps install
# them) and fails with "No such file" with these flags.
set -euo pipefail
shopt -s nullglob
export LC_ALL=C # the compiler's messages, read below, in English
repo=$(cd "$(dirname "$0")/../.." && pwd)
out_dir=
if [ "${1:-}" = -o ]; then out_dir=$(cd "$2" && pwd); fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The compiler's own search list for <...>, as `cc -v` prints it.
cc=$(go env CC)
command -v "${cc%% *}" >/dev/null || { echo "noheaders: no C compiler ($cc)" >&2; exit 1; }
mapfile -t search < <(echo | $cc -xc -E -v - 2>&1 |
  sed -n '/^#include <\.\.\.> search starts here:/,/^End of search list\./p' | sed '1d;$d;s/^ *//')
[ ${#search[@]} -gt 0 ] || { echo "noheaders: $cc printed no include search list" >&2; exit 1; }
hidden_flags="-nostdinc"
n=0
for d in "${search[@]}"; do
  if [ -e "$d/infiniband" ] || [ -e "$d/rdma" ]; then
    n=$((n + 1))
    copy=$work/include/$n
    mkdir -p "$copy"
    for e in "$d"/*; do
      case ${e##*/} in infiniband | rdma) ;; *) ln -s "$e" "$copy/" ;; esac
    done
    echo "== $d: searched as $copy, without infiniband/ and rdma/"
    d=$copy
  fi
  hidden_flags+=" -isystem $d"
done
# No .pc file of rdma-core either (libibverbs.pc comes with the headers).
mkdir "$work/pkgconfig"
hidden_env=(CGO_CFLAGS="$(go env CGO_CFLAGS) $hidden_flags" PKG_CONFIG_LIBDIR="$work/pkgconfig" PKG_CONFIG_PATH=)

export GOFLAGS=-mod=mod
# The check that the headers are out of reach of cgo with these flags.
mkdir -p "$work/probe"
for h in infiniband/verbs.h rdma/rdma_cma.h; do
  p=$work/probe/$(basename "$h" .h)
  mkdir "$p"
  printf 'package main\n\n// #include <%s>\nimport "C"\n\nfunc main() {}\n' "$h" > "$p/main.go"
  printf 'module probe\n\ngo 1.21\n' > "$p/go.mod"
  if (cd "$p" && CGO_ENABLED=1 go build -o /dev/null .) > "$p/seen.log" 2>&1; then
    echo "== <$h> builds with the system's search"
  elif grep -q 'No such file' "$p/seen.log"; then
    echo "== <$h> is not installed here (rdma-core's -dev packages): what follows shows only that it fails"
  else
    cat "$p/seen.log" >&2; echo "noheaders: the probe for <$h> failed for another reason" >&2; exit 1
  fi
  if (cd "$p" && env "${hidden_env[@]}" CGO_ENABLED=1 go build -o /dev/null .) > "$p/hidden.log" 2>&1; then
    echo "noheaders: <$h> is still visible to cgo with $hidden_flags" >&2; exit 1
  fi
  grep -q "$h: No such file" "$p/hidden.log" || { cat "$p/hidden.log" >&2; echo "noheaders: the hidden probe for <$h> failed for another reason" >&2; exit 1; }
  echo "== <$h> is hidden: $(grep -m1 "$h" "$p/hidden.log")"
done
export "${hidden_env[@]}"

mkdir "$work/app"
cd "$work/app"
cat > go.mod <<MOD
module noheaders

go $(cd "$repo" && go list -m -f '{{.GoVersion}}')

require github.com/go-rdma/rdma v0.0.0

replace github.com/go-rdma/rdma => $repo
MOD
cat > main.go <<'GO'
// A fresh program that imports go-rdma: with no arguments it lists the
// devices; "move DEVICE" moves data over a verbs device, or soft0 (TCP
// bootstrap on loopback), "move-cm IP" over the device behind IP through
// rdma_cm.
package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-rdma/rdma"
)

func main() {
	if len(os.Args) == 3 {
		if err := move(os.Args[1], os.Args[2]); err != nil {
			fmt.Println(os.Args[1], os.Args[2]+":", err)
			os.Exit(1)
		}
		return
	}
	devs, err := rdma.Devices()
	if err != nil {
		fmt.Println("rdma.Devices:", err)
		os.Exit(1)
	}
	verbs := 0
	for _, d := range devs {
		fmt.Printf("device %s (%s, usable %v)\n", d.Name, d.Provider, d.Usable)
		if d.Provider == rdma.ProviderVerbs {
			verbs++
		}
	}
	fmt.Printf("verbs devices: %d\n", verbs)
}

// move listens and dials, sends a message carrying the receiver's
// exposed region and WRITEs 64 KiB into it.
func move(how, where string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addr, opts := "127.0.0.1:0", []rdma.Option{rdma.WithProvider(rdma.ProviderVerbs), rdma.WithDevice(where)}
	if where == "soft0" {
		opts[0] = rdma.WithProvider(rdma.ProviderSoft)
	}
	if how == "move-cm" {
		addr, opts = where+":0", []rdma.Option{rdma.WithRDMACM()}
	}
	ln, err := rdma.Listen("rdma", addr, opts...)
	if err != nil {
		return err
	}
	defer ln.Close()
	acc := make(chan *rdma.Conn, 1)
	go func() { c, _ := ln.Accept(ctx); acc <- c }()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	s := <-acc
	if s == nil {
		return fmt.Errorf("nothing accepted")
	}
	defer s.Close()
	target, err := s.Alloc(64 << 10)
	if err != nil {
		return err
	}
	defer target.Release()
	region, err := s.Expose(target, rdma.RemoteWrite)
	if err != nil {
		return err
	}
	msg, err := s.Alloc(64)
	if err != nil {
		return err
	}
	defer msg.Release()
	enc, _ := region.MarshalBinary()
	if err := msg.SetLen(copy(msg.Bytes(), enc)); err != nil {
		return err
	}
	r := c.Recv()
	if err := s.Send(msg).Wait(ctx); err != nil {
		return err
	}
	if err := r.Wait(ctx); err != nil {
		return err
	}
	var dst rdma.RemoteRegion
	err = dst.UnmarshalBinary(r.Buffer().Bytes())
	r.Buffer().Release()
	if err != nil {
		return err
	}
	src, err := c.Alloc(64 << 10)
	if err != nil {
		return err
	}
	defer src.Release()
	copy(src.Bytes(), bytes.Repeat([]byte("noheaders"), 8<<10))
	if err := c.Write(src, dst).Wait(ctx); err != nil {
		return err
	}
	// On iWARP a WRITE completes once sent, not once placed; a SEND
	// behind it is delivered after its data.
	placed := s.Recv()
	note, err := c.Alloc(1)
	if err != nil {
		return err
	}
	defer note.Release()
	if err := c.Send(note).Wait(ctx); err != nil {
		return err
	}
	if err := placed.Wait(ctx); err != nil {
		return err
	}
	placed.Buffer().Release()
	if !bytes.Equal(target.Bytes(), src.Bytes()) {
		return fmt.Errorf("the WRITE's bytes differ")
	}
	fmt.Printf("moved %d bytes on %s (%s)\n", len(src.Bytes()), c.Device(), c.Provider())
	return nil
}
GO

# One empty cache for both builds: the second reuses the standard
# library's objects, and what needs the headers is built afresh by cgo.
export GOCACHE=$work/cache
for cgo in 1 0; do
  echo "== CGO_ENABLED=$cgo, no rdma-core headers, empty build cache"
  CGO_ENABLED=$cgo go build -o "app$cgo" .
  go version -m "app$cgo" | grep -q "CGO_ENABLED=$cgo" || { echo "app$cgo: not built with CGO_ENABLED=$cgo" >&2; exit 1; }
  out=$("./app$cgo")
  echo "$out"
  # This host has no RDMA device: the program must say so, not fail.
  echo "$out" | grep -qx 'verbs devices: 0' || { echo "app$cgo: expected no verbs device" >&2; exit 1; }
  out=$("./app$cgo" move soft0)
  echo "$out"
  echo "$out" | grep -q '^moved 65536 bytes on soft0' || { echo "app$cgo: moved nothing on soft0" >&2; exit 1; }
  [ -z "$out_dir" ] || cp "app$cgo" "$out_dir/"
done
echo "noheaders: ok"
