package pool_test

import (
	"fmt"

	"github.com/go-rdma/rdma/internal/pool"
)

// The pool registers a slab with the PD on the first Get. A buffer that
// an operation still uses stays out of the pool after its owner releases
// it, until the operation's completion drops the last reference.
func Example() {
	// In go-rdma the registrar is the connection's protection domain.
	var pd pool.Registrar = newFakeReg()
	p, err := pool.New(pd, pool.Options{SlabSize: 1 << 20})
	if err != nil {
		panic(err)
	}

	buf, err := p.Get(100)
	if err != nil {
		panic(err)
	}
	copy(buf.Bytes(), "hello")
	msg, _ := buf.Slice(0, 5) // the part to send
	fmt.Println("send", msg.Len(), "bytes, lkey set:", msg.LKey() != 0)

	_ = buf.Ref()     // posting an operation takes a reference
	_ = buf.Release() // the owner may let go at once
	fmt.Println("in use before the completion:", p.Stats().BuffersInUse)
	fmt.Println("release again:", buf.Release())
	_ = buf.Unref() // the signaled completion drops the last one
	fmt.Println("in use after the completion:", p.Stats().BuffersInUse)

	st := p.Stats()
	fmt.Println("slabs:", st.Slabs, "registered:", st.BytesRegistered)
	fmt.Println("close:", p.Close())
	// Output:
	// send 5 bytes, lkey set: true
	// in use before the completion: 1
	// release again: buffer already released
	// in use after the completion: 0
	// slabs: 1 registered: 1048576
	// close: <nil>
}
