package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
)

// build compiles rdmacat into a temporary directory, or returns
// $RDMACAT_BIN: the VM (test.sh) runs these tests with a binary built on
// the host.
func build(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("RDMACAT_BIN"); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), "rdmacat")
	// go test puts its own GOROOT/bin first in PATH, so this is the go
	// command that runs the test.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command to build rdmacat with (set RDMACAT_BIN to a built one): %v", err)
	}
	out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// listen starts "sh -c script" where script runs rdmacat -l -v on a free
// port, and returns the address it listens on, read from its stderr.
// The returned wait function waits for the process and returns the rest
// of its stderr.
func listen(t *testing.T, ctx context.Context, script string) (wait func() (string, error), addr string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "sh", "-c", script)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stderr)
	line, err := br.ReadString('\n')
	const prefix = "rdmacat: listening on "
	if err != nil || !strings.HasPrefix(line, prefix) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("listener said %q, %v", line, err)
	}
	rest := new(bytes.Buffer)
	copied := make(chan struct{})
	go func() {
		io.Copy(rest, br) // until the process ends
		close(copied)
	}()
	wait = func() (string, error) {
		<-copied
		err := cmd.Wait()
		return rest.String(), err
	}
	return wait, strings.TrimSpace(strings.TrimPrefix(line, prefix))
}

func randomFile(t *testing.T, n int) (string, []byte) {
	t.Helper()
	data := make([]byte, n)
	rand.Read(data)
	path := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, data
}

// TestPipe: "rdmacat -l ADDR > out" receives what "cat in | rdmacat
// ADDR" sends, byte for byte, both as shell pipelines; then the other
// way round, the listener sending its stdin to a receive-only dialer.
// On soft always; on verbs where a device is usable (rxe in the VM),
// with less data, since rxe under emulation moves tens of MB/s.
func TestPipe(t *testing.T) {
	bin := build(t)
	t.Run("soft", func(t *testing.T) { testPipe(t, bin, "soft", 24<<20) })
	t.Run("verbs", func(t *testing.T) {
		devs, err := rdma.Devices()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(devs, func(d rdma.Device) bool { return d.Provider == rdma.ProviderVerbs && d.Usable }) {
			if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
				t.Fatal("no usable verbs device and RDMA_TEST_REQUIRE_DEVICE=1")
			}
			t.Skip("no usable verbs device; ./test.sh runs this on rxe in a VM")
		}
		testPipe(t, bin, "verbs", 4<<20)
	})
}

func testPipe(t *testing.T, bin, provider string, size int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in, data := randomFile(t, size)
	out := filepath.Join(t.TempDir(), "out")

	recv, addr := listen(t, ctx, bin+" -l -v -provider "+provider+" 127.0.0.1:0 > "+out+" < /dev/null")
	send := exec.CommandContext(ctx, "sh", "-c", "cat "+in+" | "+bin+" -v -provider "+provider+" "+addr)
	var sendErr bytes.Buffer
	send.Stderr = &sendErr
	if err := send.Run(); err != nil {
		recvErr, rerr := recv()
		t.Fatalf("sender: %v\n%s\nreceiver: %v\n%s", err, sendErr.String(), rerr, recvErr)
	}
	recvErr, err := recv()
	if err != nil {
		t.Fatalf("receiver: %v\n%s", err, recvErr)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("received %d bytes, sent %d: not the same", len(got), len(data))
	}
	if !strings.Contains(sendErr.String(), "Gb/s") || !strings.Contains(recvErr, fmt.Sprintf("received %d bytes", size)) {
		t.Errorf("-v output lacks the summary:\n%s\n%s", sendErr.String(), recvErr)
	}

	// The listener sends, the dialer receives.
	srv, addr := listen(t, ctx, bin+" -l -v -provider "+provider+" 127.0.0.1:0 < "+in)
	cli := exec.CommandContext(ctx, bin, "-d", "-provider", provider, addr)
	var cliOut, cliErr bytes.Buffer
	cli.Stdout, cli.Stderr = &cliOut, &cliErr
	if err := cli.Run(); err != nil {
		t.Fatalf("dialer: %v\n%s", err, cliErr.String())
	}
	if srvErr, err := srv(); err != nil {
		t.Fatalf("listener: %v\n%s", err, srvErr)
	}
	if !bytes.Equal(cliOut.Bytes(), data) {
		t.Fatalf("dialer received %d bytes, want %d", cliOut.Len(), len(data))
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err == nil {
		return 0
	}
	return -1
}

// TestExitCodes: bad usage is 2; no listener at the address is 1; a
// receiver killed mid-stream makes the sender exit 1.
func TestExitCodes(t *testing.T) {
	bin := build(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{{}, {"a", "b"}, {"-nope", "x:1"}, {"-provider", "bogus", "127.0.0.1:1"}} {
		if code := exitCode(exec.CommandContext(ctx, bin, args...).Run()); code != exitUsage {
			t.Errorf("rdmacat %q: exit %d, want %d", args, code, exitUsage)
		}
	}
	// A port where nothing listens.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := tl.Addr().String()
	tl.Close()
	cmd := exec.CommandContext(ctx, bin, "-provider", "soft", free)
	cmd.Stdin = strings.NewReader("x")
	if code := exitCode(cmd.Run()); code != exitConn {
		t.Errorf("dial to a closed port: exit %d, want %d", code, exitConn)
	}

	// The receiver is killed while the sender streams /dev/zero.
	recv := exec.CommandContext(ctx, bin, "-l", "-v", "-d", "-provider", "soft", "127.0.0.1:0")
	stdout, _ := recv.StdoutPipe()
	stderr, _ := recv.StderrPipe()
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	defer recv.Wait()
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimSpace(strings.TrimPrefix(line, "rdmacat: listening on "))
	send := exec.CommandContext(ctx, bin, "-provider", "soft", addr)
	zero, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer zero.Close()
	send.Stdin = zero
	var sendErr bytes.Buffer
	send.Stderr = &sendErr
	if err := send.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, stdout, 4<<20); err != nil {
		t.Fatal(err)
	}
	recv.Process.Kill()
	if code := exitCode(send.Wait()); code != exitConn {
		t.Errorf("sender whose receiver was killed: exit %d, want %d\n%s", code, exitConn, sendErr.String())
	}
}
