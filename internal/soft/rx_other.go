//go:build !linux

package soft

import "net"

// scatterReader is Linux only; elsewhere rx reads plainly.
type scatterReader struct{}

func newScatterReader(net.Conn) *scatterReader { return nil }

func (*scatterReader) readv(a, b []byte, yield bool) (int, error) { panic("unreachable") }

// unread is Linux only: elsewhere a silent peer is one not heard.
func unread(net.Conn) bool { return false }
