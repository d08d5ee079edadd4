package rdma

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPollerStatsAdd: an engine's poller counters sum every field of its
// pollers' (the largest MaxBatch), so a counter added to PollerStats
// cannot be left out of the engine's total. DrivesCut and Backlogs once
// were.
func TestPollerStatsAdd(t *testing.T) {
	var one PollerStats
	v := reflect.ValueOf(&one).Elem()
	for i := range v.NumField() {
		v.Field(i).SetUint(1)
	}
	var sum PollerStats
	sum.add(one)
	sum.add(one)
	s := reflect.ValueOf(sum)
	for i := range s.NumField() {
		want := uint64(2)
		if s.Type().Field(i).Name == "MaxBatch" {
			want = 1
		}
		assert.Equal(t, want, s.Field(i).Uint(), s.Type().Field(i).Name)
	}
}
