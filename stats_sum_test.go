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

// TestConnStatsAdd: an engine's connection counters sum every field of
// its connections', arrays entry by entry, so a counter added to
// ConnStats cannot be left out of the engine's total.
func TestConnStatsAdd(t *testing.T) {
	var one ConnStats
	v := reflect.ValueOf(&one).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Array:
			for k := range f.Len() {
				f.Index(k).SetUint(1)
			}
		case reflect.Int64:
			f.SetInt(1)
		default:
			f.SetUint(1)
		}
	}
	var sum ConnStats
	sum.add(one)
	sum.add(one)
	s := reflect.ValueOf(sum)
	for i := range s.NumField() {
		f, name := s.Field(i), s.Type().Field(i).Name
		switch f.Kind() {
		case reflect.Array:
			for k := range f.Len() {
				assert.Equal(t, uint64(2), f.Index(k).Uint(), "%s[%d]", name, k)
			}
		case reflect.Int64:
			assert.Equal(t, int64(2), f.Int(), name)
		default:
			assert.Equal(t, uint64(2), f.Uint(), name)
		}
	}
}
