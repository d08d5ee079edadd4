package rdma_test

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/go-rdma/rdma"
)

// A stream is a net.Conn: an echo server and a client, as with TCP.
func ExampleDialStream() {
	ln, err := rdma.ListenStream("rdma", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client half-closes
	}()

	c, err := rdma.DialStream(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.Write([]byte("hello over RDMA"))
	c.(*rdma.StreamConn).CloseWrite() // the server reads io.EOF
	reply, err := io.ReadAll(c)
	fmt.Printf("%s, %v\n", reply, err)
	// Output: hello over RDMA, <nil>
}

// net/http needs only the listener and the dialer swapped.
func ExampleDialer() {
	ln, err := rdma.ListenStream("rdma", ":8080")
	if err != nil {
		fmt.Println(err)
		return
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	client := &http.Client{Transport: &http.Transport{
		DialContext: (&rdma.Dialer{}).DialContext,
	}}
	resp, err := client.Get("http://server:8080/")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
}
