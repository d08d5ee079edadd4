package rdma_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Rule (static): no function of the module returns, in a result of
// interface type (error, net.Conn, net.Listener, io...), the pointer
// result of a call in the same position directly: a nil pointer would
// become a non-nil interface (TestFailedDialIsNilInterface is the case
// that was found). Such a return must test the error first.
func TestNoTypedNilReturns(t *testing.T) {
	var bad []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			bad = append(bad, typedNilReturns(t, path)...)
		}
		return nil
	})
	require.NoError(t, err)
	assert.Empty(t, bad, "returns that turn a nil pointer into a non-nil interface")
}

// typedNilReturns checks the package in dir (test files left out).
func typedNilReturns(t *testing.T, dir string) []string {
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	require.NoError(t, err)
	// The files by package name (a directory may hold a main package's
	// files beside ignored ones); test files left out.
	pkgs := map[string][]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
	}
	var bad []string
	for _, files := range pkgs {
		// The functions of the package whose results are pointers, by
		// position.
		ptrResults := map[string][]bool{}
		var funcs []*ast.FuncDecl
		for _, f := range files {
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Type.Results == nil {
					continue
				}
				funcs = append(funcs, fd)
				if fd.Recv == nil {
					ptrResults[fd.Name.Name] = resultKinds(fd.Type.Results, isPointer)
				}
			}
		}
		for _, fd := range funcs {
			if fd.Body == nil {
				continue
			}
			ifaces := resultKinds(fd.Type.Results, isInterface)
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok {
					return false // its returns are its own
				}
				ret, ok := n.(*ast.ReturnStmt)
				if !ok || len(ret.Results) != 1 {
					return true
				}
				call, ok := ret.Results[0].(*ast.CallExpr)
				if !ok {
					return true
				}
				id, ok := call.Fun.(*ast.Ident)
				if !ok {
					return true
				}
				ptrs := ptrResults[id.Name]
				for i := range min(len(ptrs), len(ifaces)) {
					if ptrs[i] && ifaces[i] {
						bad = append(bad, fset.Position(ret.Pos()).String()+": "+fd.Name.Name+" returns "+id.Name+"(...)")
					}
				}
				return true
			})
		}
	}
	return bad
}

// resultKinds says, for each result in fl, whether is holds for its type.
func resultKinds(fl *ast.FieldList, is func(ast.Expr) bool) []bool {
	var out []bool
	for _, f := range fl.List {
		n := max(len(f.Names), 1)
		for range n {
			out = append(out, is(f.Type))
		}
	}
	return out
}

func isPointer(e ast.Expr) bool { _, ok := e.(*ast.StarExpr); return ok }

// isInterface: error, and the interfaces of net and io (net.Conn,
// net.Listener, net.Addr, io.Reader ...).
func isInterface(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name == "error" || e.Name == "any"
	case *ast.InterfaceType:
		return true
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			switch x.Name + "." + e.Sel.Name {
			case "net.Conn", "net.Listener", "net.Addr", "net.PacketConn", "net.Error":
				return true
			}
			return x.Name == "io"
		}
	}
	return false
}
