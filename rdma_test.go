package rdma_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/poller"
	"github.com/go-rdma/rdma/rdmatest"
)

// Rule: Devices never fails on a machine without devices; it lists what
// there is, each device with its provider and ports.
func TestDevices(t *testing.T) {
	devs, err := rdma.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	for _, d := range devs {
		if d.Name == "" || (d.Provider != "verbs" && d.Provider != "soft") {
			t.Errorf("device %+v: missing name or unknown provider", d)
		}
		if d.Usable && len(d.Ports) == 0 {
			t.Errorf("device %s is usable but has no ports", d.Name)
		}
		if !d.Usable && d.Why == "" {
			t.Errorf("device %s is not usable and says no reason", d.Name)
		}
	}
}

// Rule: auto takes verbs when a usable device exists and soft otherwise;
// the choice is visible (Devices lists soft0, a connection reports its
// provider); asking for verbs where there is none is a clear error, not a
// silent fallback.
func TestProviderChoice(t *testing.T) {
	devs, err := rdma.Devices()
	if err != nil {
		t.Fatal(err)
	}
	haveVerbs, haveSoft := false, false
	for _, d := range devs {
		haveVerbs = haveVerbs || d.Provider == rdma.ProviderVerbs && d.Usable
		haveSoft = haveSoft || d.Provider == rdma.ProviderSoft && d.Name == "soft0" && d.Usable
	}
	if !haveSoft {
		t.Errorf("Devices does not list a usable soft0: %+v", devs)
	}
	t.Setenv("RDMA_PROVIDER", "")
	ln, err := rdma.Listen("rdma", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	want := rdma.ProviderSoft
	if haveVerbs {
		want = rdma.ProviderVerbs
	}
	if got := ln.Provider(); got != want {
		t.Errorf("auto chose %q, want %q", got, want)
	}
	ln.Close()

	t.Setenv("RDMA_PROVIDER", "soft")
	ln, err = rdma.Listen("rdma", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if got := ln.Provider(); got != rdma.ProviderSoft {
		t.Errorf("RDMA_PROVIDER=soft chose %q", got)
	}
	ln.Close()

	ln, err = rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderVerbs), rdma.WithDevice("nosuchdev7"))
	if err == nil {
		ln.Close()
		t.Fatal("verbs with a missing device succeeded")
	}
	if !errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), "nosuchdev7") {
		t.Errorf("verbs with a missing device: %v, want ErrNoDevice naming the device", err)
	}
	if !haveVerbs {
		_, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderVerbs))
		if !errors.Is(err, rdma.ErrNoDevice) {
			t.Errorf("verbs without a device: %v, want ErrNoDevice", err)
		}
	}
}

// TestPollSpin: an Adaptive poller spins for as long as a park costs on
// its provider unless WithPollSpin says otherwise.
func TestPollSpin(t *testing.T) {
	eachProvider(t, func(t *testing.T, opts []rdma.Option) {
		c, _ := rdmatest.Pair(t, opts...)
		want := poller.DefaultSpin
		if c.Provider() == rdma.ProviderSoft {
			want = 10 * time.Microsecond
		}
		if got := rdma.ConnPollerConfig(c).Spin; got != want {
			t.Errorf("default spin %v, want %v", got, want)
		}
		c, _ = rdmatest.Pair(t, append(opts, rdma.WithPollSpin(123*time.Microsecond))...)
		if got := rdma.ConnPollerConfig(c).Spin; got != 123*time.Microsecond {
			t.Errorf("WithPollSpin(123µs): spin %v", got)
		}
	})
}
