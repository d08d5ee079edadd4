package leak

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func here() string {
	_, file, line, _ := runtime.Caller(1)
	return fmt.Sprintf("%s:%d", file, line+1)
}

// Rule: a tracked key is a leak until forgotten; Collected marks it as
// found by the GC; Claim moves its site once; Take removes what was made
// after a mark; disabled, nothing is recorded.
func TestTrack(t *testing.T) {
	a, b, c, d := new(int), new(int), new(int), new(int)
	Track(a, 0) // disabled: not recorded
	require.Empty(t, Take(0))

	Enable()
	defer enabled.Store(false)
	m := Now()
	siteB := here()
	Track(b, 0)
	Track(c, 0)
	Forget(c)
	siteD := here()
	Track(d, 0)
	Collected(d)
	Collected(a) // never tracked: ignored

	leaks := Leaks()
	require.Len(t, leaks, 2)
	assert.Equal(t, siteB, leaks[0].Site)
	assert.False(t, leaks[0].Collected)
	assert.Equal(t, siteD, leaks[1].Site)
	assert.True(t, leaks[1].Collected)
	assert.Contains(t, leaks[0].Stack, "leak.TestTrack\n")

	claimed := here()
	Claim(b, 0)
	Claim(b, 0) // only the first counts
	var out bytes.Buffer
	assert.Equal(t, 2, Check(&out))
	assert.Contains(t, out.String(), "allocated at "+claimed+"\n")
	assert.Contains(t, out.String(), "allocated at "+siteD+"\n")
	assert.True(t, strings.HasSuffix(out.String(), "2 rdma.Buffer handle(s) never released\n"), out.String())

	require.Len(t, Take(m), 2)
	assert.Empty(t, Leaks())
	assert.Equal(t, 0, Check(&out))
}
