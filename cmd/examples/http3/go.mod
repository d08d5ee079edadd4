module github.com/go-rdma/rdma/cmd/examples/http3

go 1.26.0

require (
	github.com/go-rdma/rdma v0.2.0
	github.com/quic-go/quic-go v0.65.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/quic-go/qpack v0.6.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// The example builds against the work tree.
replace github.com/go-rdma/rdma => ../../..
