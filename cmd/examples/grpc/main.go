// Command grpc runs gRPC over RDMA: the server is a grpc.Server serving
// an stream.Listen listener, and the client dials through
// grpc.WithContextDialer with stream.Dialer. The service is written by hand
// (no protoc): its messages are raw bytes, carried by a codec that passes
// them as they are.
//
//	grpc -serve :50051                # serve until SIGINT or SIGTERM
//	grpc -call host:50051 [-n bytes]  # a unary call, then n bytes each way by streaming
//	grpc                              # both in one process (a demo)
//
// The provider is $RDMA_PROVIDER (auto, verbs or soft); both ends must use
// the same. Exit codes: 0 ok, 1 errors, 2 bad usage.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdma/stream"
)

func main() {
	serve := flag.String("serve", "", "serve gRPC over RDMA on this address")
	call := flag.String("call", "", "act as client of the server at this address")
	n := flag.Int("n", 32<<20, "bytes to move each way by streaming")
	flag.Parse()
	if flag.NArg() != 0 || *serve != "" && *call != "" {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case *serve != "":
		err = runServer(ctx, *serve, nil)
	case *call != "":
		err = runClient(ctx, *call, *n, os.Stdout)
	default:
		err = demo(ctx, *n, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
}

// rawCodec passes []byte messages as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(*[]byte); ok {
		return *b, nil
	}
	return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "raw" }

// The service "example.Bytes": Hello (unary) greets; Upload (client
// streaming) answers the SHA-256 of what it received; Download (server
// streaming) sends the number of bytes its request names.
type bytesService interface{}

type server struct{}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: "example.Bytes",
	HandlerType: (*bytesService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Hello",
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var name []byte
			if err := dec(&name); err != nil {
				return nil, err
			}
			out := []byte("hello " + string(name) + ", over RDMA")
			return &out, nil
		},
	}},
	Streams: []grpc.StreamDesc{
		{StreamName: "Upload", ClientStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			h := sha256.New()
			for {
				var in []byte
				err := st.RecvMsg(&in)
				if errors.Is(err, io.EOF) {
					out := h.Sum(nil)
					return st.SendMsg(&out)
				}
				if err != nil {
					return err
				}
				h.Write(in)
			}
		}},
		{StreamName: "Download", ServerStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			var req []byte
			if err := st.RecvMsg(&req); err != nil {
				return err
			}
			n, err := strconv.Atoi(string(req))
			if err != nil {
				return err
			}
			chunk := bytes.Repeat([]byte{0x5a}, 256<<10)
			for n > 0 {
				out := chunk[:min(n, len(chunk))]
				if err := st.SendMsg(&out); err != nil {
					return err
				}
				n -= len(out)
			}
			return nil
		}},
	},
}

// runServer serves until ctx ends. ready, if not nil, gets the address.
func runServer(ctx context.Context, addr string, ready chan<- net.Addr) error {
	ln, err := stream.Listen("rdma", addr)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&serviceDesc, server{})
	if ready != nil {
		ready <- ln.Addr()
	} else {
		fmt.Printf("serving gRPC over RDMA on %v\n", ln.Addr())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	srv.GracefulStop()
	return <-errc
}

func runClient(ctx context.Context, addr string, n int, out io.Writer) error {
	d := &stream.Dialer{}
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "rdma", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		return err
	}
	defer cc.Close()

	name := []byte("gopher")
	var reply []byte
	if err := cc.Invoke(ctx, "/example.Bytes/Hello", &name, &reply); err != nil {
		return err
	}
	fmt.Fprintf(out, "Hello: %s\n", reply)

	start := time.Now()
	up, err := cc.NewStream(ctx, &serviceDesc.Streams[0], "/example.Bytes/Upload")
	if err != nil {
		return err
	}
	h := sha256.New()
	chunk := bytes.Repeat([]byte{0xc3}, 256<<10)
	for left := n; left > 0; {
		b := chunk[:min(left, len(chunk))]
		h.Write(b)
		if err := up.SendMsg(&b); err != nil {
			return err
		}
		left -= len(b)
	}
	if err := up.CloseSend(); err != nil {
		return err
	}
	var sum []byte
	if err := up.RecvMsg(&sum); err != nil {
		return err
	}
	if !bytes.Equal(sum, h.Sum(nil)) {
		return errors.New("upload: the server's checksum differs")
	}
	el := time.Since(start)
	fmt.Fprintf(out, "Upload: %d bytes in %v (%.2f Gb/s), checksum ok\n", n, el.Round(time.Millisecond), float64(n)*8/el.Seconds()/1e9)

	start = time.Now()
	down, err := cc.NewStream(ctx, &serviceDesc.Streams[1], "/example.Bytes/Download")
	if err != nil {
		return err
	}
	req := []byte(strconv.Itoa(n))
	if err := down.SendMsg(&req); err != nil {
		return err
	}
	if err := down.CloseSend(); err != nil {
		return err
	}
	got := 0
	for {
		var in []byte
		err := down.RecvMsg(&in)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		got += len(in)
	}
	if got != n {
		return fmt.Errorf("download: %d bytes, want %d", got, n)
	}
	el = time.Since(start)
	fmt.Fprintf(out, "Download: %d bytes in %v (%.2f Gb/s)\n", n, el.Round(time.Millisecond), float64(n)*8/el.Seconds()/1e9)
	return nil
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
