package rdma_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule: the exported API names no internal type. go doc shows nothing of
// a type behind an alias to an internal package (its fields, methods and
// constants stay hidden), and users cannot name it, so every type a user
// meets is defined in the public package. The check reads the syntax of
// the non-test files of the root package and of metrics/promrdma: type
// specs (aliases too), exported fields and interface methods of exported
// types, the signatures of exported functions and of exported methods of
// exported types, and the types written on exported vars and consts.
//
// Values are allowed: `ErrClosed = verbs.ErrClosed` gives the public
// package the internal error under a public name and its type is error;
// `RemoteRead Access = verbs.AccessRemoteRead` has the public type
// written. An exported var whose internal type is only inferred from its
// value (`var X = verbs.T{}`) would escape this check; it needs go/types,
// and there is none today.
func TestAPINamesNoInternalType(t *testing.T) {
	for _, dir := range []string{".", filepath.Join("metrics", "promrdma")} {
		t.Run(dir, func(t *testing.T) {
			if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) && dir != "." {
				// A separate module, so absent from this module's
				// download (go test all in a user's module).
				t.Skipf("no %s in this copy of the module", dir)
			}
			fset := token.NewFileSet()
			names, err := filepath.Glob(filepath.Join(dir, "*.go"))
			require.NoError(t, err)
			var files []*ast.File
			for _, name := range names {
				if strings.HasSuffix(name, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
				require.NoError(t, err)
				files = append(files, f)
			}
			// Guards the check itself: no files would pass it vacuously.
			require.NotEmpty(t, files, "no Go files in %s", dir)
			found := internalInAPI(fset, files)
			assert.Empty(t, found, "the exported API of %s names internal types:\n%s", dir, strings.Join(found, "\n"))
		})
	}
}

// Rule: the check catches every kind of exported declaration that can
// name an internal type, and lets values and unexported names through.
// Without it, a check that found nothing would look like a clean API.
func TestAPICheckCatchesInternal(t *testing.T) {
	const src = `package p

import (
	"io"

	"example.com/m/internal/verbs"
	v2 "example.com/m/internal/other"
)

type Alias = verbs.DeviceInfo
type Named verbs.GID
type Struct struct {
	Field  []verbs.PortInfo
	Nested struct{ Deep map[string]*v2.T }
	hidden verbs.QP
	io.Reader
	*verbs.Embedded
}
type Iface interface {
	Method(verbs.Access) error
	hidden() verbs.QP
}
type Generic[T verbs.Constraint] struct{}

func Func(x int) (verbs.MTU, error) { return 0, nil }
func (Struct) Method() func(v2.T)   {}
func (*Struct) hidden() verbs.QP    {}
func unexported() verbs.QP          {}

type unexportedT struct{}

func (unexportedT) Exported() verbs.QP { return nil }

var Typed verbs.Access = 1
var ErrAllowed = verbs.ErrClosed
var hiddenVar verbs.Access
const Const verbs.PortState = 4
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	require.NoError(t, err)
	got := internalInAPI(fset, []*ast.File{f})
	want := []string{
		"p.go:10:6: Alias names verbs.DeviceInfo",
		"p.go:11:6: Named names verbs.GID",
		"p.go:13:2: Struct.Field names verbs.PortInfo",
		"p.go:14:2: Struct.Nested names v2.T",
		"p.go:17:2: Struct.Embedded names verbs.Embedded",
		"p.go:20:2: Iface.Method names verbs.Access",
		"p.go:23:6: Generic names verbs.Constraint",
		"p.go:25:6: Func names verbs.MTU",
		"p.go:26:15: Struct.Method names v2.T",
		"p.go:34:5: Typed names verbs.Access",
		"p.go:37:7: Const names verbs.PortState",
	}
	assert.Equal(t, want, got)
}

// internalInAPI lists, as "file:line:col: Decl names pkg.Type", every
// internal type the exported declarations of files name. An import is
// internal when its path has an internal element; a file's import names
// are its explicit names, else the last element of the path (every
// internal package of this module is named after its directory).
func internalInAPI(fset *token.FileSet, files []*ast.File) []string {
	var found []string
	for _, f := range files {
		internal := map[string]bool{}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil || !strings.Contains("/"+p+"/", "/internal/") {
				continue
			}
			name := path.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			internal[name] = true
		}
		check := func(pos token.Pos, decl string, e ast.Node) {
			for _, sel := range internalSelectors(e, internal) {
				found = append(found, fmt.Sprintf("%s: %s names %s", fset.Position(pos), decl, sel))
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				name := d.Name.Name
				if d.Recv != nil {
					recv := receiverName(d.Recv.List[0].Type)
					if !ast.IsExported(recv) {
						continue
					}
					name = recv + "." + name
				}
				check(d.Name.Pos(), name, d.Type)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						if s.TypeParams != nil {
							check(s.Name.Pos(), s.Name.Name, s.TypeParams)
						}
						checkType(s.Name, s.Type, check)
					case *ast.ValueSpec:
						// Only a type written counts: the values
						// are allowed (see TestAPINamesNoInternalType).
						if s.Type == nil {
							continue
						}
						for _, n := range s.Names {
							if n.IsExported() {
								check(n.Pos(), n.Name, s.Type)
							}
						}
					}
				}
			}
		}
	}
	return found
}

// checkType checks the type of the exported type spec name: a struct's
// exported fields and an interface's exported methods and embedded
// interfaces one by one, so that each problem names its member, and any
// other type whole.
func checkType(name *ast.Ident, typ ast.Expr, check func(token.Pos, string, ast.Node)) {
	var fields []*ast.Field
	switch t := typ.(type) {
	case *ast.StructType:
		fields = t.Fields.List
	case *ast.InterfaceType:
		fields = t.Methods.List
	default:
		check(name.Pos(), name.Name, typ)
		return
	}
	for _, fl := range fields {
		if len(fl.Names) == 0 { // embedded: its type is its name
			if ast.IsExported(receiverName(fl.Type)) {
				check(fl.Pos(), name.Name+"."+receiverName(fl.Type), fl.Type)
			}
			continue
		}
		for _, n := range fl.Names {
			if n.IsExported() {
				check(n.Pos(), name.Name+"."+n.Name, fl.Type)
			}
		}
	}
}

// internalSelectors lists the pkg.Name selectors in e whose pkg is an
// internal import, skipping the unexported fields and methods of nested
// struct and interface types (users cannot reach them).
func internalSelectors(e ast.Node, internal map[string]bool) []string {
	var sels []string
	var walk func(n ast.Node) bool
	walk = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && internal[x.Name] {
				sels = append(sels, x.Name+"."+n.Sel.Name)
			}
			return false
		case *ast.StructType, *ast.InterfaceType:
			var list *ast.FieldList
			if s, ok := n.(*ast.StructType); ok {
				list = s.Fields
			} else {
				list = n.(*ast.InterfaceType).Methods
			}
			for _, fl := range list.List {
				if len(fl.Names) == 0 || fl.Names[0].IsExported() {
					ast.Inspect(fl.Type, walk)
				}
			}
			return false
		}
		return true
	}
	ast.Inspect(e, walk)
	return sels
}

// receiverName is the name of the type in a receiver or embedded field:
// T, *T, T[P], pkg.T.
func receiverName(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.SelectorExpr:
			return t.Sel.Name
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}
