// Command http runs net/http over RDMA: the server is an ordinary
// http.Server serving a stream.Listen listener, and the client an
// ordinary http.Client whose Transport dials with stream.Dialer. Nothing
// else changes.
//
//	http -serve :8080                 # serve until SIGINT or SIGTERM
//	http -get host:8080 [-n bytes]    # GET /, POST /echo, GET /bytes?n=...
//	http                              # both in one process (a demo)
//
// The server answers GET / with a greeting, POST /echo with the request
// body, and GET /bytes?n=N with N bytes. The provider is $RDMA_PROVIDER
// (auto, verbs or soft); both ends must use the same. Exit codes: 0 ok,
// 1 errors, 2 bad usage.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/go-rdma/rdma/stream"
)

func main() {
	serve := flag.String("serve", "", "serve HTTP over RDMA on this address")
	get := flag.String("get", "", "act as client of the server at this address")
	n := flag.Int("n", 16<<20, "bytes for the /bytes and /echo requests")
	flag.Parse()
	if flag.NArg() != 0 || *serve != "" && *get != "" {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case *serve != "":
		err = runServer(ctx, *serve, nil)
	case *get != "":
		err = runClient(ctx, *get, *n, os.Stdout)
	default:
		err = demo(ctx, *n, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "http:", err)
		os.Exit(1)
	}
}

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over RDMA, %s\n", r.RemoteAddr)
	})
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 {
			http.Error(w, "want ?n=bytes", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := bytes.Repeat([]byte("rdma"), 16<<10)
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	return mux
}

// runServer serves until ctx ends. ready, if not nil, gets the address.
func runServer(ctx context.Context, addr string, ready chan<- net.Addr) error {
	ln, err := stream.Listen("rdma", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler(), ReadHeaderTimeout: 10 * time.Second}
	if ready != nil {
		ready <- ln.Addr()
	} else {
		fmt.Printf("serving HTTP over RDMA on %v\n", ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

func runClient(ctx context.Context, addr string, n int, out io.Writer) error {
	tr := &http.Transport{DialContext: (&stream.Dialer{}).DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	base := "http://" + addr

	body, err := fetch(ctx, client, "GET", base+"/", nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "GET /: %s", body)

	payload := bytes.Repeat([]byte{0xa5}, n)
	start := time.Now()
	body, err = fetch(ctx, client, "POST", base+"/echo", payload)
	if err != nil {
		return err
	}
	if !bytes.Equal(body, payload) {
		return fmt.Errorf("POST /echo: %d bytes came back, %d sent", len(body), len(payload))
	}
	fmt.Fprintf(out, "POST /echo: %d bytes there and back in %v\n", n, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	body, err = fetch(ctx, client, "GET", fmt.Sprintf("%s/bytes?n=%d", base, n), nil)
	if err != nil {
		return err
	}
	if len(body) != n {
		return fmt.Errorf("GET /bytes: %d bytes, want %d", len(body), n)
	}
	el := time.Since(start)
	fmt.Fprintf(out, "GET /bytes: %d bytes in %v (%.2f Gb/s)\n", n, el.Round(time.Millisecond), float64(n)*8/el.Seconds()/1e9)
	return nil
}

func fetch(ctx context.Context, c *http.Client, method, url string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return b, err
}

// demo runs the server and the client in one process.
func demo(ctx context.Context, n int, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	ready := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() { errc <- runServer(ctx, "127.0.0.1:0", ready) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-errc:
		cancel()
		return err
	}
	err := runClient(ctx, addr.String(), n, out)
	cancel()
	return errors.Join(err, <-errc)
}
