package rdma_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/testchild"
)

// noLibMessage is what the "nolib" child sends itself over auto.
const noLibMessage = "one binary everywhere"

// noLibReport is what the "nolib" child saw, for the parent to check.
type noLibReport struct {
	Devices          []noLibDevice
	ListenerProvider string
	DialProvider     string
	Received         string // the message, as the listener's side got it
	VerbsErr         string // Listen with the verbs provider; "" when it worked
	VerbsNoDevice    bool
	VerbsUnsupported bool
	CMListenErr      string // Listen and Dial through rdma_cm; "" when they worked
	CMDialErr        string
	CMUnsupported    bool
	Failed           string // the step that had to work and did not, with its error
}

type noLibDevice struct {
	Name, Provider, Why string
	Usable              bool
}

// Rule: the same binary runs where rdma-core cannot be loaded. The child
// is this test binary with $GO_RDMA_LIBIBVERBS and $GO_RDMA_LIBRDMACM
// naming files that do not exist, which is what a machine without
// rdma-core looks like to the loader: every verbs device is listed as
// unusable and says why, auto takes soft and moves a message, asking for
// verbs is ErrNoDevice and ErrNotSupported, and rdma_cm is
// ErrNotSupported. Without librdmacm alone only rdma_cm fails. In the VM
// the rxe device is there, and hidden in the first case.
func TestWithoutRDMACore(t *testing.T) {
	withLib, err := rdma.Devices()
	require.NoError(t, err)
	var verbsDevs []string
	verbsUsable := false
	for _, d := range withLib {
		if d.Provider == rdma.ProviderVerbs {
			verbsDevs = append(verbsDevs, d.Name)
			verbsUsable = verbsUsable || d.Usable
		}
	}
	if os.Getenv("RDMA_TEST_REQUIRE_DEVICE") == "1" {
		require.True(t, verbsUsable, "RDMA_TEST_REQUIRE_DEVICE=1 but no usable verbs device: %+v", withLib)
	}
	const noVerbs, noCM = "/nonexistent/libibverbs.so.1", "/nonexistent/librdmacm.so.1"

	t.Run("no_libraries", func(t *testing.T) {
		r := runNoLibChild(t, "GO_RDMA_LIBIBVERBS="+noVerbs, "GO_RDMA_LIBRDMACM="+noCM)
		var hidden []string
		soft0 := false
		for _, d := range r.Devices {
			switch d.Provider {
			case rdma.ProviderVerbs:
				hidden = append(hidden, d.Name)
				assert.False(t, d.Usable, "verbs device %s is usable without libibverbs", d.Name)
				assert.Contains(t, d.Why, "libibverbs could not be loaded from "+noVerbs, "device %s", d.Name)
			case rdma.ProviderSoft:
				soft0 = soft0 || d.Name == "soft0" && d.Usable
			}
		}
		assert.Equal(t, verbsDevs, hidden, "the child lists the verbs devices the parent does")
		assert.True(t, soft0, "no usable soft0 in %+v", r.Devices)
		assert.Equal(t, rdma.ProviderSoft, r.ListenerProvider, "auto's listener")
		assert.Equal(t, rdma.ProviderSoft, r.DialProvider, "auto's dialer")
		assert.Equal(t, noLibMessage, r.Received)
		assert.True(t, r.VerbsNoDevice && r.VerbsUnsupported, "verbs: %q, want ErrNoDevice and ErrNotSupported", r.VerbsErr)
		assert.Contains(t, r.VerbsErr, "libibverbs could not be loaded")
		assert.True(t, r.CMUnsupported, "rdma_cm: listen %q, dial %q, want ErrNotSupported", r.CMListenErr, r.CMDialErr)
		assert.Contains(t, r.CMListenErr, "libibverbs could not be loaded")
		assert.Contains(t, r.CMDialErr, "libibverbs could not be loaded")
	})

	t.Run("no_rdmacm", func(t *testing.T) {
		r := runNoLibChild(t, "GO_RDMA_LIBRDMACM="+noCM)
		for _, d := range r.Devices {
			for _, p := range withLib {
				if p.Name == d.Name && p.Provider == d.Provider {
					assert.Equal(t, p.Usable, d.Usable, "device %s: usable without librdmacm (%s)", d.Name, d.Why)
				}
			}
		}
		want := rdma.ProviderSoft
		if verbsUsable {
			want = rdma.ProviderVerbs
		}
		assert.Equal(t, want, r.ListenerProvider, "auto's listener")
		assert.Equal(t, want, r.DialProvider, "auto's dialer")
		assert.Equal(t, noLibMessage, r.Received)
		if verbsUsable {
			assert.Empty(t, r.VerbsErr, "listen on verbs without librdmacm")
		}
		assert.True(t, r.CMUnsupported, "rdma_cm: listen %q, dial %q, want ErrNotSupported", r.CMListenErr, r.CMDialErr)
		// rdma_cm needs libibverbs first: on a machine without rdma-core
		// (a fresh CI host) that is the library the error names.
		why := "librdmacm could not be loaded from " + noCM
		if ibv.Available() != nil {
			why = "libibverbs could not be loaded"
		}
		assert.Contains(t, r.CMListenErr, why)
		assert.Contains(t, r.CMDialErr, why)
	})
}

// runNoLibChild runs the "nolib" child with env and returns its report.
func runNoLibChild(t *testing.T, env ...string) noLibReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := testchild.Command(ctx, "nolib", append([]string{"RDMA_PROVIDER="}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var r noLibReport
	require.NoError(t, json.Unmarshal(out, &r), "child output %q, stderr %q, exit %v", out, stderr.String(), err)
	require.Empty(t, r.Failed, "child stderr %q", stderr.String())
	require.NoError(t, err, "child stderr %q", stderr.String())
	return r
}

// noLibChild is the child of TestWithoutRDMACore: it prints a
// noLibReport as JSON, and exits 1 if a step that had to work failed.
func noLibChild() int {
	var r noLibReport
	err := noLibSteps(&r)
	if err != nil {
		r.Failed = err.Error()
	}
	if json.NewEncoder(os.Stdout).Encode(&r) != nil || err != nil {
		return 1
	}
	return 0
}

func noLibSteps(r *noLibReport) error {
	devs, err := rdma.Devices()
	if err != nil {
		return fmt.Errorf("devices: %w", err)
	}
	for _, d := range devs {
		r.Devices = append(r.Devices, noLibDevice{Name: d.Name, Provider: d.Provider, Why: d.Why, Usable: d.Usable})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := noLibPair(ctx, r); err != nil {
		return err
	}

	// What may fail, and how: the parent knows which should.
	if l, err := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithProvider(rdma.ProviderVerbs)); err == nil {
		l.Close()
	} else {
		r.VerbsErr = err.Error()
		r.VerbsNoDevice = errors.Is(err, rdma.ErrNoDevice)
		r.VerbsUnsupported = errors.Is(err, rdma.ErrNotSupported)
	}
	l, lerr := rdma.Listen("rdma", "127.0.0.1:0", rdma.WithRDMACM())
	if lerr == nil {
		l.Close()
		return errors.New("listen through rdma_cm without librdmacm succeeded")
	}
	c, derr := rdma.Dial(ctx, "rdma", "127.0.0.1:7471", rdma.WithRDMACM())
	if derr == nil {
		c.Close()
		return errors.New("dial through rdma_cm without librdmacm succeeded")
	}
	r.CMListenErr, r.CMDialErr = lerr.Error(), derr.Error()
	r.CMUnsupported = errors.Is(lerr, rdma.ErrNotSupported) && errors.Is(derr, rdma.ErrNotSupported)
	return nil
}

// noLibPair listens and dials on auto and sends noLibMessage across.
func noLibPair(ctx context.Context, r *noLibReport) error {
	auto := rdma.WithProvider(rdma.ProviderAuto)
	ln, err := rdma.Listen("rdma", "127.0.0.1:0", auto)
	if err != nil {
		return fmt.Errorf("listen on auto: %w", err)
	}
	defer ln.Close()
	r.ListenerProvider = ln.Provider()
	type accepted struct {
		c   *rdma.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept(ctx)
		acc <- accepted{c, err}
	}()
	c, err := rdma.Dial(ctx, "rdma", ln.Addr().String(), auto)
	if err != nil {
		return fmt.Errorf("dial on auto: %w", err)
	}
	defer c.Close()
	r.DialProvider = c.Provider()
	a := <-acc
	if a.err != nil {
		return fmt.Errorf("accept on auto: %w", a.err)
	}
	defer a.c.Close()
	b, err := c.Alloc(len(noLibMessage))
	if err != nil {
		return fmt.Errorf("alloc: %w", err)
	}
	defer b.Release()
	copy(b.Bytes(), noLibMessage)
	recv := a.c.Recv()
	if err := c.Send(b).Wait(ctx); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	if err := recv.Wait(ctx); err != nil {
		return fmt.Errorf("recv: %w", err)
	}
	got := recv.Buffer()
	defer got.Release()
	r.Received = string(got.Bytes()[:recv.Len()])
	return nil
}
