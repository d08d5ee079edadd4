// Command http3 runs HTTP/3 (quic-go) over RDMA datagrams. An
// rdma.PacketConn is a net.PacketConn over a UD queue pair, so
// quic.Transport{Conn: pc} runs QUIC over it, and quic-go's http3 server
// and client over that, unchanged.
//
//	http3 [-n 2000] [-size 1024] [-c 1]   # server and client, over RDMA
//	http3 -udp                            # the same over UDP on loopback
//	http3 -compare                        # both, and the ratio RDMA/UDP
//
// Each run starts a server (a self-signed certificate made at start-up,
// ALPN h3) on -addr and a client on -client, sends -n GETs of -size bytes
// from -c goroutines, checks every byte of every body, and prints
// requests/s and the p50 and p99 latency. Exit codes: 0 ok, 1 errors,
// 2 bad usage.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/go-rdma/rdma"
)

// minDatagram is the smallest datagram QUIC allows a path (RFC 9000
// 14.1): a PacketConn whose path MTU is smaller (rxe on an Ethernet MTU
// of 1500 has 1024) cannot carry its Initial packets.
const minDatagram = 1200

// quietBuffers turns off quic-go's warning about socket buffer sizes.
const quietBuffers = "QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING"

// Options of one run.
type Options struct {
	UDP      bool   // over a UDP socket rather than an rdma.PacketConn
	Provider string // the rdma provider: auto, verbs or soft
	Addr     string // the server's ip:port
	Client   string // the client's ip:port
	N        int    // requests
	Size     int    // bytes of each response
	Conc     int    // goroutines sending them
}

// Result of a run.
type Result struct {
	Net      string        // "rdma (soft, 4096)" or "udp"
	Requests int           // requests that succeeded
	Elapsed  time.Duration // for all of them
	P50, P99 time.Duration // latency of one
}

func (r Result) String() string {
	return fmt.Sprintf("%-20s %6d requests in %7.3fs: %8.0f requests/s, p50 %v, p99 %v",
		r.Net, r.Requests, r.Elapsed.Seconds(), r.PerSecond(), r.P50, r.P99)
}

// PerSecond is the requests per second.
func (r Result) PerSecond() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

func main() {
	var o Options
	flag.BoolVar(&o.UDP, "udp", false, "run over UDP instead of RDMA")
	compare := flag.Bool("compare", false, "run over RDMA, then over UDP, and compare")
	flag.StringVar(&o.Provider, "provider", rdma.ProviderAuto, "rdma provider: auto, verbs or soft")
	flag.StringVar(&o.Addr, "addr", "127.0.0.1:0", "the server's ip:port")
	flag.StringVar(&o.Client, "client", "", "the client's ip:port (default: the server's ip, port 0)")
	flag.IntVar(&o.N, "n", 2000, "requests")
	flag.IntVar(&o.Size, "size", 1024, "bytes of each response")
	flag.IntVar(&o.Conc, "c", 1, "concurrent requests")
	flag.Parse()
	if flag.NArg() != 0 || o.N < 1 || o.Size < 0 || o.Conc < 1 || *compare && o.UDP {
		flag.Usage()
		os.Exit(2)
	}
	if !o.UDP && os.Getenv(quietBuffers) == "" {
		// An rdma.PacketConn has no socket buffers to size (its receive
		// depth is rdma.WithQueueDepth's), so quic-go's warning that it
		// cannot raise one does not apply. Its warning for UDP sockets
		// goes too in -compare mode: it warns once per process.
		os.Setenv(quietBuffers, "true")
	}
	if err := run(o, *compare); err != nil {
		fmt.Fprintln(os.Stderr, "http3:", err)
		os.Exit(1)
	}
}

func run(o Options, compare bool) error {
	r, err := Run(o)
	if err != nil {
		return err
	}
	fmt.Println(r)
	if !compare {
		return nil
	}
	o.UDP = true
	u, err := Run(o)
	if err != nil {
		return err
	}
	fmt.Println(u)
	fmt.Printf("RDMA/UDP: %.2fx the requests/s, %.2fx the p50 latency\n",
		r.PerSecond()/u.PerSecond(), float64(r.P50)/float64(u.P50))
	return nil
}

// Run starts a server and a client as o says, runs the requests and
// closes both.
func Run(o Options) (Result, error) {
	if o.Client == "" {
		host, _, err := net.SplitHostPort(o.Addr)
		if err != nil {
			return Result{}, err
		}
		o.Client = net.JoinHostPort(host, "0")
	}
	spc, name, err := listen(o, o.Addr)
	if err != nil {
		return Result{}, err
	}
	defer spc.Close()
	cpc, _, err := listen(o, o.Client)
	if err != nil {
		return Result{}, err
	}
	defer cpc.Close()

	srv, cert, err := serve(spc)
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()

	// The client's QUIC transport on its own PacketConn. http3.Transport
	// dials through it; the address it resolves is the server's ip:port,
	// a *net.UDPAddr, which an rdma.PacketConn takes as well.
	ctr := &quic.Transport{Conn: cpc}
	defer ctr.Close()
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	h3 := &http3.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		QUICConfig:      quicConfig(cpc),
		Dial: func(ctx context.Context, addr string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			ua, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				return nil, err
			}
			return ctr.DialEarly(ctx, ua, tc, qc)
		},
	}
	defer h3.Close()
	client := &http.Client{Transport: h3, Timeout: 10 * time.Second}

	lat := make([]time.Duration, o.N)
	errs := make([]error, o.Conc)
	url := "https://" + spc.LocalAddr().String() + "/bytes?n=" + strconv.Itoa(o.Size) + "&seed="
	var wg sync.WaitGroup
	start := time.Now()
	for g := range o.Conc {
		wg.Go(func() {
			for i := g; i < o.N && errs[g] == nil; i += o.Conc {
				t := time.Now()
				errs[g] = get(client, url, i, o.Size)
				lat[i] = time.Since(t)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return Result{}, fmt.Errorf("%s: %w", name, err)
	}
	slices.Sort(lat)
	return Result{Net: name, Requests: o.N, Elapsed: elapsed,
		P50: lat[len(lat)/2], P99: lat[len(lat)*99/100]}, nil
}

// listen opens the PacketConn of one side: a UDP socket, or an
// rdma.PacketConn whose datagrams are large enough for QUIC.
func listen(o Options, addr string) (net.PacketConn, string, error) {
	if o.UDP {
		pc, err := net.ListenPacket("udp", addr)
		return pc, "udp", err
	}
	pc, err := rdma.ListenPacket("rdma", addr, rdma.WithProvider(o.Provider))
	if err != nil {
		return nil, "", err
	}
	if pc.MaxDatagram() < minDatagram {
		pc.Close()
		return nil, "", fmt.Errorf("%s on %s: datagrams of at most %d bytes (its path MTU), and QUIC needs %d: raise the MTU of the device's network interface (rxe's path MTU follows it: 4096 takes an interface MTU of 4096+headers, e.g. 9000)",
			addr, pc.Device(), pc.MaxDatagram(), minDatagram)
	}
	return pc, fmt.Sprintf("rdma (%s, %d)", pc.Provider(), pc.MaxDatagram()), nil
}

// quicConfig is the QUIC configuration of a side. quic-go finds a UDP
// socket's path MTU (DPLPMTUD, which needs the DF bit), not a
// PacketConn's: it would send packets of 1280 bytes. An rdma.PacketConn
// knows its path MTU, so its packets start at the largest quic-go sends
// (1452 bytes) where they fit.
func quicConfig(pc net.PacketConn) *quic.Config {
	c := &quic.Config{}
	if p, ok := pc.(*rdma.PacketConn); ok {
		c.InitialPacketSize = uint16(min(p.MaxDatagram(), 1452))
	}
	return c
}

// server is an HTTP/3 server on a PacketConn.
type server struct {
	tr   *quic.Transport
	ln   *quic.EarlyListener
	h3   *http3.Server
	done chan error
}

// serve starts an HTTP/3 server on pc, with a certificate made for its
// IP, which it returns for the client to trust.
func serve(pc net.PacketConn) (*server, *x509.Certificate, error) {
	cert, err := selfSigned(pc.LocalAddr())
	if err != nil {
		return nil, nil, err
	}
	tr := &quic.Transport{Conn: pc}
	tc := http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}})
	ln, err := tr.ListenEarly(tc, quicConfig(pc))
	if err != nil {
		tr.Close()
		return nil, nil, err
	}
	s := &server{tr: tr, ln: ln, h3: &http3.Server{Handler: handler()}, done: make(chan error, 1)}
	go func() { s.done <- s.h3.ServeListener(ln) }()
	return s, cert.Leaf, nil
}

// Close stops the server; its PacketConn stays open.
func (s *server) Close() error {
	err := s.h3.Close()
	s.ln.Close()
	<-s.done // ServeListener has returned
	return errors.Join(err, s.tr.Close())
}

// handler answers GET /bytes?n=N&seed=S with N bytes of pattern(S).
func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err1 := strconv.Atoi(r.URL.Query().Get("n"))
		seed, err2 := strconv.Atoi(r.URL.Query().Get("seed"))
		if err := errors.Join(err1, err2); err != nil || n < 0 || n > 64<<20 {
			http.Error(w, "bad n or seed", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(pattern(seed, n))
	})
	return mux
}

// pattern is the body of request seed: it differs from one request to
// the next, so a body delivered to the wrong request fails the check.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed + i*7)
	}
	return b
}

// get sends request i and checks every byte of its body.
func get(c *http.Client, url string, i, size int) error {
	resp, err := c.Get(url + strconv.Itoa(i))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("request %d: %w", i, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("request %d: %s", i, resp.Status)
	}
	want := pattern(i, size)
	if len(body) != len(want) {
		return fmt.Errorf("request %d: %d bytes, want %d", i, len(body), len(want))
	}
	for j := range body {
		if body[j] != want[j] {
			return fmt.Errorf("request %d: byte %d is %#x, want %#x", i, j, body[j], want[j])
		}
	}
	return nil
}

// selfSigned makes a certificate for addr's IP, valid for a day.
func selfSigned(addr net.Addr) (tls.Certificate, error) {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP(host)},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
