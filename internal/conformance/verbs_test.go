package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/go-rdma/rdma/internal/ibv"
	"github.com/go-rdma/rdma/internal/verbs"
)

// The verbs provider (libibverbs): the first two usable devices, or the
// first one twice; RDMA_TEST_VERBS_DEVICES="rxe0,rxe1" (or "siw0,siw1")
// overrides. Devices that connect only through rdma_cm (iWARP) are
// connected with cmConnect.
func init() {
	register("verbs", func(t *testing.T) Target {
		a, b := pickDevices(t, ibv.Provider, "RDMA_TEST_VERBS_DEVICES")
		t.Logf("verbs provider: device A %s, device B %s", a, b)
		return Target{Provider: ibv.Provider, DeviceA: a, DeviceB: b, CMConnect: cmConnect(a, b)}
	})
}

// cmConnect connects qa and qb through rdma_cm: B listens on its device's
// IPv4 address, A dials from its own, so that rdma_cm chooses exactly
// devices A and B.
func cmConnect(devA, devB string) func(ctx context.Context, qa, qb verbs.QP) (io.Closer, error) {
	return func(ctx context.Context, qa, qb verbs.QP) (io.Closer, error) {
		ipA, err := deviceIP(devA)
		if err != nil {
			return nil, err
		}
		ipB, err := deviceIP(devB)
		if err != nil {
			return nil, err
		}
		ln, err := ibv.CMListen(net.JoinHostPort(ipB, "0"), 1)
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		type accepted struct {
			id  *ibv.CMID
			err error
		}
		done := make(chan accepted, 1)
		go func() {
			req, err := ln.Accept(ctx)
			if err != nil {
				done <- accepted{nil, err}
				return
			}
			if req.Device() != devB {
				req.Close()
				done <- accepted{nil, fmt.Errorf("rdma_cm chose device %s for the passive side, want %s", req.Device(), devB)}
				return
			}
			done <- accepted{req.CMID, req.Accept(ctx, qb, ibv.CMParams{})}
		}()
		id, err := ibv.CMDial(ctx, ipA, ln.Addr().String())
		if err == nil && id.Device() != devA {
			err = fmt.Errorf("rdma_cm chose device %s for the active side, want %s", id.Device(), devA)
		}
		if err == nil {
			err = id.Connect(ctx, qa, ibv.CMParams{})
		}
		if err != nil {
			ln.Close() // ends the Accept if no request came
		}
		acc := <-done
		ids := cmIDs{}
		if id != nil {
			ids = append(ids, id)
		}
		if acc.id != nil {
			ids = append(ids, acc.id)
		}
		if err = errors.Join(err, acc.err); err != nil {
			ids.Close()
			return nil, err
		}
		return ids, nil
	}
}

type cmIDs []*ibv.CMID

func (c cmIDs) Close() error {
	var errs []error
	for _, id := range c {
		errs = append(errs, id.Close())
	}
	return errors.Join(errs...)
}

// deviceIP is the IPv4 address of the network device under dev: the one
// its RoCE v2 GID carries, or, on iWARP, the one of the interface whose
// MAC address the GID holds (an iWARP GID is the MAC, zero-padded).
func deviceIP(dev string) (string, error) {
	devs, err := ibv.Provider.Devices()
	if err != nil {
		return "", err
	}
	for _, d := range devs {
		if d.Name != dev || len(d.Ports) == 0 {
			continue
		}
		p := d.Ports[0]
		if g, err := verbs.SelectGID(p, true); err == nil {
			return g.GID.IP().String(), nil
		}
		ifs, err := net.Interfaces()
		if err != nil {
			return "", err
		}
		for _, g := range p.GIDs {
			for _, ifc := range ifs {
				if len(ifc.HardwareAddr) != 6 || string(ifc.HardwareAddr) != string(g.GID[:6]) {
					continue
				}
				addrs, err := ifc.Addrs()
				if err != nil {
					return "", err
				}
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
						return ipn.IP.String(), nil
					}
				}
			}
		}
		return "", fmt.Errorf("device %s: no IPv4 address on its network device (GIDs %v)", dev, p.GIDs)
	}
	return "", fmt.Errorf("device %s: %w", dev, verbs.ErrNoDevice)
}
