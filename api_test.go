package rdma_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// promrdmaDir is metrics/promrdma, a module of its own.
var promrdmaDir = filepath.Join("metrics", "promrdma")

// skipIfLeftOut skips t when dir is a module of its own that this copy
// of the module leaves out: a module download (the module cache's copy
// of module@version, which go test all in a user's module runs) has no
// nested module. In a checkout every directory checked must be there.
func skipIfLeftOut(t *testing.T, dir string) {
	t.Helper()
	_, err := os.Stat(dir)
	if !errors.Is(err, fs.ErrNotExist) {
		return
	}
	here, aerr := filepath.Abs(".")
	require.NoError(t, aerr)
	if dir == promrdmaDir && strings.Contains(filepath.Base(here), "@") {
		t.Skipf("no %s in the module download %s", dir, here)
	}
	t.Fatalf("no %s in this checkout (%s): nothing of it was checked", dir, here)
}

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
	for _, dir := range []string{".", "rdmatest", promrdmaDir} {
		t.Run(dir, func(t *testing.T) {
			skipIfLeftOut(t, dir)
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
			// The functional options are the one exception: only the
			// With functions make them, and what they set is theirs.
			found := slices.DeleteFunc(internalInAPI(fset, files), func(s string) bool {
				return strings.HasSuffix(s, ": Option names unexported config") ||
					strings.HasSuffix(s, ": RegionOption names unexported regionRequest")
			})
			assert.Empty(t, found, "the exported API of %s names internal types or unexported names:\n%s", dir, strings.Join(found, "\n"))
		})
	}
}

// Rule: the check catches every kind of exported declaration that can
// name an internal type or an unexported name of the package, and lets
// values, type parameters and unexported declarations through.
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

const count = 2
type Arr [count]int
func Uses(n int, x unexportedT) {}
type Box[E any] struct{ V E }
func Map[K comparable, V any](m map[K]V) []K { return nil }
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
		"p.go:40:6: Arr names unexported count",
		"p.go:41:6: Uses names unexported unexportedT",
	}
	assert.Equal(t, want, got)
}

// internalInAPI lists, as "file:line:col: Decl names pkg.Type", every
// internal type the exported declarations of files name, and as "Decl
// names unexported x" every unexported name of the package they name (a
// type, or a constant such as an array's length): go doc shows the name
// and users cannot use it. An import is
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
		// Type parameters are names too, and allowed.
		tparams := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			var list *ast.FieldList
			switch n := n.(type) {
			case *ast.FuncType:
				list = n.TypeParams
			case *ast.TypeSpec:
				list = n.TypeParams
			case *ast.FuncDecl:
				if n.Recv != nil {
					// func (x *T[P]) M(): P is a type parameter.
					ast.Inspect(n.Recv.List[0].Type, func(n ast.Node) bool {
						if ix, ok := n.(*ast.IndexExpr); ok {
							if id, ok := ix.Index.(*ast.Ident); ok {
								tparams[id.Name] = true
							}
						}
						if ix, ok := n.(*ast.IndexListExpr); ok {
							for _, e := range ix.Indices {
								if id, ok := e.(*ast.Ident); ok {
									tparams[id.Name] = true
								}
							}
						}
						return true
					})
				}
			}
			if list != nil {
				for _, fl := range list.List {
					for _, n := range fl.Names {
						tparams[n.Name] = true
					}
				}
			}
			return true
		})
		check := func(pos token.Pos, decl string, e ast.Node) {
			for _, sel := range internalSelectors(e, internal, tparams) {
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
// internal import, and as "unexported x" the unexported names of the
// package in e other than tparams, skipping the unexported fields and
// methods of nested struct and interface types (users cannot reach them)
// and the names of parameters and results.
func internalSelectors(e ast.Node, internal, tparams map[string]bool) []string {
	var sels []string
	var walk func(n ast.Node) bool
	walk = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && internal[x.Name] {
				sels = append(sels, x.Name+"."+n.Sel.Name)
			}
			return false
		case *ast.Ident:
			if !n.IsExported() && !tparams[n.Name] && types.Universe.Lookup(n.Name) == nil {
				sels = append(sels, "unexported "+n.Name)
			}
			return false
		case *ast.Field: // a parameter or result: its names are no type
			ast.Inspect(n.Type, walk)
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

// Rule: every exported identifier of the root package, rdmatest and
// metrics/promrdma has a doc comment: a func or method (of an exported
// type), a type, and a const or var, whose comment may be its group's or
// the line's own.
func TestAPIDocumented(t *testing.T) {
	for _, dir := range []string{".", "rdmatest", promrdmaDir} {
		t.Run(dir, func(t *testing.T) {
			skipIfLeftOut(t, dir)
			fset := token.NewFileSet()
			names, err := filepath.Glob(filepath.Join(dir, "*.go"))
			require.NoError(t, err)
			var missing []string
			seen := 0
			for _, name := range names {
				if strings.HasSuffix(name, "_test.go") {
					continue
				}
				f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
				require.NoError(t, err)
				missing = append(missing, undocumented(fset, f)...)
				seen++
			}
			require.NotZero(t, seen, "no Go files in %s", dir)
			assert.Empty(t, missing, "exported identifiers of %s without a doc comment:\n%s", dir, strings.Join(missing, "\n"))
		})
	}
}

// undocumented lists f's exported declarations that have no doc comment.
func undocumented(fset *token.FileSet, f *ast.File) []string {
	var out []string
	miss := func(pos token.Pos, what string) {
		out = append(out, fmt.Sprintf("%s: %s", fset.Position(pos), what))
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil {
				if recv := receiverName(d.Recv.List[0].Type); ast.IsExported(recv) {
					miss(d.Pos(), recv+"."+d.Name.Name)
				}
				continue
			}
			miss(d.Pos(), d.Name.Name)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && s.Doc == nil && d.Doc == nil {
						miss(s.Pos(), s.Name.Name)
					}
				case *ast.ValueSpec:
					if s.Doc != nil || s.Comment != nil || d.Doc != nil {
						continue
					}
					for _, n := range s.Names {
						if n.IsExported() {
							miss(n.Pos(), n.Name)
						}
					}
				}
			}
		}
	}
	return out
}
