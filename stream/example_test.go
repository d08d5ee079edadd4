package stream_test

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/go-rdma/rdma/stream"
)

// A stream is a net.Conn: an echo server and a client, as with TCP.
func ExampleDial() {
	ln, err := stream.Listen("rdma", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan struct{})
	defer func() {
		ln.Close()
		<-served // the server has closed its conn
	}()
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client half-closes
	}()

	c, err := stream.Dial(context.Background(), "rdma", ln.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.Write([]byte("hello over RDMA"))
	c.(*stream.Conn).CloseWrite() // the server reads io.EOF
	reply, err := io.ReadAll(c)
	fmt.Printf("%s, %v\n", reply, err)
	// Output: hello over RDMA, <nil>
}

// net/http needs only the listener and the dialer swapped.
func ExampleDialer() {
	ln, err := stream.Listen("rdma", ":8080")
	if err != nil {
		fmt.Println(err)
		return
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	client := &http.Client{Transport: &http.Transport{
		DialContext: (&stream.Dialer{}).DialContext,
	}}
	resp, err := client.Get("http://server:8080/")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
}
