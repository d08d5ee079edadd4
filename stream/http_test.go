package stream_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// httpSizes are n body sizes from 0 to max bytes, spaced geometrically.
func httpSizes(n, max int) []int {
	sizes := make([]int, n)
	for i := 1; i < n; i++ {
		sizes[i] = int(math.Round(math.Pow(float64(max), float64(i-1)/float64(n-2))))
	}
	sizes[n-1] = max
	return sizes
}

func httpBody(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(i)
	}
	return b
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestStreamHTTP: net/http over the stream. http.Server.Serve takes the
// RDMA listener, and the client's Transport dials with stream.Dialer. 100
// requests with bodies from 0 B to 8 MiB go up, bodies of the same sizes
// come back, and both are checked (24 requests up to 128 KiB in the VM).
func TestStreamHTTP(t *testing.T) { eachProvider(t, testStreamHTTP) }

func testStreamHTTP(t *testing.T, opts []rdma.Option) {
	// The emulated VM is 10-100x slower: fewer and smaller there.
	requests, maxBody := 100, 8<<20
	if inVM() {
		requests, maxBody = 24, 128<<10
	}
	ln, err := stream.Listen("rdma", listenAddr(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if got, want := sum(body), r.Header.Get("X-Sum"); got != want {
			http.Error(w, fmt.Sprintf("request body: sum %s, want %s (%d bytes)", got, want, len(body)), http.StatusBadRequest)
			return
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		seed, _ := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64)
		resp := httpBody(seed, n)
		w.Header().Set("X-Sum", sum(resp))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.Write(resp)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	tr := &http.Transport{DialContext: (&stream.Dialer{Options: opts}).DialContext, MaxIdleConnsPerHost: 4}
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	defer func() {
		tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		if err := <-served; err != http.ErrServerClosed {
			t.Errorf("Serve: %v", err)
		}
	}()

	sizes := httpSizes(requests, maxBody)
	url := "http://" + ln.Addr().String() + "/"
	var wg sync.WaitGroup
	work := make(chan int)
	errs := make(chan error, len(sizes))
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				errs <- httpRoundTrip(client, url, uint64(i), sizes[i], sizes[len(sizes)-1-i])
			}
		}()
	}
	for i := range sizes {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func httpRoundTrip(client *http.Client, url string, seed uint64, up, down int) error {
	body := httpBody(seed, up)
	req, err := http.NewRequest("POST", fmt.Sprintf("%s?n=%d&seed=%d", url, down, seed+1000), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Sum", sum(body))
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("request %d (%d B up, %d B down): %w", seed, up, down, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("request %d: reading the response: %w", seed, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("request %d: %s: %s", seed, resp.Status, got)
	}
	if len(got) != down || sum(got) != resp.Header.Get("X-Sum") || !bytes.Equal(got, httpBody(seed+1000, down)) {
		return fmt.Errorf("request %d: response of %d bytes, want %d, or corrupt", seed, len(got), down)
	}
	return nil
}
