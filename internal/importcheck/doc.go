// Package importcheck holds only a test: a package of a user's that
// imports go-rdma and checks, with goleak.VerifyTestMain and no option,
// that importing it starts nothing and that closing everything it opened
// leaves no goroutine behind.
package importcheck
