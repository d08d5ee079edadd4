package rdma_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// nonMinbase are commands a Debian minbase machine (debootstrap
// --variant=minbase, plus git, ca-certificates, gcc and Go) lacks, and
// that neither scripts/deps.sh nor test/vm/setup.sh installs. (ss and ip
// come with iproute2, which setup.sh installs for the VM scripts.)
var nonMinbase = regexp.MustCompile(`(^|[\s;&|(` + "`" + `$])(python3?|curl|wget|jq|nc|ncat|socat|netstat|lsof|pgrep|pkill|killall|xxd|bc|ps)(\s|$)`)

// Rule: ./test.sh and ./example.sh, and the scripts they run on the host,
// need no tool beyond a minbase Debian and what they install themselves
// (test/guide/run.sh picked a free port with python3, and failed there).
// The scripts that run only in the VM or by hand (test/perf) are not
// held to it.
func TestScriptsNeedOnlyMinbase(t *testing.T) {
	files := []string{"test.sh", "example.sh"}
	for _, glob := range []string{"scripts/*.sh", "test/guide/*.sh", "test/build/*.sh", "test/vm/*.sh"} {
		m, err := filepath.Glob(glob)
		require.NoError(t, err)
		files = append(files, m...)
	}
	require.Greater(t, len(files), 5, "the scripts were not found: %v", files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") {
				continue
			}
			if m := nonMinbase.FindStringSubmatch(code); m != nil {
				t.Errorf("%s:%d uses %s, which a minbase Debian lacks: %s", f, i+1, m[2], code)
			}
		}
	}
}

// privileged are commands that need more than root in a chroot or an
// unprivileged container has: namespaces, mounts, kernel modules, links.
var privileged = regexp.MustCompile(`(^|[\s;&|(` + "`" + `$])(sudo|unshare|nsenter|mount|umount|modprobe|insmod|rmmod|chroot|setcap|ip +link|rdma +link)(\s|$)`)

// Rule: ./test.sh and ./example.sh, and the scripts they run on the host,
// work as root in a chroot or an unprivileged container (apt-get is fine):
// test/build/noheaders.sh hid the rdma-core headers with unshare -m and
// bind mounts, and failed there ("cannot change root filesystem
// propagation"). What needs privileges happens inside the VM, whose
// scripts (test/vm/ but for the host's run, run2, setup and common) are
// not held to it.
func TestHostScriptsNeedNoPrivileges(t *testing.T) {
	files := []string{"test.sh", "example.sh", "test/vm/run.sh", "test/vm/run2.sh", "test/vm/setup.sh", "test/vm/common.sh"}
	for _, glob := range []string{"scripts/*.sh", "test/guide/*.sh", "test/build/*.sh"} {
		m, err := filepath.Glob(glob)
		require.NoError(t, err)
		require.NotEmpty(t, m, glob)
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			code := strings.TrimSpace(line)
			if strings.HasPrefix(code, "#") {
				continue
			}
			if i := strings.Index(code, " # "); i >= 0 {
				code = code[:i] // a trailing comment
			}
			if m := privileged.FindStringSubmatch(code); m != nil {
				t.Errorf("%s:%d uses %s, which a chroot or an unprivileged container cannot run: %s", f, i+1, m[2], code)
			}
		}
	}
}
