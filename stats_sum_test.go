package rdma

import (
	"fmt"
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

// TestConnStatsAdd: an engine's connection counters sum every field of
// its connections', arrays entry by entry and structs (the latency
// histogram) field by field, so a counter added to ConnStats cannot be
// left out of the engine's total.
func TestConnStatsAdd(t *testing.T) {
	var one ConnStats
	fill(reflect.ValueOf(&one).Elem())
	var sum ConnStats
	sum.add(one)
	sum.add(one)
	leaves := 0
	check(t, reflect.ValueOf(sum), "ConnStats", &leaves)
	assert.Greater(t, leaves, 2*int(CompletionStatuses)+LatencyBuckets, "the check reached the arrays' entries")
}

// fill sets every number in v to 1.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i))
		}
	case reflect.Array:
		for k := range v.Len() {
			fill(v.Index(k))
		}
	case reflect.Int64:
		v.SetInt(1)
	default:
		v.SetUint(1)
	}
}

// check asserts that every number in v is 2, and counts them.
func check(t *testing.T, v reflect.Value, name string, leaves *int) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			check(t, v.Field(i), name+"."+v.Type().Field(i).Name, leaves)
		}
	case reflect.Array:
		for k := range v.Len() {
			check(t, v.Index(k), fmt.Sprintf("%s[%d]", name, k), leaves)
		}
	case reflect.Int64:
		*leaves++
		assert.Equal(t, int64(2), v.Int(), name)
	default:
		*leaves++
		assert.Equal(t, uint64(2), v.Uint(), name)
	}
}
