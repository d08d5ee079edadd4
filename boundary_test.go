package rdma_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// Rule: internal/ibv is the only package that imports "C". Everything
// else must build with CGO_ENABLED=0 and stay free of C types.
func TestOnlyIBVImportsC(t *testing.T) {
	checked := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != "." || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			// internal/ibv/abicheck, built only with the rdmaheaders tag,
			// checks the binding's ABI declarations against rdma-core's
			// headers: part of the binding, never of a build.
			if dir := filepath.ToSlash(filepath.Dir(path)); imp.Path.Value == `"C"` && dir != "internal/ibv" && dir != "internal/ibv/abicheck" {
				t.Errorf("%s imports \"C\"; only internal/ibv may", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked only %d Go files; is the test running from the module root?", checked)
	}
}
