package ibv_test

import (
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBindingDuplicates lists the functions of the same name (receiver
// type included) in the cgo binding's files and in the purego binding's,
// with how alike their texts are, and fails on a pair at least
// dupThreshold alike: logic both bindings need belongs in the shared
// files, above the calls into C each binding keeps. Run it with -v to
// see every pair:
//
//	go test -run TestBindingDuplicates -v ./internal/ibv
func TestBindingDuplicates(t *testing.T) {
	cgo, purego := bindingFuncs(t)
	var names []string
	for name := range cgo {
		if _, ok := purego[name]; ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var dups []string
	dupLines := 0
	for _, name := range names {
		a, b := cgo[name], purego[name]
		same, r := similarity(a, b)
		t.Logf("%5.1f%%  %3d/%3d lines alike  %s", 100*r, same, max(len(a), len(b)), name)
		if r >= dupThreshold {
			dups = append(dups, name)
			dupLines += same
		}
	}
	t.Logf("%d same-named cgo/purego function pairs, %d at least %.0f%% alike (%d lines alike)",
		len(names), len(dups), 100*dupThreshold, dupLines)
	require.NotEmpty(t, names, "no function pairs found: were the binding files renamed?")
	require.Empty(t, dups, "near-duplicate functions in the cgo and purego bindings: move what they share into a shared file")
}

// dupThreshold is the similarity at which a pair counts as a duplicate.
const dupThreshold = 0.8

// bindingFuncs returns the functions of the cgo binding's files and of
// the purego binding's, by name, each as its lines without indentation
// and without blank lines. A file belongs to the cgo binding when its
// build constraint holds on linux/amd64 with cgo and not without; to
// the purego binding in the opposite case.
func bindingFuncs(t *testing.T) (cgo, purego map[string][]string) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	cgo, purego = map[string][]string{}, map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		require.NoError(t, err)
		withCgo, withoutCgo := buildsOn(f, true), buildsOn(f, false)
		var into map[string][]string
		switch {
		case withCgo && !withoutCgo:
			into = cgo
		case withoutCgo && !withCgo:
			into = purego
		default:
			continue
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			start, end := fset.Position(fd.Pos()).Offset, fset.Position(fd.End()).Offset
			into[funcName(fd)] = codeLines(string(src[start:end]))
		}
	}
	return cgo, purego
}

// buildsOn reports whether f's build constraint holds on linux/amd64,
// with or without cgo.
func buildsOn(f *ast.File, cgo bool) bool {
	for _, g := range f.Comments {
		if g.Pos() > f.Package {
			break
		}
		for _, c := range g.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false
			}
			return expr.Eval(func(tag string) bool {
				return tag == "linux" || tag == "amd64" || tag == "unix" || (tag == "cgo" && cgo)
			})
		}
	}
	return true
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return fmt.Sprintf("(%s).%s", id.Name, fd.Name.Name)
	}
	return fd.Name.Name
}

func codeLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// similarity is how many lines a and b have in common, in order (their
// longest common subsequence), and the ratio 2*common/(len(a)+len(b)):
// 1 for identical texts, 0 for texts with no line in common.
func similarity(a, b []string) (int, float64) {
	if len(a)+len(b) == 0 {
		return 0, 1
	}
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for i := range a {
		for j := range b {
			switch {
			case a[i] == b[j]:
				cur[j+1] = prev[j] + 1
			case prev[j+1] >= cur[j]:
				cur[j+1] = prev[j+1]
			default:
				cur[j+1] = cur[j]
			}
		}
		prev, cur = cur, prev
	}
	common := prev[len(b)]
	return common, 2 * float64(common) / float64(len(a)+len(b))
}
