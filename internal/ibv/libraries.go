package ibv

import "os"

// The rdma-core libraries this package loads at run time (loader.go), and
// the environment variables that name another file for each: an
// rdma-core outside the dynamic loader's search path, or, in tests, a
// path that does not exist, which makes the process behave as on a
// machine without rdma-core. A variable is read once, at the first use
// of the library.
const (
	SonameLibibverbs = "libibverbs.so.1"
	SonameLibrdmacm  = "librdmacm.so.1"
	EnvLibibverbs    = "GO_RDMA_LIBIBVERBS"
	EnvLibrdmacm     = "GO_RDMA_LIBRDMACM"
)

// libPath is the file to load for a library: $env, else its soname.
func libPath(env, soname string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	return soname
}
