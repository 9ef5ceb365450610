// Package source renders a Go file as a page with prose beside code, as
// docco and Go by Example present source. Each run of comment lines that
// stands on its own lines opens a section: the prose goes on the left,
// the code that follows it on the right. A section that holds a
// declaration is anchored by its name (#Broker.Publish), so that links
// survive edits. Only the standard library is used: go/parser for the
// declarations, go/doc/comment for the prose, go/scanner for the
// highlighting and html/template for the page.
package source

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/scanner"
	"go/token"
	"html/template"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// section is one prose-and-code pair of the page.
type section struct {
	ID    string        // anchor: a declaration name, or s12
	Prose template.HTML // the comment run, rendered
	Code  template.HTML // the code that follows, highlighted
	Title string        // a banner's heading, if the prose is one
}

// File is one Go file of the page.
type File struct {
	Name string // as shown, and as the anchor of its first section
	Src  []byte
}

// PackageFiles are the broker's files: the broker is one file.
var PackageFiles = []string{"popsub.go"}

// Load reads PackageFiles from dir.
func Load(dir string) ([]File, error) {
	var files []File
	for _, name := range PackageFiles {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		files = append(files, File{name, src})
	}
	return files, nil
}

// Render returns the page for files, one after the other; each file
// after the first opens with a heading of its name.
func Render(files []File) ([]byte, error) {
	var sections []section
	for i, f := range files {
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f.Name, f.Src, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", f.Name, err)
		}
		if i > 0 {
			sections = append(sections, section{ID: f.Name, Title: f.Name})
		}
		names := declarationLines(fset, file)
		sections = append(sections, split(strings.Split(string(f.Src), "\n"),
			names, len(sections))...)
	}
	var out bytes.Buffer
	err := page.Execute(&out, struct {
		Name     string
		Sections []section
	}{files[0].Name, sections})
	return out.Bytes(), err
}

// declarationLines maps the first line of each top-level declaration, and
// of each declaration in a const, var or type group, to its name:
// "Broker", "Broker.Publish", "New".
func declarationLines(fset *token.FileSet, file *ast.File) map[int]string {
	names := map[int]string{}
	line := func(pos token.Pos) int { return fset.Position(pos).Line }
	for _, decl := range file.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			names[line(d.Pos())] = funcName(d)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				if name := specName(spec); name != "" {
					names[line(spec.Pos())] = name
					if len(d.Specs) == 1 {
						names[line(d.Pos())] = name
					}
				}
			}
		}
	}
	return names
}

// funcName is F or Receiver.F.
func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	if star, ok := t.(*ast.StarExpr); ok {
		t = star.X
	}
	if ident, ok := t.(*ast.Ident); ok {
		return ident.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

// specName is the first name a spec declares.
func specName(spec ast.Spec) string {
	switch s := spec.(type) {
	case *ast.TypeSpec:
		return s.Name.Name
	case *ast.ValueSpec:
		return s.Names[0].Name
	}
	return ""
}

// split cuts the file's lines into sections: a run of comment-only lines
// starts a new one, and the code after it belongs to it.
func split(lines []string, names map[int]string, before int) []section {
	var sections []section
	var prose, code []string
	id := ""
	flush := func() {
		if len(prose) == 0 && strings.TrimSpace(strings.Join(code, "")) == "" {
			return
		}
		sections = append(sections, newSection(prose, code, id,
			before+len(sections)))
		prose, code, id = nil, nil, ""
	}
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		isComment := strings.HasPrefix(trimmed, "//")
		if isComment && len(code) > 0 {
			flush()
		}
		if isComment && len(code) == 0 {
			prose = append(prose, strings.TrimPrefix(
				strings.TrimPrefix(trimmed, "//"), " "))
			continue
		}
		if name, ok := names[i+1]; ok && id == "" {
			id = name
		}
		code = append(code, line)
	}
	flush()
	return sections
}

// newSection renders one section. A prose run that is a banner
// ("# Title") becomes a heading.
func newSection(prose, code []string, id string, n int) section {
	if id == "" {
		id = fmt.Sprintf("s%d", n+1)
	}
	s := section{ID: id, Code: highlight(strings.Trim(
		strings.Join(code, "\n"), "\n"))}
	text := strings.Join(prose, "\n")
	if title, rest, ok := strings.Cut(text, "\n"); ok &&
		strings.HasPrefix(title, "# ") {
		s.Title = strings.TrimPrefix(title, "# ")
		s.ID = anchorOf(s.Title)
		text = rest
	} else if strings.HasPrefix(text, "# ") {
		s.Title, text = strings.TrimPrefix(text, "# "), ""
		s.ID = anchorOf(s.Title)
	}
	var parser comment.Parser
	printer := comment.Printer{HeadingLevel: 3}
	s.Prose = template.HTML(printer.HTML(parser.Parse(text)))
	return s
}

// anchorOf turns a heading into an anchor: "The log" → "the-log".
func anchorOf(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}

// highlight marks up Go code with go/scanner: keywords, strings,
// numbers and comments get a class each; everything is escaped.
func highlight(code string) template.HTML {
	var s scanner.Scanner
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(code))
	s.Init(file, []byte(code), nil, scanner.ScanComments)
	var out strings.Builder
	last := 0
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		start := file.Offset(pos)
		if tok == token.SEMICOLON && lit == "\n" {
			continue
		}
		end := start + len(tokenText(tok, lit))
		if end > len(code) || start < last {
			continue
		}
		out.WriteString(template.HTMLEscapeString(code[last:start]))
		out.WriteString(span(tok, code[start:end]))
		last = end
	}
	out.WriteString(template.HTMLEscapeString(code[last:]))
	return template.HTML(out.String())
}

// tokenText is the source text of a token.
func tokenText(tok token.Token, lit string) string {
	if lit != "" {
		return lit
	}
	return tok.String()
}

// span wraps text in the class of its token kind.
func span(tok token.Token, text string) string {
	class := ""
	switch {
	case tok.IsKeyword():
		class = "k"
	case tok == token.STRING || tok == token.CHAR:
		class = "s"
	case tok == token.INT || tok == token.FLOAT:
		class = "n"
	case tok == token.COMMENT:
		class = "c"
	}
	escaped := template.HTMLEscapeString(text)
	if class == "" {
		return escaped
	}
	return `<span class="` + class + `">` + escaped + `</span>`
}

// page is the HTML around the sections.
var page = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Name}} and its neighbours: PopSub, prose beside code</title>
<link rel="icon" href="data:,">
<style>
body { margin: 0; font: 15px/1.55 Georgia, serif; color: #1d232b; }
nav { padding: 8px 16px; font: 13px system-ui, sans-serif; border-bottom: 1px solid #ddd; }
.section { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); border-bottom: 1px solid #f0f0f0; }
.prose { padding: 8px 20px; background: #fff; }
.prose h2 { font: 600 20px system-ui, sans-serif; margin: 18px 0 6px; }
.prose h3 { font: 600 16px system-ui, sans-serif; }
.prose pre { font-size: 12px; background: #f6f7f9; padding: 6px; overflow-x: auto; }
.code { background: #f8f8f5; border-left: 1px solid #e6e6e0; }
.code pre { margin: 0; padding: 8px 14px; tab-size: 4; font: 12.5px/1.5 ui-monospace, monospace; overflow-x: auto; }
a.anchor { color: #bbb; text-decoration: none; font: 12px system-ui, sans-serif; float: right; }
.k { color: #7a3e9d; } .s { color: #2a7a2a; } .n { color: #9a5b00; } .c { color: #6b7380; font-style: italic; }
@media (max-width: 900px) { .section { grid-template-columns: 1fr; } }
</style>
</head>
<body>
<nav><a href="/">playground</a> · {{.Name}}, then <a href="#wire.go">wire.go</a>, <a href="#queues.go">queues.go</a>, <a href="#access.go">access.go</a>, <a href="#events.go">events.go</a> and <a href="#bolt.go">bolt.go</a>: prose on the left, code on the right</nav>
{{range .Sections}}<div class="section" id="{{.ID}}">
<div class="prose"><a class="anchor" href="#{{.ID}}">#{{.ID}}</a>{{if .Title}}<h2>{{.Title}}</h2>{{end}}{{.Prose}}</div>
<div class="code"><pre>{{.Code}}</pre></div>
</div>
{{end}}</body>
</html>
`))

// Quote returns the source of the declaration called name in files,
// with its doc comment: "Broker.Publish", "Options", "New".
func Quote(files []File, name string) (string, error) {
	for _, f := range files {
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f.Name, f.Src, parser.ParseComments)
		if err != nil {
			return "", err
		}
		for _, decl := range file.Decls {
			start, end, found := declarationSpan(decl, name)
			if found {
				from := fset.Position(start).Offset
				return string(f.Src[from:fset.Position(end).Offset]), nil
			}
		}
	}
	return "", fmt.Errorf("no declaration called %s", name)
}

// declarationSpan finds name in decl: a func, or a type, const or var
// spec (with the doc comment of its group when it is alone in it).
func declarationSpan(decl ast.Decl, name string) (token.Pos, token.Pos,
	bool) {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if funcName(d) == name {
			return startOf(d.Doc, d.Pos()), d.End(), true
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			if specName(spec) != name {
				continue
			}
			if len(d.Specs) == 1 {
				return startOf(d.Doc, d.Pos()), d.End(), true
			}
			return spec.Pos(), spec.End(), true
		}
	}
	return 0, 0, false
}

// startOf is where a declaration's quote begins: its doc comment, if any.
func startOf(doc *ast.CommentGroup, pos token.Pos) token.Pos {
	if doc != nil {
		return doc.Pos()
	}
	return pos
}

// quoteMarker introduces a quoted declaration in Markdown.
var quoteMarker = regexp.MustCompile(`<!-- quote: (\S+) -->`)

// UpdateQuotes rewrites each quote block of the Markdown text md (the go
// block that follows a quote marker) with the declaration's current
// source, and reports how many there were.
func UpdateQuotes(md string, files []File) (string, int, error) {
	lines := strings.Split(md, "\n")
	var out []string
	count := 0
	for i := 0; i < len(lines); i++ {
		out = append(out, lines[i])
		match := quoteMarker.FindStringSubmatch(lines[i])
		if match == nil {
			continue
		}
		quote, err := Quote(files, match[1])
		if err != nil {
			return "", 0, err
		}
		if i+1 >= len(lines) || lines[i+1] != "```go" {
			return "", 0, fmt.Errorf("quote of %s: a ```go block must "+
				"follow the marker", match[1])
		}
		end := i + 2
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		out = append(out, "```go", quote, "```")
		i = end
		count++
	}
	return strings.Join(out, "\n"), count, nil
}
