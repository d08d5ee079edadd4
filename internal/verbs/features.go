package verbs

import "fmt"

// Feature is a capability beyond the core every device has (RC QPs with
// SEND, RDMA WRITE and RDMA READ) that some devices lack. The upper
// layers ask Lacks before they use one, so that a caller hears
// ErrNotSupported at the call rather than a failed completion later.
type Feature string

const (
	// FeatureAtomics: compare-and-swap and fetch-and-add, as the
	// device's atomic_cap reports (siw reports ATOMIC_NONE).
	FeatureAtomics Feature = "atomics"
	// FeatureImmediate: SEND_WITH_IMM and RDMA_WRITE_WITH_IMM. iWARP
	// (RFC 5040) carries no immediate data.
	FeatureImmediate Feature = "immediate data"
	// FeatureUD: unreliable datagram QPs. iWARP has RC only.
	FeatureUD Feature = "UD QPs"
	// FeatureUC: unreliable connected QPs. iWARP has RC only.
	FeatureUC Feature = "UC QPs"
	// FeatureSRQ: shared receive queues (the device's max_srq).
	FeatureSRQ Feature = "shared receive queues"
	// FeatureRNRRetry: a SEND that finds no posted receive is NAKed
	// and retried (the RNR retry count). On iWARP it ends the
	// connection instead: receives must be posted before the peer sends.
	FeatureRNRRetry Feature = "RNR retry"
	// FeatureManualConnect: a QP moved to RTR and RTS by hand with the
	// peer's QP number and GID (go-rdma's TCP handshake does that). An
	// iWARP QP is connected only through rdma_cm, over a TCP connection
	// the kernel owns.
	FeatureManualConnect Feature = "connecting QPs by hand (QP number and GID)"
	// FeatureRemoteWriteError: a WRITE the peer refuses (bad rkey,
	// range, rights) completes with REM_ACCESS_ERR. iWARP does not
	// acknowledge WRITEs: the WRITE completes once sent, and the
	// refusal ends the connection later.
	FeatureRemoteWriteError Feature = "the peer's refusal in a WRITE's completion"
	// FeatureFlushInError: WRs posted to a QP in ERR complete with
	// WR_FLUSH_ERR. siw (Linux 6.1) drops the ones a user-space QP
	// posts in ERR: they never complete.
	FeatureFlushInError Feature = "flushing WRs posted in ERR"
	// FeatureMulticast: UD multicast (QP.AttachMcast), as the device's
	// max_mcast_grp reports. iWARP has no UD at all.
	FeatureMulticast Feature = "multicast"
)

// siwVendorID is the vendor_id siw reports ("bmt" in ASCII).
const siwVendorID = 0x626d74

// Features lists every Feature, in the order docs/providers.md has them.
var Features = []Feature{FeatureManualConnect, FeatureAtomics, FeatureImmediate, FeatureUD, FeatureUC, FeatureMulticast, FeatureSRQ,
	FeatureRNRRetry, FeatureRemoteWriteError, FeatureFlushInError}

// Lacks returns nil when the device described by info and attr has f,
// else an error wrapping ErrNotSupported that names the device and why.
// It reads only what the device reports: its transport and its limits.
func Lacks(info DeviceInfo, attr DeviceAttr, f Feature) error {
	why := ""
	iwarp := info.Transport == "iWARP"
	switch f {
	case FeatureAtomics:
		if attr.AtomicCap == 0 {
			why = "the device reports atomic_cap ATOMIC_NONE"
		}
	case FeatureSRQ:
		if attr.MaxSRQ == 0 {
			why = "the device reports max_srq 0"
		}
	case FeatureImmediate:
		if iwarp {
			why = "iWARP carries no immediate data"
		}
	case FeatureUD, FeatureUC:
		if iwarp {
			why = "iWARP has RC QPs only"
		}
	case FeatureMulticast:
		switch {
		case iwarp:
			why = "iWARP has no UD QPs, so no multicast"
		case attr.MaxMcastGrp == 0 || attr.MaxMcastQPAttach == 0:
			why = fmt.Sprintf("the device reports max_mcast_grp %d, max_mcast_qp_attach %d", attr.MaxMcastGrp, attr.MaxMcastQPAttach)
		}
	case FeatureRNRRetry:
		if iwarp {
			why = "on iWARP a SEND that finds no receive ends the connection"
		}
	case FeatureManualConnect:
		if iwarp {
			why = "iWARP connects only through rdma_cm"
		}
	case FeatureRemoteWriteError:
		if iwarp {
			why = "iWARP does not acknowledge WRITEs: one completes once sent, and a refusal ends the connection later"
		}
	case FeatureFlushInError:
		if attr.VendorID == siwVendorID {
			why = "siw never completes WRs a user-space QP posts in ERR"
		}
	default:
		return fmt.Errorf("%w: unknown feature %q", ErrInvalid, f)
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: %s on device %s: %s", ErrNotSupported, f, info.Name, why)
}
