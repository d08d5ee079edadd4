module github.com/go-rdma/rdma

go 1.26.0

require (
	github.com/panjf2000/ants/v2 v2.12.1 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
