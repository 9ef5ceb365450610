package source

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommittedPageIsCurrent(t *testing.T) {
	files, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	page, err := Render(files)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../source.html")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(page, committed) {
		t.Fatal("docs/source.html is stale: run go generate ./docs")
	}
}

func TestRender_AnchorsSectionsByDeclaration(t *testing.T) {
	src := []byte(`// Package p is a test.
package p

// # The thing
//
// Why it is so.

// Thing is a thing.
type Thing struct{}

// Do does <it>.
func (t *Thing) Do() string {
	// Say hello.
	return "hi" // a greeting
}

// init is declared in no scope, so nothing may link to it.
func init() { var x Thing; x.Do() }
`)
	page, err := Render([]File{{"p.go", src}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`id="the-thing"`, `<h2>The thing</h2>`,
		`id="Thing"`, `id="Thing.Do"`, `Do does &lt;it&gt;.`,
		`<span class="s">&#34;hi&#34;</span>`,
		`<span class="c">// a greeting</span>`, `<p>Say hello.`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("page lacks %s", want)
		}
	}
}

// TestRender_LinksWhatANameRefersTo: a name links to a top-level
// declaration only where it refers to it, as the type checker sees the
// file without its imports: not as a struct literal's field, nor as a
// local that shares the name, but as a type argument of an imported
// generic type.
func TestRender_LinksWhatANameRefersTo(t *testing.T) {
	src := []byte(`// Package p is a test.
package p

import "example.com/box"

// Item is a thing.
type Item struct{ name string }

// Pair holds an item.
type Pair struct{ Item Item }

// name is a top-level name a field and a local share.
const name = "n"

// Make makes a pair and a box.
func Make() (Pair, box.Of[Item]) {
	name := "local"
	return Pair{Item: Item{name: name}}, box.Of[Item]{}
}
`)
	page, err := Render([]File{{"p.go", src}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`<a href="#Pair">Pair</a>{Item: <a href="#Item">Item</a>{name: name}}`,
		`box.Of[<a href="#Item">Item</a>]{}`} {
		if !strings.Contains(string(page), want) {
			t.Errorf("page lacks %s", want)
		}
	}
}

func TestQuotesInTheDocsAreCurrent(t *testing.T) {
	files, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	paths, _ := filepath.Glob("../*.md")
	total := 0
	for _, path := range paths {
		md, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		updated, count, err := UpdateQuotes(string(md), files)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if updated != string(md) {
			t.Errorf("%s quotes stale code: run go generate ./docs", path)
		}
		total += count
	}
	if total == 0 {
		t.Error("no tutorial quotes the code; each should")
	}
}

func TestQuote_FindsDeclarationsByName(t *testing.T) {
	src := []byte("package p\n\n// T is a type.\ntype T int\n\n" +
		"// M is a method.\nfunc (t *T) M() {}\n\n" +
		"const (\n\tA = 1\n\tB = 2\n)\n")
	for name, want := range map[string]string{
		"T":   "// T is a type.\ntype T int",
		"T.M": "// M is a method.\nfunc (t *T) M() {}",
		"B":   "B = 2",
	} {
		got, err := Quote([]File{{"p.go", src}}, name)
		if err != nil || got != want {
			t.Errorf("Quote(%s) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := Quote([]File{{"p.go", src}}, "Missing"); err == nil {
		t.Error("Quote found a declaration that does not exist")
	}
}

// A function that locks, starts a goroutine or selects is priced at the
// dense pace, every line of it; one that does none of these is not.
func TestMeasure_PricesConcurrentCodeDense(t *testing.T) {
	src := []byte(`package p

// # Plain

// plain adds.
func plain(a, b int) int {
	return a + b
}

// # Busy

// locked locks.
func locked(mu interface{ Lock(); Unlock() }) {
	mu.Lock()
	defer mu.Unlock()
}

// started starts a goroutine.
func started() {
	go func() {}()
}

// waits selects.
func waits(c chan int) {
	select {
	case <-c:
	}
}
`)
	b, err := Measure(src)
	if err != nil {
		t.Fatal(err)
	}
	dense := map[string]int{}
	for _, s := range b.Sections {
		dense[s.Title] = s.Dense
	}
	if dense["Plain"] != 0 {
		t.Errorf("Plain has %d dense lines, want 0", dense["Plain"])
	}
	if want := 4 + 3 + 5; dense["Busy"] != want {
		t.Errorf("Busy has %d dense lines, want %d", dense["Busy"], want)
	}
}

func TestMeasure_CountsOneLineCommentsInFunctions(t *testing.T) {
	// Two comments in f, one of two lines; a doc comment and a comment
	// between functions are not in a function.
	src := []byte(`package p

// f is documented.
func f() {
	// one line
	x := 1
	// two
	// lines
	_ = x
}

// loose
`)
	b, err := Measure(src)
	if err != nil {
		t.Fatal(err)
	}
	if b.InFunctionComments != 2 || b.OneLineComments != 1 {
		t.Errorf("in-function comments %d, of one line %d; want 2, 1",
			b.InFunctionComments, b.OneLineComments)
	}
}
