package popsub

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBehaviour_EveryTestIsListed reads this package's tests and finds
// each one that starts a broker on the run's engine: a call to
// startBroker (or a variant) whose Options name no Store. Each must be in
// Behaviour, which runs again on JetStream, or in oneEngine, which says
// why not: a new test cannot quietly skip the shared log.
func TestBehaviour_EveryTestIsListed(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	var onEngine []string
	for _, name := range files {
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if ok && strings.HasPrefix(fn.Name.Name, "Test") &&
				startsOnTheEngine(fn.Body) {
				onEngine = append(onEngine, fn.Name.Name)
			}
		}
	}
	for _, name := range onEngine {
		_, listed := Behaviour[name]
		if _, why := oneEngine[name]; !listed && !why {
			t.Errorf("%s starts a broker on the run's engine: add it to "+
				"Behaviour, or to oneEngine with the reason it cannot run "+
				"on JetStream", name)
		}
	}
	for name := range Behaviour {
		if !slices.Contains(onEngine, name) {
			t.Errorf("Behaviour lists %s, which starts no broker on the "+
				"run's engine", name)
		}
	}
	if len(onEngine) < 20 {
		t.Fatalf("found %d tests on the engine, fewer than the %d listed: "+
			"the search is broken", len(onEngine), len(Behaviour))
	}
}

// startsOnTheEngine reports whether body calls startBroker, or a variant,
// with Options that name no Store.
func startsOnTheEngine(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		fun, ok := call.Fun.(*ast.Ident)
		if !ok || !strings.HasPrefix(fun.Name, "startBroker") ||
			len(call.Args) < 2 {
			return true
		}
		options, ok := call.Args[1].(*ast.CompositeLit)
		found = found || ok && !slices.ContainsFunc(options.Elts,
			func(e ast.Expr) bool {
				kv, ok := e.(*ast.KeyValueExpr)
				key, _ := kv.Key.(*ast.Ident)
				return ok && key != nil && key.Name == "Store"
			})
		return true
	})
	return found
}
