package rdma

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-rdma/rdma/internal/verbs"
)

// Rule: Device, Port and GIDEntry have the fields of the verbs types
// they are made from, in the same order and of the same kinds. The
// compiler cannot keep them in step (deviceFrom converts field by
// field), so a field added to one side and not the other fails here.
func TestDeviceTypesInStep(t *testing.T) {
	for _, pair := range [][2]any{
		{Device{}, verbs.DeviceInfo{}},
		{Port{}, verbs.PortInfo{}},
		{GIDEntry{}, verbs.GIDEntry{}},
	} {
		pub, in := reflect.TypeOf(pair[0]), reflect.TypeOf(pair[1])
		assert.Equal(t, fieldsOf(in), fieldsOf(pub), "%v against %v", pub, in)
	}
}

// fieldsOf lists t's fields as "Name kind".
func fieldsOf(t reflect.Type) []string {
	var fs []string
	for f := range t.Fields() {
		fs = append(fs, f.Name+" "+f.Type.Kind().String())
	}
	return fs
}

// Rule: deviceFrom copies every field, down to the GIDs, and the public
// types print as the verbs ones do (cmd/examples/devinfo shows them).
// Every field of the input is set, so a field the conversion leaves out
// prints as zero and differs.
func TestDeviceFromCopiesEveryField(t *testing.T) {
	var d verbs.DeviceInfo
	fillAll(reflect.ValueOf(&d).Elem())
	got := deviceFrom(d)
	assert.Equal(t, fmt.Sprintf("%+v", d), fmt.Sprintf("%+v", got))
	require.Len(t, got.Ports, 1)
	require.Len(t, got.Ports[0].GIDs, 1)
	assert.Equal(t, d.Ports[0].GIDs[0].GID.IP(), got.Ports[0].GIDs[0].GID.IP())

	assert.Nil(t, deviceFrom(verbs.DeviceInfo{}).Ports, "no ports stays nil")
}

// fillAll sets every field of v, recursively, to a value that is not
// zero; slices get one element.
func fillAll(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fillAll(v.Field(i))
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillAll(v.Index(0))
	case reflect.Array:
		for i := range v.Len() {
			v.Index(i).SetUint(uint64(i + 1))
		}
	case reflect.String:
		v.SetString("s")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(3)
	case reflect.Uint8, reflect.Uint16, reflect.Uint64:
		v.SetUint(3) // a valid MTU and port state, so String shows a name
	default:
		panic(fmt.Sprintf("fillAll: no value for %v", v.Type()))
	}
}

// Rule: the public constants are the verbs values, which Devices passes
// through unchanged.
func TestDeviceConstantsAreVerbs(t *testing.T) {
	assert.Equal(t,
		[]verbs.MTU{verbs.MTU256, verbs.MTU512, verbs.MTU1024, verbs.MTU2048, verbs.MTU4096},
		[]verbs.MTU{verbs.MTU(MTU256), verbs.MTU(MTU512), verbs.MTU(MTU1024), verbs.MTU(MTU2048), verbs.MTU(MTU4096)})
	assert.Equal(t,
		[]verbs.PortState{verbs.PortNop, verbs.PortDown, verbs.PortInit, verbs.PortArmed, verbs.PortActive, verbs.PortActiveDefer},
		[]verbs.PortState{verbs.PortState(PortNop), verbs.PortState(PortDown), verbs.PortState(PortInit), verbs.PortState(PortArmed), verbs.PortState(PortActive), verbs.PortState(PortActiveDefer)})
	assert.Equal(t,
		[]verbs.GIDType{verbs.GIDTypeIB, verbs.GIDTypeRoCEv2, verbs.GIDTypeUnknown},
		[]verbs.GIDType{verbs.GIDType(GIDTypeIB), verbs.GIDType(GIDTypeRoCEv2), verbs.GIDType(GIDTypeUnknown)})
}
