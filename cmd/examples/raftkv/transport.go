package main

import (
	"context"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/go-rdma/rdma/stream"
)

// streamLayer is raft's StreamLayer over a listener and a dial function:
// the go-rdma stream's, or TCP's for comparison.
type streamLayer struct {
	net.Listener
	dial func(ctx context.Context, address string) (net.Conn, error)
}

func (l streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return l.dial(ctx, string(address))
}

// listen makes the StreamLayer of one node on loopback.
func listen(transport string) (streamLayer, error) {
	if transport == "tcp" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		var d net.Dialer
		return streamLayer{ln, func(ctx context.Context, a string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", a)
		}}, err
	}
	ln, err := stream.Listen("rdma", "127.0.0.1:0")
	var d stream.Dialer
	return streamLayer{ln, func(ctx context.Context, a string) (net.Conn, error) {
		return d.DialContext(ctx, "rdma", a)
	}}, err
}
