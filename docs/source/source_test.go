package source

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func TestCommittedPageIsCurrent(t *testing.T) {
	src, err := os.ReadFile("../../popsub.go")
	if err != nil {
		t.Fatal(err)
	}
	page, err := Render("popsub.go", src)
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
`)
	page, err := Render("p.go", src)
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
