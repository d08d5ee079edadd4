package rdma_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/go-rdma/rdma"
)

// A listener that requires a client certificate from its CA and lets in
// only the names on its list; the dialer sees the listener's certificate.
// (Compiled, not run: it needs certificates.)
func ExampleWithTLS() {
	var (
		serverCert, clientCert tls.Certificate
		ca                     *x509.CertPool
		allowed                = map[string]bool{"backup-agent": true}
	)
	ln, err := rdma.Listen("rdma", "127.0.0.1:7471",
		rdma.WithTLS(&tls.Config{Certificates: []tls.Certificate{serverCert},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca}),
		rdma.WithAcceptCheck(func(p rdma.PeerInfo) error {
			// Called before anything is made for the peer; the error
			// is the dialer's reason.
			if !allowed[p.TLS.VerifiedChains[0][0].Subject.CommonName] {
				return errors.New("not on the list")
			}
			return nil
		}))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()

	c, err := rdma.Dial(context.Background(), "rdma", "127.0.0.1:7471",
		rdma.WithTLS(&tls.Config{RootCAs: ca, Certificates: []tls.Certificate{clientCert}}))
	if errors.Is(err, rdma.ErrRefused) {
		fmt.Println("refused:", err)
		return
	} else if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	st, _ := c.ConnectionState()
	fmt.Println("connected to", st.PeerCertificates[0].Subject.CommonName)
}
