package rdma_test

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/tools/go/packages"
)

// Rule (static): no function of the module returns, in a result of
// interface type (error, net.Conn, net.Listener, io...), the pointer
// result of a call in the same position directly: a nil pointer would
// become a non-nil interface (TestFailedDialIsNilInterface is the case
// that was found). Such a return must test the error first. The calls
// are resolved by the type checker: functions of the package, of other
// packages (pkg.F), methods and function values alike. The module is
// checked in each build configuration its files need, and every file
// must have been checked in one of them.
func TestNoTypedNilReturns(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command to load the packages with (the VM runs test binaries only)")
	}
	configs := [][]string{
		{"CGO_ENABLED=0"}, // the purego binding
		{"CGO_ENABLED=0", "GOARCH=arm64"},
		{"CGO_ENABLED=0", "GOOS=darwin"},
	}
	// The cgo binding needs a C compiler to load; without one its files
	// go unchecked, and are only logged below.
	cc, _ := exec.Command("go", "env", "CC").Output()
	_, ccErr := exec.LookPath(strings.TrimSpace(string(cc)))
	if ccErr == nil {
		configs = append(configs, []string{"CGO_ENABLED=1"})
	}
	checked := map[string]bool{}
	var bad []string
	for _, env := range configs {
		pkgs, err := packages.Load(&packages.Config{
			Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
			Env:  append(os.Environ(), env...),
		}, "./...")
		require.NoError(t, err, "%v", env)
		for _, p := range pkgs {
			for _, e := range p.Errors {
				t.Errorf("%v: %s: %v", env, p.PkgPath, e)
			}
			for _, f := range p.GoFiles {
				checked[f] = true
			}
			for _, b := range typedNilReturns(p.Fset, p.Syntax, p.TypesInfo) {
				if !slices.Contains(bad, b) {
					bad = append(bad, b)
				}
			}
		}
	}
	assert.Empty(t, bad, "returns that turn a nil pointer into a non-nil interface")
	// Every source file was type-checked in one configuration, but for
	// those that need rdma-core's headers (the rdmaheaders tag).
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || isModule(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		switch {
		case checked[abs] || needsHeaders(t, path):
		case ccErr != nil:
			t.Logf("%s unchecked: no C compiler for the cgo configuration (%v)", path, ccErr)
		default:
			t.Errorf("%s was type-checked in none of the configurations %v", path, configs)
		}
		return nil
	})
	require.NoError(t, err)
}

// isModule says whether dir holds a module of its own (metrics/promrdma,
// the examples), which ./... leaves out.
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// needsHeaders says whether the file at path builds only with the
// rdmaheaders tag.
func needsHeaders(t *testing.T, path string) bool {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.PackageClauseOnly|parser.ParseComments)
	require.NoError(t, err)
	for _, g := range f.Comments {
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, "//go:build") && strings.Contains(c.Text, "rdmaheaders") {
				return true
			}
		}
	}
	return false
}

// typedNilReturns finds, in the type-checked files, the returns whose
// results are one call (of any function, method or function value) that
// has a pointer result where the enclosing function has an interface
// result. Conversions and builtins are not calls here: new never
// returns nil.
func typedNilReturns(fset *token.FileSet, files []*ast.File, info *types.Info) []string {
	var bad []string
	for _, f := range files {
		var sigs []*types.Signature // of the enclosing functions, innermost last
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			var sig *types.Signature
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				if obj := info.Defs[fn.Name]; obj != nil {
					sig, _ = obj.Type().(*types.Signature)
				}
				body = fn.Body
			case *ast.FuncLit:
				sig, _ = info.TypeOf(fn).(*types.Signature)
				body = fn.Body
			case *ast.ReturnStmt:
				if len(sigs) > 0 && sigs[len(sigs)-1] != nil {
					if name := typedNilCall(info, sigs[len(sigs)-1], fn); name != "" {
						bad = append(bad, fset.Position(n.Pos()).String()+": returns "+name+"(...)")
					}
				}
				return true
			default:
				return true
			}
			if body != nil {
				sigs = append(sigs, sig)
				ast.Inspect(body, visit)
				sigs = sigs[:len(sigs)-1]
			}
			return false
		}
		ast.Inspect(f, visit)
	}
	return bad
}

// typedNilCall is the name of the call that ret returns whole, if a
// pointer result of it lands in an interface result of sig.
func typedNilCall(info *types.Info, sig *types.Signature, ret *ast.ReturnStmt) string {
	if len(ret.Results) != 1 {
		return ""
	}
	call, ok := ast.Unparen(ret.Results[0]).(*ast.CallExpr)
	if !ok {
		return ""
	}
	if tv, ok := info.Types[call.Fun]; !ok || tv.IsType() || tv.IsBuiltin() {
		return ""
	}
	var got []types.Type
	switch tt := info.TypeOf(call).(type) {
	case *types.Tuple:
		for v := range tt.Variables() {
			got = append(got, v.Type())
		}
	case nil:
		return ""
	default:
		got = []types.Type{tt}
	}
	want := sig.Results()
	for i := range min(len(got), want.Len()) {
		_, ptr := got[i].Underlying().(*types.Pointer)
		if ptr && types.IsInterface(want.At(i).Type()) {
			return types.ExprString(call.Fun)
		}
	}
	return ""
}

// Rule: the analysis of TestNoTypedNilReturns finds a typed-nil return
// through a method call, a call of another package's function, and a
// function value, and passes the same results once the error is tested.
func TestTypedNilReturnsFound(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command for the standard library's export data (the VM runs test binaries only)")
	}
	const src = `package p

import (
	"errors"
	"net"
)

type dialer struct{}

func (d *dialer) dial() (*net.TCPConn, error) { return nil, errors.New("refused") }

type myErr struct{}

func (*myErr) Error() string { return "mine" }

func ViaMethod(d *dialer) (net.Conn, error) {
	return d.dial()
}

func ViaPackage(a *net.TCPAddr) (net.Conn, error) {
	return net.DialTCP("tcp", nil, a)
}

func ViaValue() error {
	check := func() *myErr { return nil }
	return check()
}

func Tested(d *dialer) (net.Conn, error) {
	c, err := d.dial()
	if err != nil {
		return nil, err
	}
	return c, nil
}

func Concrete(d *dialer) (*net.TCPConn, error) {
	return d.dial()
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	require.NoError(t, err)
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}}
	_, err = (&types.Config{Importer: importer.Default()}).Check("p", fset, []*ast.File{f}, info)
	require.NoError(t, err)
	got := typedNilReturns(fset, []*ast.File{f}, info)
	want := []string{"p.go:17:2: returns d.dial(...)", "p.go:21:2: returns net.DialTCP(...)", "p.go:26:2: returns check(...)"}
	assert.Equal(t, want, got)
}
