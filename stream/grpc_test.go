package stream_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/go-rdma/rdma"
	"github.com/go-rdma/rdma/stream"
)

// A gRPC service written by hand (no protoc): messages are raw bytes
// through a codec that passes them as they are.

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return *b, nil
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

// echoService: Echo (unary) returns its request reversed; Sink (client
// streaming) returns the SHA-256 and length of everything sent to it;
// Source (server streaming) sends the bytes the request asks for.
type echoService interface{}

type echoServer struct{}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "gordma.test.Echo",
	HandlerType: (*echoService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			out := make([]byte, len(in))
			for i, c := range in {
				out[len(in)-1-i] = c
			}
			return &out, nil
		},
	}},
	Streams: []grpc.StreamDesc{
		{StreamName: "Sink", ClientStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			h := sha256.New()
			n := 0
			for {
				var in []byte
				err := st.RecvMsg(&in)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				h.Write(in)
				n += len(in)
			}
			out := fmt.Appendf(h.Sum(nil), "%d", n)
			return st.SendMsg(&out)
		}},
		{StreamName: "Source", ServerStreams: true, Handler: func(_ any, st grpc.ServerStream) error {
			var req []byte
			if err := st.RecvMsg(&req); err != nil {
				return err
			}
			var total, chunk int
			if _, err := fmt.Sscanf(string(req), "%d %d", &total, &chunk); err != nil {
				return err
			}
			for off := 0; off < total; off += chunk {
				out := grpcChunk(off, min(chunk, total-off))
				if err := st.SendMsg(&out); err != nil {
					return err
				}
			}
			return nil
		}},
	},
}

// grpcChunk is the deterministic content of bytes [off, off+n).
func grpcChunk(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		x := uint32(off+i) * 2654435761
		b[i] = byte(x >> 24)
	}
	return b
}

// TestStreamGRPC: a gRPC server on an RDMA listener and a client dialing
// through grpc.WithContextDialer: unary calls, then 64 MiB up a
// client-streaming RPC and 64 MiB down a server-streaming one.
func TestStreamGRPC(t *testing.T) { eachProvider(t, testStreamGRPC) }

func testStreamGRPC(t *testing.T, opts []rdma.Option) {
	total := 64 << 20
	if inVM() {
		total = 4 << 20
	}
	ln, err := stream.Listen("rdma", listenAddr(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&echoDesc, echoServer{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	d := &stream.Dialer{Options: opts}
	cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "rdma", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Unary calls of several sizes.
	for i, n := range []int{0, 1, 100, 4 << 10, 100 << 10, 1 << 20} {
		in := grpcChunk(i, n)
		var out []byte
		if err := cc.Invoke(ctx, "/gordma.test.Echo/Echo", &in, &out); err != nil {
			t.Fatalf("unary %d bytes: %v", n, err)
		}
		if len(out) != n {
			t.Fatalf("unary %d bytes: got %d", n, len(out))
		}
		for j := range out {
			if out[j] != in[n-1-j] {
				t.Fatalf("unary %d bytes: wrong byte at %d", n, j)
			}
		}
	}

	// 64 MiB up.
	const chunk = 256 << 10
	st, err := cc.NewStream(ctx, &echoDesc.Streams[0], "/gordma.test.Echo/Sink")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for off := 0; off < total; off += chunk {
		b := grpcChunk(off, min(chunk, total-off))
		h.Write(b)
		if err := st.SendMsg(&b); err != nil {
			t.Fatalf("send at %d: %v", off, err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var reply []byte
	if err := st.RecvMsg(&reply); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Appendf(h.Sum(nil), "%d", total); !bytes.Equal(reply, want) {
		t.Fatalf("sink: server saw other bytes than were sent (reply %x)", reply)
	}

	// 64 MiB down.
	st, err = cc.NewStream(ctx, &echoDesc.Streams[1], "/gordma.test.Echo/Source")
	if err != nil {
		t.Fatal(err)
	}
	req := fmt.Appendf(nil, "%d %d", total, chunk)
	if err := st.SendMsg(&req); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := 0
	var in []byte
	for {
		err := st.RecvMsg(&in)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("source at %d: %v", got, err)
		}
		if !bytes.Equal(in, grpcChunk(got, len(in))) {
			t.Fatalf("source: wrong bytes at %d", got)
		}
		got += len(in)
	}
	if got != total {
		t.Fatalf("source: got %d bytes, want %d", got, total)
	}
}
