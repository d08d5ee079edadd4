package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
)

// genSource is generated data: a fixed pseudo-random pattern whose length
// is odd, so no two chunks of a transfer are alike. Any process produces
// the same bytes at the same offset, so a receiver can be checked
// against it.
type genSource struct{ size int64 }

const patternLen = 1<<20 + 7

var pattern = func() []byte {
	b := make([]byte, patternLen)
	r := rand.NewChaCha8([32]byte{'d', 'a', 't', 'a', 'm', 'o', 'v', 'e', 'r'})
	r.Read(b)
	return b
}()

func (g genSource) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > g.size {
		return 0, fmt.Errorf("generated data: read [%d:+%d] past %d bytes", off, len(p), g.size)
	}
	n := len(p)
	for i := off % patternLen; len(p) > 0; i = 0 {
		p = p[copy(p, pattern[i:]):]
	}
	return n, nil
}

func (g genSource) Size() int64  { return g.size }
func (g genSource) Name() string { return "generated data" }
func (g genSource) Close() error { return nil }

// sizeFlag is a byte count with an optional unit: 4096, 64KiB, 1MiB,
// 2GiB; K, M, G and T mean the same as KiB...; KB, MB, GB, TB are powers
// of 1000.
type sizeFlag struct{ v int64 }

func (s *sizeFlag) String() string {
	if s == nil || s.v < 0 {
		return ""
	}
	return human(s.v)
}

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	s.v = n
	return nil
}

func parseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult := map[string]float64{"": 1, "B": 1,
		"K": 1 << 10, "KI": 1 << 10, "KIB": 1 << 10, "KB": 1e3,
		"M": 1 << 20, "MI": 1 << 20, "MIB": 1 << 20, "MB": 1e6,
		"G": 1 << 30, "GI": 1 << 30, "GIB": 1 << 30, "GB": 1e9,
		"T": 1 << 40, "TI": 1 << 40, "TIB": 1 << 40, "TB": 1e12,
	}[strings.ToUpper(unit)]
	f, err := strconv.ParseFloat(num, 64)
	if mult == 0 || err != nil || f < 0 || f*mult > 1<<60 {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional unit (KiB, MiB, GiB, ...)", v)
	}
	return int64(f * mult), nil
}

// human formats a byte count.
func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// rate formats a throughput.
func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "- MiB/s"
	}
	bps := float64(n) / d.Seconds()
	return fmt.Sprintf("%.1f MiB/s (%.2f Gb/s)", bps/(1<<20), bps*8/1e9)
}
