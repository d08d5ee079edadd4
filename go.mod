module github.com/go-rdma/rdma

go 1.26.0

require (
	github.com/panjf2000/ants/v2 v2.12.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
)

require github.com/stretchr/testify v1.12.1 // indirect
