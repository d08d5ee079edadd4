package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule: a service's ants pool runs the handlers of 100 connections'
// messages, each connection's in order, never more at once than the
// pool's workers.
func TestAntsPool(t *testing.T) {
	var out, errs bytes.Buffer
	code := run([]string{"-conns", "100", "-msgs", "20", "-workers", "4", "-provider", "soft"}, &out, &errs)
	require.Equal(t, 0, code, "stderr: %s", errs.String())
	assert.Contains(t, out.String(), "2000 messages of 100 connections handled in order")
	t.Log(out.String())
}
