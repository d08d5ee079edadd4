package conformance

// The suite's own test: a provider wrapper injects one fault at a time
// (wrong immediates, lost or duplicated completions, lost events, ...) into
// the soft provider, and the suite, run in a child process, must fail the
// cases that should notice. One mutation changes nothing observable (extra
// unknown WC flag bits) and the whole suite must still pass, which also
// shows flags are tested with & and never ==.

import (
	"context"
	"math/bits"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdma/internal/soft"
	"github.com/go-rdma/rdma/internal/verbs"
)

const mutEnv = "RDMA_CONFORMANCE_MUTATION"

type mutation struct {
	name string
	// wc changes one polled completion; drop reports it removed, dup
	// that it is delivered twice. n counts the CQ's completions from 1.
	wc func(wc *verbs.WorkCompletion, n int) (drop, dup bool)
	// event reports whether to swallow the n-th channel event (from 1).
	event func(n int) bool
	// async changes one async event; drop reports it removed, dup that
	// it is delivered twice.
	async func(ev *verbs.AsyncEvent) (drop, dup bool)
	// grh rewrites the 40-byte GRH in front of each successful UD
	// receive.
	grh func(b []byte)
	// qp wraps each QP the suite creates.
	qp func(q verbs.QP) verbs.QP
	// attr changes what QueryDevice reports.
	attr func(a *verbs.DeviceAttr)
	// Cases that must fail; nil means the whole suite must pass.
	mustFail []string
}

// udCases are the cases that check UD receives with their GRH flag,
// byte_len and qp_num.
var udCases = []string{"UD", "UDNoReceive", "UDWrongAddress", "UDGRH", "UDMulticast"}

var mutations = []mutation{
	{name: "extra-wc-flag-bits", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		wc.Flags |= 1<<8 | 1<<13
		return false, false
	}},
	{name: "imm-byteswap", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		if wc.Flags&verbs.WCWithImm != 0 {
			wc.Imm = bits.ReverseBytes32(wc.Imm)
		}
		return false, false
	}, mustFail: []string{"SendWithImm", "WriteWithImm", "UD", "CompChannel"}},
	{name: "no-imm-flag", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		wc.Flags &^= verbs.WCWithImm
		return false, false
	}, mustFail: []string{"SendWithImm", "WriteWithImm", "UD", "CompChannel"}},
	{name: "no-grh-flag", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		wc.Flags &^= verbs.WCWithGRH
		return false, false
	}, mustFail: udCases},
	{name: "grh-ipv6-form", grh: func(b []byte) {
		// The same addresses, in the other form than the kernel's.
		if g, err := verbs.ParseGRH(b); err == nil && g.Form == verbs.GRHIPv4 {
			g.Form, g.Src, g.Dst = verbs.GRHIPv6, netip.AddrFrom16(g.SrcGID()), netip.AddrFrom16(g.DstGID())
			_ = g.Put(b)
		}
	}, mustFail: []string{"UDGRH", "UDMulticast"}},
	{name: "grh-wrong-source", grh: func(b []byte) {
		// Another source of the same family (on soft, A and B are one
		// device: the right source equals the destination).
		if g, err := verbs.ParseGRH(b); err == nil {
			g.Src = netip.MustParseAddr("2001:db8::1")
			if g.Form == verbs.GRHIPv4 {
				g.Src = netip.MustParseAddr("192.0.2.1")
			}
			_ = g.Put(b)
		}
	}, mustFail: []string{"UDGRH", "UDMulticast"}},
	{name: "claims-no-multicast", attr: func(a *verbs.DeviceAttr) { a.MaxMcastGrp = 0 },
		// The device says it has no multicast, yet AttachMcast does not
		// say ErrNotSupported.
		mustFail: []string{"UDMulticast"}},
	{name: "mcast-attach-ignored", qp: func(q verbs.QP) verbs.QP { return mcastQP{QP: q, attach: false, detach: true} },
		mustFail: []string{"UDMulticast"}},
	{name: "mcast-detach-ignored", qp: func(q verbs.QP) verbs.QP { return mcastQP{QP: q, attach: true, detach: false} },
		mustFail: []string{"UDMulticast"}},
	{name: "drop-7th-completion", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		return n == 7, false
	}, mustFail: []string{"SendRecv", "AtomicContention", "CompChannel"}},
	{name: "duplicate-flushes", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		return false, wc.Status == verbs.WCWRFlushErr
	}, mustFail: []string{"RNRRetryExceeded", "RemoteAccessErrors", "ToErrorFlushes", "RecvAfterError", "ChainStopsAtBadWR", "GrantedCaps"}},
	{name: "recv-byte-len-off-by-one", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		if wc.Status == verbs.WCSuccess && wc.Opcode&verbs.WCRecv != 0 {
			wc.ByteLen++
		}
		return false, false
	}, mustFail: append([]string{"SendRecv", "SendWithImm", "Inline", "SRQ"}, udCases...)},
	{name: "wrong-qpn", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		wc.QPN ^= 0x100
		return false, false
	}, mustFail: append([]string{"SendRecv", "SendWithImm", "WriteWithImm", "RNRRetryExceeded", "RemoteAccessErrors", "ToErrorFlushes", "SRQ", "CompChannel", "UDRecvTooSmall"}, udCases...)},
	{name: "errors-reported-as-success", wc: func(wc *verbs.WorkCompletion, n int) (bool, bool) {
		if wc.Status != verbs.WCSuccess && wc.Status != verbs.WCWRFlushErr {
			wc.Status = verbs.WCSuccess
		}
		return false, false
	}, mustFail: []string{"RNRRetryExceeded", "RemoteAccessErrors", "RecvAfterError"}},
	{name: "lose-every-5th-event", event: func(n int) bool { return n%5 == 0 },
		mustFail: []string{"CompChannel"}},
	{name: "lose-srq-limit-events", async: func(ev *verbs.AsyncEvent) (bool, bool) {
		return ev.Type == verbs.EventSRQLimitReached, false
	}, mustFail: []string{"SRQLimit"}},
	{name: "repeat-srq-limit-events", async: func(ev *verbs.AsyncEvent) (bool, bool) {
		return false, ev.Type == verbs.EventSRQLimitReached
	}, mustFail: []string{"SRQLimit"}},
	{name: "srq-events-name-no-srq", async: func(ev *verbs.AsyncEvent) (bool, bool) {
		ev.SRQ = nil
		return false, false
	}, mustFail: []string{"SRQLimit"}},
}

func mutationNamed(name string) *mutation {
	for i := range mutations {
		if mutations[i].name == name {
			return &mutations[i]
		}
	}
	return nil
}

func init() {
	if name := os.Getenv(mutEnv); name != "" {
		m := mutationNamed(name)
		register("soft-mutant", func(t *testing.T) Target {
			if m == nil {
				t.Fatalf("%s=%q: no such mutation", mutEnv, name)
			}
			a, b := pickDevices(t, soft.Provider, "RDMA_TEST_SOFT_DEVICES")
			return Target{Provider: mProvider{Provider: soft.Provider, m: m}, DeviceA: a, DeviceB: b}
		})
	}
}

var summaryRE = regexp.MustCompile(`(?m)^conformance: provider=\S+ device=\S+ passed=(\d+) failed=(\d+) skipped=(\d+)(?: failed_cases=(\S+))?$`)

// TestSuiteCatchesFaults runs the suite against each mutant of the soft
// provider in a child process and checks the cases that must notice the
// fault failed.
func TestSuiteCatchesFaults(t *testing.T) {
	if os.Getenv(mutEnv) != "" {
		t.Skip("inside a mutant run")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	if os.Getenv("RDMA_VM") == "1" {
		t.Skip("the suite's self-test needs only the soft provider; it runs on the host, not in the VM")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mutations {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel() // the children mostly wait out timeouts
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, "-test.run", "^TestConformance$", "-test.count=1")
			cmd.Env = append(os.Environ(), mutEnv+"="+m.name, "RDMA_TEST_PROVIDERS=soft-mutant", "RDMA_TEST_REQUIRE_DEVICE=1")
			if m.mustFail != nil {
				cmd.Env = append(cmd.Env, "RDMA_TEST_TIMEOUT=1s")
			}
			out, _ := cmd.CombinedOutput()
			sm := summaryRE.FindSubmatch(out)
			if sm == nil {
				t.Fatalf("no summary line from the mutant run:\n%s", out)
			}
			failed := strings.Split(string(sm[4]), ",")
			if len(sm[4]) == 0 {
				failed = nil
			}
			t.Logf("mutation %s: passed=%s failed=%s skipped=%s failed_cases=%s", m.name, sm[1], sm[2], sm[3], sm[4])
			if m.mustFail == nil {
				if len(failed) > 0 {
					t.Errorf("mutation %s changes nothing a case may check, yet cases failed: %v\n%s", m.name, failed, out)
				}
				return
			}
			for _, c := range m.mustFail {
				if !slices.Contains(failed, c) {
					t.Errorf("mutation %s: case %s did not notice (failed cases: %v)", m.name, c, failed)
				}
			}
		})
	}
}

// The wrappers: only what carries completions and events is wrapped; the
// rest is the soft provider's own objects.

type mProvider struct {
	verbs.Provider
	m *mutation
}

func (p mProvider) Open(name string) (verbs.Context, error) {
	c, err := p.Provider.Open(name)
	if err != nil {
		return nil, err
	}
	return &mCtx{Context: c, m: p.m, cqs: map[verbs.CQ]*mCQ{}, recvs: map[[2]uint64]uint64{}}, nil
}

type mCtx struct {
	verbs.Context
	m       *mutation
	mu      sync.Mutex
	cqs     map[verbs.CQ]*mCQ
	pending []verbs.AsyncEvent // duplicates still to deliver
	// For grh mutations: the MRs, and the address of the first SGE of
	// each posted receive by QP number and wr_id.
	mrs   []verbs.MR
	recvs map[[2]uint64]uint64
}

// grhOf is the GRH at the start of the receive wc completes, or nil.
func (c *mCtx) grhOf(wc *verbs.WorkCompletion) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	addr, ok := c.recvs[[2]uint64{uint64(wc.QPN), wc.WRID}]
	if !ok {
		return nil
	}
	for _, m := range c.mrs {
		if addr >= m.Addr() && addr+verbs.GRHSize <= m.Addr()+uint64(m.Len()) {
			off := addr - m.Addr()
			return m.Bytes()[off : off+verbs.GRHSize]
		}
	}
	return nil
}

func (c *mCtx) AsyncEvent(ctx context.Context) (verbs.AsyncEvent, error) {
	c.mu.Lock()
	if len(c.pending) > 0 {
		ev := c.pending[0]
		c.pending = c.pending[1:]
		c.mu.Unlock()
		return ev, nil
	}
	c.mu.Unlock()
	for {
		ev, err := c.Context.AsyncEvent(ctx)
		if err != nil || c.m.async == nil {
			return ev, err
		}
		drop, dup := c.m.async(&ev)
		if drop {
			continue
		}
		if dup {
			c.mu.Lock()
			c.pending = append(c.pending, ev)
			c.mu.Unlock()
		}
		return ev, nil
	}
}

func (c *mCtx) QueryDevice() (verbs.DeviceAttr, error) {
	a, err := c.Context.QueryDevice()
	if err == nil && c.m.attr != nil {
		c.m.attr(&a)
	}
	return a, err
}

func (c *mCtx) AllocPD() (verbs.PD, error) {
	pd, err := c.Context.AllocPD()
	if err != nil {
		return nil, err
	}
	return &mPD{PD: pd, c: c}, nil
}

func (c *mCtx) CreateCompChannel() (verbs.CompChannel, error) {
	ch, err := c.Context.CreateCompChannel()
	if err != nil {
		return nil, err
	}
	return &mChan{CompChannel: ch, c: c}, nil
}

func (c *mCtx) CreateCQ(n int, ch verbs.CompChannel) (verbs.CQ, error) {
	if w, ok := ch.(*mChan); ok {
		ch = w.CompChannel
	}
	cq, err := c.Context.CreateCQ(n, ch)
	if err != nil {
		return nil, err
	}
	w := &mCQ{CQ: cq, m: c.m, c: c}
	c.mu.Lock()
	c.cqs[cq] = w
	c.mu.Unlock()
	return w, nil
}

type mPD struct {
	verbs.PD
	c *mCtx
}

func (p *mPD) RegMR(buf []byte, acc verbs.Access) (verbs.MR, error) {
	m, err := p.PD.RegMR(buf, acc)
	if err == nil && p.c.m.grh != nil {
		p.c.mu.Lock()
		p.c.mrs = append(p.c.mrs, m)
		p.c.mu.Unlock()
	}
	return m, err
}

// mQP records the receives it posts, for grh mutations.
type mQP struct {
	verbs.QP
	c *mCtx
}

func (q mQP) PostRecv(wrs []verbs.RecvWR) (int, error) {
	q.c.mu.Lock()
	for _, w := range wrs {
		if len(w.SGL) > 0 {
			q.c.recvs[[2]uint64{uint64(q.QPN()), w.ID}] = w.SGL[0].Addr
		}
	}
	q.c.mu.Unlock()
	return q.QP.PostRecv(wrs)
}

// mcastQP passes AttachMcast (attach) and DetachMcast (detach) on, or
// ignores them and says nil.
type mcastQP struct {
	verbs.QP
	attach, detach bool
}

func (q mcastQP) AttachMcast(gid verbs.GID, lid uint16) error {
	if !q.attach {
		return nil
	}
	return q.QP.AttachMcast(gid, lid)
}

func (q mcastQP) DetachMcast(gid verbs.GID, lid uint16) error {
	if !q.detach {
		return nil
	}
	return q.QP.DetachMcast(gid, lid)
}

func (p *mPD) CreateQP(a verbs.QPInit) (verbs.QP, error) {
	if w, ok := a.SendCQ.(*mCQ); ok {
		a.SendCQ = w.CQ
	}
	if w, ok := a.RecvCQ.(*mCQ); ok {
		a.RecvCQ = w.CQ
	}
	q, err := p.PD.CreateQP(a)
	if err != nil {
		return nil, err
	}
	if p.c.m.grh != nil {
		q = mQP{QP: q, c: p.c}
	}
	if p.c.m.qp != nil {
		q = p.c.m.qp(q)
	}
	return q, nil
}

type mChan struct {
	verbs.CompChannel
	c  *mCtx
	mu sync.Mutex
	n  int
}

func (ch *mChan) GetEvent(ctx context.Context) (verbs.CQ, error) {
	for {
		cq, err := ch.CompChannel.GetEvent(ctx)
		if err != nil {
			return nil, err
		}
		ch.c.mu.Lock()
		w := ch.c.cqs[cq]
		ch.c.mu.Unlock()
		ch.mu.Lock()
		ch.n++
		swallow := ch.c.m.event != nil && ch.c.m.event(ch.n)
		ch.mu.Unlock()
		if swallow {
			w.AckEvents(1)
			continue
		}
		return w, nil
	}
}

type mCQ struct {
	verbs.CQ
	m       *mutation
	c       *mCtx
	mu      sync.Mutex
	n       int
	pending []verbs.WorkCompletion
}

func (q *mCQ) Poll(wc []verbs.WorkCompletion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	k := copy(wc, q.pending)
	q.pending = q.pending[k:]
	if k == len(wc) {
		return k, nil
	}
	n, err := q.CQ.Poll(wc[k:])
	if err == nil && q.m.grh != nil {
		for i := k; i < k+n; i++ {
			if wc[i].Status == verbs.WCSuccess && wc[i].Flags&verbs.WCWithGRH != 0 {
				if b := q.c.grhOf(&wc[i]); b != nil {
					q.m.grh(b)
				}
			}
		}
	}
	if err != nil || q.m.wc == nil {
		return k + n, err
	}
	out := k
	for i := k; i < k+n; i++ {
		c := wc[i]
		q.n++
		drop, dup := q.m.wc(&c, q.n)
		if drop {
			continue
		}
		wc[out] = c
		out++
		if dup {
			q.pending = append(q.pending, c)
		}
	}
	return out, nil
}
