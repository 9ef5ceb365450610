// Package source renders a Go file as a page with prose beside code, as
// docco and Go by Example present source. Each run of comment lines that
// stands on its own lines opens a section: the prose goes on the left,
// the code that follows it on the right. A banner ("# Title") opens a
// part; parts marked "(detail)" are folded, and a table of contents
// lists every part with its reading time. A section that holds a
// declaration is anchored by its name (#Broker.Publish), so that links
// survive edits, and identifiers in the code link to their declarations.
// Only the standard library is used: go/parser for the declarations,
// go/types for what each name refers to, go/doc/comment for the prose,
// go/scanner for the highlighting and html/template for the page.
// Budget (budget.go) measures the same file.
package source

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
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

// part is a banner and the sections under it, up to the next banner.
type part struct {
	Title    string    // the banner's title, without "(detail)"
	ID       string    // its anchor
	Detail   bool      // folded: a first reading may skip it
	Minutes  int       // reading time, from Budget
	Sections []section // the banner's own section first
}

// File is one Go file of the page.
type File struct {
	Name string // as shown, and as the anchor of its first section
	Src  []byte
}

// PackageFiles are the broker's files: the broker is one file.
var PackageFiles = []string{"popsub.go"}

// AppendixFiles are the machine room's packages, in the order popsub.go
// first reaches them, and the protocol: the page shows them after the
// broker, as an appendix.
var AppendixFiles = []string{"socket/socket.go", "groupcommit/groupcommit.go",
	"boltstore/boltstore.go", "jetstream/jetstream.go", "login/login.go",
	"xray/xray.go", "queue/queue.go", "wire/wire.go", "wire/scan.go"}

// Load reads PackageFiles, then AppendixFiles, from dir.
func Load(dir string) ([]File, error) {
	var files []File
	for _, name := range append(PackageFiles, AppendixFiles...) {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		files = append(files, File{name, src})
	}
	return files, nil
}

// appendix is one file of the appendix: a machine-room package's file,
// folded, its anchors prefixed with its path so that they never clash
// with the broker's.
type appendix struct {
	Name     string    // its path, as shown
	ID       string    // its anchor
	Minutes  int       // its reading time, from Budget
	Code     int       // its code lines
	Sections []section // its package doc first
}

// Render returns the page for the first of files, the broker, with the
// rest after it as an appendix.
func Render(files []File) ([]byte, error) {
	f := files[0]
	sections, budget, err := renderFile(f, "")
	if err != nil {
		return nil, err
	}
	var more []appendix
	for _, f := range files[1:] {
		id := anchorOf(f.Name)
		sections, b, err := renderFile(f, id+".")
		if err != nil {
			return nil, err
		}
		minutes := 0
		for _, s := range b.Sections {
			minutes += s.Minutes()
		}
		more = append(more, appendix{Name: f.Name, ID: id,
			Minutes: minutes, Code: b.Code, Sections: sections})
	}
	var out bytes.Buffer
	err = page.Execute(&out, struct {
		Name, Claim string
		Parts       []part
		Appendix    []appendix
	}{f.Name, budget.Claim(), group(sections, budget), more})
	return out.Bytes(), err
}

// renderFile splits f into its sections, each declaration anchored by
// prefix and its name, and measures it.
func renderFile(f File, prefix string) ([]section, Budget, error) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, f.Name, f.Src, parser.ParseComments)
	if err != nil {
		return nil, Budget{}, fmt.Errorf("parse %s: %w", f.Name, err)
	}
	budget, err := Measure(f.Src)
	if err != nil {
		return nil, Budget{}, fmt.Errorf("measure %s: %w", f.Name, err)
	}
	r := renderer{names: declarationLines(fset, file),
		links: links(fset, file), prefix: prefix}
	return r.split(strings.Split(string(f.Src), "\n")), budget, nil
}

// group gathers sections into parts, one per banner, with the reading
// times budget measured. The sections before the first banner make the
// first part, the package's doc and imports.
func group(sections []section, budget Budget) []part {
	parts := []part{{Title: "The package", ID: "the-package"}}
	for _, s := range sections {
		if s.Title != "" {
			title, detail := strings.CutSuffix(s.Title, " (detail)")
			parts = append(parts, part{Title: title, ID: s.ID,
				Detail: detail})
			s.ID, s.Title = "", ""
		}
		last := &parts[len(parts)-1]
		last.Sections = append(last.Sections, s)
	}
	for i := range parts {
		if i < len(budget.Sections) {
			parts[i].Minutes = budget.Sections[i].Minutes()
		}
	}
	return parts
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

// renderer holds what rendering a file needs beyond its lines.
type renderer struct {
	names  map[int]string  // declaration lines, from declarationLines
	links  map[link]string // identifiers to link, from links
	count  int             // sections made so far, for their anchors
	prefix string          // before every anchor: "" for the broker
}

// split cuts the file's lines into sections: a run of comment-only lines
// starts a new one, and the code after it belongs to it.
func (r *renderer) split(lines []string) []section {
	var sections []section
	var prose, code []string
	id, first := "", 0
	flush := func() {
		if len(prose) == 0 && strings.TrimSpace(strings.Join(code, "")) == "" {
			return
		}
		sections = append(sections, r.newSection(prose, code, id, first))
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
		if name, ok := r.names[i+1]; ok && id == "" {
			id = name
		}
		if len(code) == 0 {
			first = i + 1
		}
		code = append(code, line)
	}
	flush()
	return sections
}

// newSection renders one section, whose code starts at line first. A
// prose run that is a banner ("# Title") becomes a heading.
func (r *renderer) newSection(prose, code []string, id string,
	first int) section {
	r.count++
	if id == "" {
		id = fmt.Sprintf("s%d", r.count)
	}
	id = r.prefix + id
	for len(code) > 0 && strings.TrimSpace(code[0]) == "" {
		code, first = code[1:], first+1
	}
	s := section{ID: id, Code: r.anchored(r.highlight(strings.TrimRight(
		strings.Join(code, "\n"), "\n"), first), first, id)}
	text := strings.Join(prose, "\n")
	if title, rest, ok := strings.Cut(text, "\n"); ok &&
		strings.HasPrefix(title, "# ") {
		s.Title = strings.TrimPrefix(title, "# ")
		s.ID = r.prefix + anchorOf(strings.TrimSuffix(s.Title, " (detail)"))
		text = rest
	} else if strings.HasPrefix(text, "# ") {
		s.Title, text = strings.TrimPrefix(text, "# "), ""
		s.ID = r.prefix + anchorOf(strings.TrimSuffix(s.Title, " (detail)"))
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

// anchored gives each declaration in html, highlighted code that starts
// at line first, an anchor of its own, unless it is the section's: an
// identifier's link then lands on its line. The code holds no string or
// comment that spans lines, so its lines are the file's.
func (r *renderer) anchored(html template.HTML, first int,
	id string) template.HTML {
	lines := strings.Split(string(html), "\n")
	for i := range lines {
		if name, ok := r.names[first+i]; ok && r.prefix+name != id {
			lines[i] = `<span id="` + r.prefix + name + `"></span>` + lines[i]
		}
	}
	return template.HTML(strings.Join(lines, "\n"))
}

// link is where an identifier stands in the file: line and byte column,
// from 1.
type link struct{ line, column int }

// links finds the identifiers that name the file's own declarations, and
// the anchor of each: a reference to a top-level name, or a method called
// through a selector when its name is unexported, one method's alone and
// no field's. The type checker says what a name refers to, so that a
// struct literal's field links nowhere; it sees this file alone, without
// its imports, and where that leaves a use unrecorded (a type argument
// of an imported generic type) the name is looked up in the scopes
// around it, unless it follows a dot.
func links(fset *token.FileSet, file *ast.File) map[link]string {
	info := &types.Info{Defs: map[*ast.Ident]types.Object{},
		Uses: map[*ast.Ident]types.Object{}}
	config := types.Config{Importer: noImports{}, Error: func(error) {}}
	pkg, _ := config.Check(file.Name.Name, fset, []*ast.File{file}, info)

	declared := map[types.Object]string{}
	methods := map[string][]string{}
	fields := map[string]bool{}
	for _, decl := range file.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil { // init too, which nothing can name
				declared[info.Defs[d.Name]] = d.Name.Name
			} else {
				methods[d.Name.Name] = append(methods[d.Name.Name],
					funcName(d))
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				noteSpec(spec, info, declared, fields)
			}
		}
	}
	delete(declared, nil) // the blank name's
	found := map[link]string{}
	at := func(ident *ast.Ident, anchor string) {
		p := fset.Position(ident.Pos())
		found[link{p.Line, p.Column}] = anchor
	}
	afterDot := map[*ast.Ident]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Ident:
			obj, used := info.Uses[n]
			if _, defined := info.Defs[n]; !used && !defined && !afterDot[n] {
				if scope := pkg.Scope().Innermost(n.Pos()); scope != nil {
					_, obj = scope.LookupParent(n.Name, n.Pos())
				}
			}
			if anchor, ok := declared[obj]; ok {
				at(n, anchor)
			}
		case *ast.SelectorExpr:
			afterDot[n.Sel] = true
			// Only an unexported name is surely ours: Close may be
			// bbolt's or the WebSocket library's.
			name := n.Sel.Name
			if list := methods[name]; len(list) == 1 && !fields[name] &&
				!ast.IsExported(name) {
				at(n.Sel, list[0])
			}
		}
		return true
	})
	return found
}

// noImports refuses every import, so that checking a file needs nothing
// built: links asks only where the file's own names are used.
type noImports struct{}

func (noImports) Import(path string) (*types.Package, error) {
	return nil, fmt.Errorf("%s: not loaded", path)
}

// noteSpec records the names a spec declares at the top level, and the
// fields of a struct type.
func noteSpec(spec ast.Spec, info *types.Info,
	declared map[types.Object]string, fields map[string]bool) {
	switch s := spec.(type) {
	case *ast.TypeSpec:
		declared[info.Defs[s.Name]] = s.Name.Name
		if st, ok := s.Type.(*ast.StructType); ok {
			for _, field := range st.Fields.List {
				for _, name := range field.Names {
					fields[name.Name] = true
				}
			}
		}
	case *ast.ValueSpec:
		for _, name := range s.Names {
			declared[info.Defs[name]] = name.Name
		}
	}
}

// highlight marks up Go code that starts at line first of the file with
// go/scanner: keywords, strings, numbers and comments get a class each,
// identifiers that name a declaration link to it, and a declaration
// that is not its section's gets an anchor of its own; everything is
// escaped.
func (r *renderer) highlight(code string, first int) template.HTML {
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
		p := file.Position(pos)
		at := link{first + p.Line - 1, p.Column}
		if anchor, ok := r.links[at]; ok {
			out.WriteString(`<a href="#` + r.prefix + anchor + `">` +
				template.HTMLEscapeString(code[start:end]) + `</a>`)
		} else {
			out.WriteString(span(tok, code[start:end]))
		}
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

// page is the HTML around the parts: a table of contents that stays in
// view, then each part, a detail folded in a details element. Colours
// keep 4.5:1 against their background; a little script opens a folded
// part when a link lands inside it.
var page = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Name}}: PopSub, prose beside code</title>
<link rel="icon" href="data:,">
<style>
body { margin: 0; font: 15px/1.55 Georgia, serif; color: #1d232b; }
a { color: #1a56a8; }
.skip { position: absolute; left: -999px; }
.skip:focus { left: 8px; top: 8px; background: #fff; padding: 4px; z-index: 2; }
.layout { display: grid; grid-template-columns: 270px minmax(0, 1fr); }
.toc { position: sticky; top: 0; height: 100vh; overflow-y: auto; box-sizing: border-box; padding: 12px 14px; font: 13px/1.45 system-ui, sans-serif; border-right: 1px solid #ddd; background: #fbfbfa; }
.toc ol { padding-left: 20px; margin: 8px 0; }
.toc li { margin: 3px 0; }
.toc li.detail a { font-style: italic; }
.time, .anchor, .legend { color: #595f69; font: 12px system-ui, sans-serif; }
.claim { margin: 6px 0; }
.section { display: grid; grid-template-columns: minmax(0, 2fr) minmax(0, 3fr); border-bottom: 1px solid #f0f0f0; }
.section.wide { grid-template-columns: minmax(0, 1fr); }
.section.wide .prose { display: none; }
.prose { padding: 8px 20px; background: #fff; }
.prose h3 { font: 600 16px system-ui, sans-serif; }
.prose pre { font-size: 12px; background: #f6f7f9; padding: 6px; overflow-x: auto; }
.part > h2, summary h2 { display: inline; font: 600 20px system-ui, sans-serif; }
.part > h2 { display: block; margin: 0; padding: 18px 20px 4px; }
summary { padding: 14px 20px; cursor: pointer; background: #f3f4f6; border-bottom: 1px solid #ddd; }
details[open] > summary { background: #fff; }
.code { background: #f8f8f5; border-left: 1px solid #e6e6e0; }
.code pre { margin: 0; padding: 8px 14px; tab-size: 4; font: 12.5px/1.5 ui-monospace, monospace; overflow-x: auto; }
.code a { color: inherit; text-decoration: underline dotted #595f69; }
a.anchor { text-decoration: none; float: right; }
.k { color: #7a3e9d; } .s { color: #2a7a2a; } .n { color: #9a5b00; } .c { color: #5b6270; font-style: italic; }
@media (max-width: 900px) {
  .layout { grid-template-columns: 1fr; }
  .toc { position: static; height: auto; border-right: 0; border-bottom: 1px solid #ddd; }
  .section { grid-template-columns: 1fr; }
}
</style>
</head>
<body>
<a class="skip" href="#main">Skip to the code</a>
<div class="layout">
<nav class="toc" aria-label="Contents">
<a href="/">playground</a> · <strong>{{.Name}}</strong>
<p class="claim">The whole broker: {{.Claim}}.</p>
<ol>
{{range .Parts}}<li{{if .Detail}} class="detail"{{end}}><a href="#{{.ID}}">{{.Title}}</a> <span class="time">{{.Minutes}} min{{if .Detail}} · detail{{end}}</span></li>
{{end}}</ol>
<p class="legend">Details (in italics) are folded: a first reading may skip them. A link here opens one; so does a click on its heading.</p>
{{if .Appendix}}<h2 class="legend">Appendix: the machine room</h2>
<p class="legend">The packages under popsub.go, each behind a contract it declares, and the protocol (wire).</p>
<ol>
{{range .Appendix}}<li class="detail"><a href="#{{.ID}}">{{.Name}}</a> <span class="time">{{.Minutes}} min · {{.Code}} lines</span></li>
{{end}}</ol>{{end}}
</nav>
<main id="main">
{{range .Parts}}{{if .Detail}}<details class="part" id="{{.ID}}">
<summary><h2>{{.Title}}</h2> <span class="time">detail · {{.Minutes}} min</span></summary>
{{else}}<div class="part" id="{{.ID}}">
<h2>{{.Title}}</h2>
{{end}}{{range .Sections}}<div class="section{{if not .Prose}} wide{{end}}"{{if .ID}} id="{{.ID}}"{{end}}>
<div class="prose">{{if .ID}}<a class="anchor" href="#{{.ID}}">#{{.ID}}</a>{{end}}{{.Prose}}</div>
<div class="code"><pre>{{.Code}}</pre></div>
</div>
{{end}}{{if .Detail}}</details>{{else}}</div>{{end}}
{{end}}{{if .Appendix}}<div class="part" id="appendix"><h2>Appendix: the machine room</h2></div>
{{range .Appendix}}<details class="part" id="{{.ID}}">
<summary><h2>{{.Name}}</h2> <span class="time">{{.Minutes}} min · {{.Code}} lines of code</span></summary>
{{range .Sections}}<div class="section{{if not .Prose}} wide{{end}}"{{if .ID}} id="{{.ID}}"{{end}}>
<div class="prose">{{if .ID}}<a class="anchor" href="#{{.ID}}">#{{.ID}}</a>{{end}}{{if .Title}}<h3>{{.Title}}</h3>{{end}}{{.Prose}}</div>
<div class="code"><pre>{{.Code}}</pre></div>
</div>
{{end}}</details>
{{end}}{{end}}</main>
</div>
<script>
function reveal() {
  var target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
  var folded = target && target.closest("details");
  if (folded && !folded.open) { folded.open = true; target.scrollIntoView(); }
}
addEventListener("hashchange", reveal);
reveal();
</script>
</body>
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
