// layout prints the figures the layers issue sets targets for, measured
// on the packages of a connection: the root (the API) and internal/rc
// (the connection's parts) by default, or the directories named:
//
//	go run ./scripts/layout [dir...]
//
// Methods per receiver type and the files they sit in, files over 600
// lines, the call sites of PostSend, where the records of an outstanding
// send WR are written (op table, inflight, the sent ring, send-queue room
// and counters), and comments that point at another .go file.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// records are the calls and fields that record an outstanding WR.
var records = map[string]bool{
	"ops.Add": true, "ops.Take": true, "life.AddInflight": true, "sent.push": true,
	"Ops.Add": true, "Ops.Take": true, "Life.AddInflight": true,
	"sent.popFront": true, "sent.popBack": true, "completed.Add": true, "heldOps.Store": true,
}

// recordFields are fields whose assignment records a WR.
var recordFields = map[string]bool{"sqFree": true, "posted": true}

// parts are the connection's parts, by the name of the field that holds
// them, and the files that own them: no other file should write their
// fields.
var parts = map[string][]string{
	"sq":   {"rc/sendq.go", "rc/sendwait.go", "rc/combine.go", "rc/queued.go", "rc/coalesce.go", "rc/sendcredit.go", "rc/revoked.go"},
	"cr":   {"rc/grants.go"},
	"cw":   {"rc/creditword.go"},
	"life": {"rc/life.go"},
	"rq":   {"rc/receiver.go"},
	"ctl":  {"rc/control.go"},
	"vd":   {"rc/verdict.go"},
	"iw":   {"iwarp.go"},
	"rg":   {"rc/regions.go"},
	"ops":  {"rc/ops.go"},
	// The same parts as rc.Conn's fields name them.
	"SQ":      {"rc/sendq.go", "rc/sendwait.go", "rc/combine.go", "rc/queued.go", "rc/coalesce.go", "rc/sendcredit.go", "rc/revoked.go"},
	"Grants":  {"rc/grants.go"},
	"Life":    {"rc/life.go"},
	"RQ":      {"rc/receiver.go"},
	"Ctl":     {"rc/control.go"},
	"Regions": {"rc/regions.go"},
	"Ops":     {"rc/ops.go"},
}

// mutators are the methods that write a field (atomics, locks excluded).
var mutators = map[string]bool{"Store": true, "Add": true, "Swap": true, "CompareAndSwap": true,
	"Push": true, "Pop": true, "Take": true, "push": true, "popFront": true, "popBack": true, "add": true, "take": true}

// partWrite reports the part whose field e writes (x.part.field), if any.
func partWrite(e ast.Expr) (string, bool) {
	sel, ok := e.(*ast.SelectorExpr) // x.part.field
	if !ok {
		return "", false
	}
	for {
		inner, ok := sel.X.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		if _, isPart := parts[inner.Sel.Name]; isPart {
			return inner.Sel.Name, true
		}
		sel = inner
	}
}

func main() {
	dirs := []string{".", "internal/rc"}
	if len(os.Args) > 1 {
		dirs = os.Args[1:]
	}
	fset := token.NewFileSet()
	var paths []string
	for _, dir := range dirs {
		p, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		paths = append(paths, p...)
	}
	files := map[string]*ast.File{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		files[path] = f
	}
	methods := map[string]int{}
	methodFiles := map[string]map[string]bool{}
	var big []string
	postSend := map[string]int{}
	recordSites := map[string]int{}
	var pointers []string
	foreign := map[string]int{} // "file -> part"
	owns := func(part, file string) bool {
		for _, f := range parts[part] {
			if f == file {
				return true
			}
		}
		return false
	}
	goFile := regexp.MustCompile(`\b[a-z0-9_]+\.go\b`)
	for path, f := range files {
		name := filepath.Base(path)
		pkg := filepath.Base(filepath.Dir(path))
		if pkg == "." || pkg == filepath.Base(mustAbs(".")) {
			pkg = "rdma"
		} else {
			name = pkg + "/" + name
		}
		if lines := fset.Position(f.End()).Line; lines > 600 {
			big = append(big, fmt.Sprintf("%s %d", name, lines))
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil {
				continue
			}
			t := fd.Recv.List[0].Type
			if s, ok := t.(*ast.StarExpr); ok {
				t = s.X
			}
			if id, ok := t.(*ast.Ident); ok {
				typ := pkg + "." + id.Name
				methods[typ]++
				if methodFiles[typ] == nil {
					methodFiles[typ] = map[string]bool{}
				}
				methodFiles[typ][name] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if sel.Sel.Name == "PostSend" {
					postSend[name]++
				}
				if x, ok := sel.X.(*ast.SelectorExpr); ok && records[x.Sel.Name+"."+sel.Sel.Name] {
					recordSites[name]++
				}
				if mutators[sel.Sel.Name] {
					if part, ok := partWrite(sel.X); ok && !owns(part, name) {
						foreign[name+" -> "+part]++
					}
				}
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if sel, ok := l.(*ast.SelectorExpr); ok && recordFields[sel.Sel.Name] {
						recordSites[name]++
					}
					if part, ok := partWrite(l); ok && !owns(part, name) {
						foreign[name+" -> "+part]++
					}
				}
			case *ast.IncDecStmt:
				if sel, ok := n.X.(*ast.SelectorExpr); ok && recordFields[sel.Sel.Name] {
					recordSites[name]++
				}
				if part, ok := partWrite(n.X); ok && !owns(part, name) {
					foreign[name+" -> "+part]++
				}
			}
			return true
		})
		for _, cg := range f.Comments {
			for _, m := range goFile.FindAllString(cg.Text(), -1) {
				if m != name {
					pointers = append(pointers, name+" -> "+m)
				}
			}
		}
	}
	fmt.Printf("methods by receiver (files), in %s:\n", strings.Join(dirs, " "))
	var types []string
	for t := range methods {
		types = append(types, t)
	}
	sort.Slice(types, func(i, j int) bool { return methods[types[i]] > methods[types[j]] })
	for _, t := range types {
		if methods[t] >= 5 {
			fmt.Printf("  %-20s %3d (%d files)\n", t, methods[t], len(methodFiles[t]))
		}
	}
	sort.Strings(big)
	fmt.Printf("files over 600 lines: %v\n", big)
	fmt.Printf("PostSend call sites: %s\n", counts(postSend))
	fmt.Printf("WR record writes by file: %s\n", counts(recordSites))
	fmt.Printf("writes of a part's fields outside its files: %s\n", counts(foreign))
	fmt.Printf("comments naming another .go file: %d\n", len(pointers))
	for _, p := range pointers {
		fmt.Println("  " + p)
	}
}

func counts(m map[string]int) string {
	var s []string
	total := 0
	for k, v := range m {
		s = append(s, fmt.Sprintf("%s %d", k, v))
		total += v
	}
	sort.Strings(s)
	return fmt.Sprintf("%d in %d files (%s)", total, len(m), strings.Join(s, ", "))
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}
