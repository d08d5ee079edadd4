package ibv

import "github.com/go-rdma/rdma/internal/verbs"

// Provider is the libibverbs provider. Its Devices and Open are
// ibv_shared.go's where a binding can call libibverbs, stub.go's (which
// can only list devices) elsewhere.
var Provider verbs.Provider = provider{}

type provider struct{}

func (provider) Name() string { return "verbs" }
