// Package conformance is the provider conformance suite of go-rdma: the same
// test cases run against every verbs.Provider (the libibverbs provider on
// rxe or hardware, and the pure-Go soft provider), so both keep the rules of
// internal/verbs and of shared/notes/rdma-semantics.md.
//
// Each case states the rule it checks (Rule) and logs it first. Cases build
// their objects through the helpers in this package, which close everything
// children first at the end of the case and check every Close.
package conformance

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/mem"
	"github.com/go-rdma/rdma/internal/verbs"
)

// Target names the provider and the two devices a run uses. A and B may be
// the same device (loopback); then both sides share one open context.
type Target struct {
	Provider         verbs.Provider
	DeviceA, DeviceB string
	// CMConnect connects RC QP qa (on DeviceA) to qb (on DeviceB)
	// through the provider's connection manager (rdma_cm) and returns
	// what to close when the case ends. The suite uses it where a device
	// lacks verbs.FeatureManualConnect (iWARP); nil where the provider
	// has no connection manager.
	CMConnect func(ctx context.Context, qa, qb verbs.QP) (io.Closer, error)
}

// Timeout bounds every single wait of the suite (a completion, an event, a
// state change). RDMA_TEST_TIMEOUT (a time.Duration) overrides it.
var Timeout = 10 * time.Second

func init() {
	if s := os.Getenv("RDMA_TEST_TIMEOUT"); s != "" {
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			Timeout = d
		}
	}
}

// Case is one conformance case: the rule it checks and the check.
type Case struct {
	Name string
	Rule string
	Fn   func(e *Env)
}

// Cases lists every case in the order Run runs them.
func Cases() []Case {
	return []Case{
		{"SendRecv", ruleSendRecv, caseSendRecv},
		{"SendWithImm", ruleSendWithImm, caseSendWithImm},
		{"WriteRead", ruleWriteRead, caseWriteRead},
		{"WriteWithImm", ruleWriteWithImm, caseWriteWithImm},
		{"Atomics", ruleAtomics, caseAtomics},
		{"AtomicContention", ruleAtomicContention, caseAtomicContention},
		{"Inline", ruleInline, caseInline},
		{"Unsignaled", ruleUnsignaled, caseUnsignaled},
		{"RNRRetryExceeded", ruleRNR, caseRNR},
		{"RemoteAccessErrors", ruleRemoteAccess, caseRemoteAccess},
		{"ToErrorFlushes", ruleToError, caseToError},
		{"RecvAfterError", ruleRecvAfterError, caseRecvAfterError},
		{"PostNeedsRTS", rulePostState, casePostState},
		{"ChainStopsAtBadWR", ruleBadChain, caseBadChain},
		{"UnsupportedOpcode", ruleBadOpcode, caseBadOpcode},
		{"AtomicBadArgs", ruleAtomicBadArgs, caseAtomicBadArgs},
		{"RegMRRefusals", ruleRegMR, caseRegMR},
		{"ClosedObjects", ruleClosed, caseClosed},
		{"BusyParents", ruleBusy, caseBusy},
		{"OpenBadDevice", ruleBadDevice, caseBadDevice},
		{"CompChannel", ruleCompChannel, caseCompChannel},
		{"SRQ", ruleSRQ, caseSRQ},
		{"SRQLimit", ruleSRQLimit, caseSRQLimit},
		{"UD", ruleUD, caseUD},
		{"UDNoReceive", ruleUDNoRecv, caseUDNoRecv},
		{"UDWrongAddress", ruleUDWrongAddress, caseUDWrongAddress},
		{"UDRecvTooSmall", ruleUDRecvTooSmall, caseUDRecvTooSmall},
		{"UDGRH", ruleUDGRH, caseUDGRH},
		{"UDMulticast", ruleUDMulticast, caseUDMulticast},
		{"GrantedCaps", ruleCaps, caseCaps},
	}
}

// Run runs every case against tg as subtests of t and prints one summary
// line, "conformance: provider=P device=A/B passed=N failed=M skipped=K",
// that the VM harness greps for. It also checks that the suite left no
// memory mapped by internal/mem.
func Run(t *testing.T, tg Target) {
	t.Helper()
	if tg.Provider == nil {
		t.Fatal("conformance: Target.Provider is nil")
	}
	startMapped := mem.Mapped()
	var passed, failed, skipped int
	var failedNames []string
	for _, c := range Cases() {
		var skip bool
		ok := t.Run(c.Name, func(t *testing.T) {
			defer func() { skip = t.Skipped() }()
			runCase(t, tg, c)
		})
		switch {
		case !ok:
			failed++
			failedNames = append(failedNames, c.Name)
		case skip:
			skipped++
		default:
			passed++
		}
	}
	if n := mem.Mapped(); n != startMapped {
		t.Errorf("mem.Mapped() = %d after the suite, %d before: the suite or the provider leaked mappings", n, startMapped)
	}
	line := fmt.Sprintf("conformance: provider=%s device=%s/%s passed=%d failed=%d skipped=%d",
		tg.Provider.Name(), tg.DeviceA, tg.DeviceB, passed, failed, skipped)
	if len(failedNames) > 0 {
		line += " failed_cases=" + strings.Join(failedNames, ",")
	}
	fmt.Println(line)
}

func runCase(t *testing.T, tg Target, c Case) {
	t.Log("rule: " + c.Rule)
	// A panic inside a provider call is a conformance failure, not a
	// crash of the whole run: report it and let the cleanups run.
	// (t.Fatal and t.Skip use runtime.Goexit, which recover ignores.)
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	e := newEnv(t, tg)
	c.Fn(e)
}
