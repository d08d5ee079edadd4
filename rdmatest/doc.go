// Package rdmatest provides utilities for testing code that uses go-rdma,
// as net/http/httptest does for net/http: connections ready to use in a
// test, with no RDMA hardware needed.
//
// Pair gives the two ends of an RDMA connection, each on an engine of its
// own as two processes' would be; Connect the two ends of a connection to
// a listener the test made itself (to give the server side options of its
// own); StreamPair the two ends of a stream connection. Everything they
// make is closed when the test ends, and a failure to close fails the
// test.
//
// The connections use the provider the options choose. With none, that is
// the default: a verbs device where the machine has one, else the soft
// provider, the pure-Go implementation of the same semantics. Pass
// rdma.WithProvider(rdma.ProviderSoft) for a test that runs the same on
// every machine.
//
// The helpers report failures with testify's require (the test stops) and
// assert (in cleanups, so that every cleanup runs); call them from the
// test's goroutine, as t.FailNow requires.
package rdmatest
