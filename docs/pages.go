package docs

import (
	"bytes"
	"fmt"
	"html"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/text"
)

// This file renders the Markdown pages as HTML for popsub serve's
// /docs/, with goldmark: headings get ids, links between pages lead to
// the served pages, links into the source to /source, and every page
// leads back to the playground. The Markdown stays the one source: the
// same files read on a code host and run by the docs test.

// Page is one rendered page.
type Page struct {
	Name  string // the address under /docs/: "2-at-least-once"
	Title string // its first heading
	HTML  []byte // the whole document
}

// Pages renders every Markdown page, and lists the pictures they show,
// by name, to serve beside them.
func Pages() ([]Page, map[string][]byte, error) {
	md := goldmark.New(goldmark.WithExtensions(extension.GFM),
		goldmark.WithParserOptions(parser.WithAutoHeadingID()))
	names, _ := fs.Glob(markdown, "*.md")
	var pages []Page
	for _, name := range names {
		source, _ := fs.ReadFile(markdown, name)
		page, err := render(md, strings.TrimSuffix(name, ".md"), source)
		if err != nil {
			return nil, nil, fmt.Errorf("render %s: %w", name, err)
		}
		pages = append(pages, page)
	}
	pages = append(pages, index(pages))
	pictures := map[string][]byte{}
	for _, name := range []string{"playground.png", "playground-phone.png"} {
		pictures[name], _ = fs.ReadFile(images, name)
	}
	return pages, pictures, nil
}

// render turns one page's Markdown into a document.
func render(md goldmark.Markdown, name string, source []byte) (Page, error) {
	ids := parser.WithIDs(&codeHostIDs{seen: map[string]int{}})
	doc := md.Parser().Parse(text.NewReader(source),
		parser.WithContext(parser.NewContext(ids)))
	title := name
	ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Heading:
			if n.Level == 1 && title == name {
				title = plain(n, source)
			}
		case *ast.Link:
			n.Destination = []byte(served(string(n.Destination)))
		case *ast.Image:
			n.Destination = []byte(served(string(n.Destination)))
		}
		return ast.WalkContinue, nil
	})
	var body bytes.Buffer
	if err := md.Renderer().Render(&body, source, doc); err != nil {
		return Page{}, err
	}
	var page bytes.Buffer
	fmt.Fprintf(&page, pageHead, html.EscapeString(title))
	page.Write(unlinked(body.Bytes()))
	page.WriteString(pageFoot)
	return Page{Name: name, Title: title, HTML: page.Bytes()}, nil
}

// codeHostIDs gives headings the ids a code host's rendering gives them,
// so that a link written for one works on the other: lower case,
// letters, digits, - and _ kept, a space made -, anything else dropped,
// and -1, -2, … after an id already given. goldmark's own turn _ into -,
// and "#expiry-ttl_ms" led nowhere on the served page.
type codeHostIDs struct{ seen map[string]int }

// Generate returns the id of a heading whose text is value.
func (c *codeHostIDs) Generate(value []byte, _ ast.NodeKind) []byte {
	var id []byte
	for _, r := range strings.ToLower(string(value)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			id = utf8.AppendRune(id, r)
		case r == ' ':
			id = append(id, '-')
		}
	}
	n := c.seen[string(id)]
	c.seen[string(id)]++
	if n > 0 {
		id = fmt.Appendf(id, "-%d", n)
	}
	return id
}

// Put notes an id a heading was given by hand.
func (c *codeHostIDs) Put(value []byte) { c.seen[string(value)]++ }

// index is the page at /docs/ itself: every page, by its title.
func index(pages []Page) Page {
	var page bytes.Buffer
	fmt.Fprintf(&page, pageHead, "Docs")
	page.WriteString("<h1>PopSub's docs</h1>\n<ul>\n")
	for _, p := range pages {
		fmt.Fprintf(&page, "<li><a href=\"/docs/%s\">%s</a></li>\n", p.Name,
			html.EscapeString(p.Title))
	}
	page.WriteString("</ul>\n" + pageFoot)
	return Page{Name: "", Title: "Docs", HTML: page.Bytes()}
}

// plain is the text of a node, without its markup.
func plain(n ast.Node, source []byte) string {
	var b strings.Builder
	for child := n.FirstChild(); child != nil; child = child.NextSibling() {
		if t, ok := child.(*ast.Text); ok {
			b.Write(t.Segment.Value(source))
		} else {
			b.WriteString(plain(child, source))
		}
	}
	return b.String()
}

// served is where a link of a page leads on the broker: another page to
// /docs/NAME, the source to /source, a picture to /docs/NAME.png. A link
// to a file the broker does not serve becomes "#unlinked", for unlinked
// to turn into plain text; an absolute link stays.
func served(destination string) string {
	u, err := url.Parse(destination)
	if err != nil || u.Scheme != "" || u.Host != "" {
		return destination
	}
	fragment := ""
	if u.Fragment != "" {
		fragment = "#" + u.Fragment
	}
	switch file := path.Base(u.Path); {
	case u.Path == "":
		return destination
	case u.Path == "source.html", u.Path == "../popsub.go":
		return "/source" + fragment
	case !strings.Contains(u.Path, "/") && strings.HasSuffix(file, ".md"):
		return "/docs/" + strings.TrimSuffix(file, ".md") + fragment
	case !strings.Contains(u.Path, "/") && strings.HasSuffix(file, ".png"):
		return "/docs/" + file
	}
	return "#unlinked"
}

// unlinkedLink matches the links served gave up on.
var unlinkedLink = regexp.MustCompile(`<a href="#unlinked">(.*?)</a>`)

// unlinked turns the links to files the broker does not serve into their
// text.
func unlinked(body []byte) []byte {
	return unlinkedLink.ReplaceAll(body, []byte("$1"))
}

// pageHead opens a page; its title goes in %s. The style is small and
// inline: a page of text needs no stylesheet of its own.
const pageHead = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>%s · PopSub</title>
<link rel="icon" href="data:,">
<style>
body{font:16px/1.55 system-ui,sans-serif;margin:0 auto;max-width:46rem;
padding:0 1rem 4rem;color:#1b1b1b;background:#fff}
nav{padding:.75rem 0;border-bottom:1px solid #ddd;margin-bottom:1rem}
nav a{margin-right:.9rem}
a{color:#0b57a4}
pre{background:#f4f4f4;padding:.75rem;overflow-x:auto;font-size:14px;
line-height:1.4}
code{font-size:.92em}
table{border-collapse:collapse;display:block;overflow-x:auto}
td,th{border:1px solid #ccc;padding:.3rem .5rem;vertical-align:top}
img{max-width:100%%}
</style>
</head>
<body>
<nav aria-label="docs">
<a href="/">the playground</a>
<a href="/docs/1-first-message">tutorials</a>
<a href="/docs/protocol">protocol</a>
<a href="/docs/security">security</a>
<a href="/docs/reliability">reliability</a>
<a href="/docs/performance">performance</a>
<a href="/source">the source</a>
</nav>
<main>
`

// pageFoot closes a page.
const pageFoot = `</main>
<p><a href="/">Back to the playground</a></p>
</body>
</html>
`
