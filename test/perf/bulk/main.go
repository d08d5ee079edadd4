// Command bulk is the TCP reference of test/perf/bulk.sh: a plain io.Copy
// of a file over one loopback TCP connection.
//
//	bulk -l 127.0.0.1:0 -o out   # accept one connection, copy it to out
//	bulk -c ADDR -i in           # connect, copy in to the connection
//
// With -l the first line on stderr is "bulk: listening on ADDR".
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	listen := flag.String("l", "", "listen on this address for one connection")
	connect := flag.String("c", "", "connect to this address")
	in := flag.String("i", "", "sender: the file to send")
	out := flag.String("o", "", "receiver: the file to write")
	flag.Parse()
	var err error
	switch {
	case *listen != "" && *out != "":
		err = receive(*listen, *out)
	case *connect != "" && *in != "":
		err = send(*connect, *in)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bulk:", err)
		os.Exit(1)
	}
}

func receive(addr, out string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(os.Stderr, "bulk: listening on %s\n", ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, c); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func send(addr, in string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	if _, err := io.Copy(c, f); err != nil {
		c.Close()
		return err
	}
	return c.Close()
}
