package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/go-rdma/rdma/internal/leak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(leak.Checked(m)) }

func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := demo(ctx, 4<<20, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hello over RDMA", "POST /echo: 4194304 bytes", "GET /bytes: 4194304 bytes"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
