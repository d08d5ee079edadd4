module github.com/go-rdma/rdma/cmd/examples/antspool

go 1.26.0

require (
	github.com/go-rdma/rdma v0.2.0
	github.com/panjf2000/ants/v2 v2.12.1
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/ebitengine/purego v0.11.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// The example builds against the work tree.
replace github.com/go-rdma/rdma => ../../..
