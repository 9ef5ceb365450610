package source

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Budget is a file measured as STYLE.md counts popsub.go: code lines are
// lines holding a token other than a comment; comment lines hold only a
// comment; blank lines are neither.
type Budget struct {
	// Sections are the file's banners ("// # Title") in order; the lines
	// before the first belong to a section called Package.
	Sections []SectionBudget
	// Code and Comments count the whole file's code and comment lines.
	Code, Comments int
	// FirstReading counts the code lines of sections not marked detail.
	FirstReading int
	// Functions holds each function's length, from func to its closing
	// brace, in lines.
	Functions []int
	// Documented counts the declarations with a doc comment, out of
	// Declarations (functions, and each type, const and var group).
	Documented, Declarations int
	// InFunctionComments counts the comments inside function bodies, and
	// OneLineComments those of one line: STYLE.md asks for one comment
	// line per paragraph of code, as litestream writes 87 % of its.
	InFunctionComments, OneLineComments int
	// LongLines lists the lines wider than 80 columns, a tab counting 4.
	LongLines []int
}

// SectionBudget is one section's share of a Budget.
type SectionBudget struct {
	Title  string // the banner's title, without "(detail)"
	Detail bool   // marked "(detail)": a first reading may skip it
	Line   int    // the banner's line, from 1
	Code   int    // code lines
	Prose  int    // comment lines
	Words  int    // words in its comments
	// Dense counts the code lines of functions that take a lock, start
	// a goroutine or select: a newcomer reads them slower.
	Dense int
}

// The reading time is priced as a reader pays it: a careful reader of
// technical prose covers about 150 words a minute, and of code about 8
// lines a minute, stopping to follow each one (code review guides give
// 200 to 500 lines an hour), but only 5 in a function that takes a lock,
// starts a goroutine or selects, where each line asks what else runs
// meanwhile. Sections are summed exactly and rounded once.
const (
	WordsPerMinute      = 150
	CodeLinesPerMinute  = 8
	DenseLinesPerMinute = 5
)

// Minutes is how long a section takes to read, rounded to the minute.
func (s SectionBudget) Minutes() int {
	return max(1, int(math.Round(s.minutes())))
}

// minutes is how long a section takes to read, unrounded.
func (s SectionBudget) minutes() float64 {
	return Price{s.Words, s.Dense, s.Code - s.Dense}.Minutes()
}

// Price is what a reading costs: its words, its dense code lines and its
// other code lines.
type Price struct{ Words, Dense, Other int }

// Prose is the minutes its words take, at WordsPerMinute.
func (p Price) Prose() float64 { return float64(p.Words) / WordsPerMinute }

// Code is the minutes its code takes, at DenseLinesPerMinute for the
// dense lines and CodeLinesPerMinute for the others.
func (p Price) Code() float64 {
	return float64(p.Dense)/DenseLinesPerMinute +
		float64(p.Other)/CodeLinesPerMinute
}

// Minutes is the whole price, unrounded.
func (p Price) Minutes() float64 { return p.Prose() + p.Code() }

// Measure measures a Go file.
func Measure(src []byte) (Budget, error) {
	var b Budget
	kinds, words, err := lineKinds(src)
	if err != nil {
		return b, err
	}
	dense, err := denseLines(src)
	if err != nil {
		return b, err
	}
	lines := strings.Split(string(src), "\n")
	current := SectionBudget{Title: "Package", Line: 1}
	inPackageDoc := true
	for i, line := range lines {
		// The package doc's own headings belong to it.
		inPackageDoc = inPackageDoc && !strings.HasPrefix(line, "package ")
		title, ok := strings.CutPrefix(line, "// # ")
		if ok && !inPackageDoc {
			b.Sections = append(b.Sections, current)
			detail := strings.HasSuffix(title, " (detail)")
			current = SectionBudget{Line: i + 1, Detail: detail,
				Title: strings.TrimSuffix(title, " (detail)")}
		}
		switch kinds[i+1] {
		case codeLine:
			current.Code++
			if dense[i+1] {
				current.Dense++
			}
		case commentLine:
			current.Prose++
		}
		current.Words += words[i+1]
		if len(strings.ReplaceAll(line, "\t", "    ")) > 80 {
			b.LongLines = append(b.LongLines, i+1)
		}
	}
	b.Sections = append(b.Sections, current)
	for _, s := range b.Sections {
		b.Code, b.Comments = b.Code+s.Code, b.Comments+s.Prose
		if !s.Detail {
			b.FirstReading += s.Code
		}
	}
	return b, b.measureDeclarations(src)
}

// MedianFunction is the median of Functions.
func (b Budget) MedianFunction() int {
	sorted := slices.Sorted(slices.Values(b.Functions))
	if len(sorted) == 0 {
		return 0
	}
	return sorted[len(sorted)/2]
}

// LongestFunction is the largest of Functions.
func (b Budget) LongestFunction() int {
	if len(b.Functions) == 0 {
		return 0
	}
	return slices.Max(b.Functions)
}

// measureDeclarations fills in Functions, Documented, Declarations and
// the in-function comments.
func (b *Budget) measureDeclarations(src []byte) error {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "", src, parser.ParseComments)
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	line := func(pos token.Pos) int { return fset.Position(pos).Line }
	for _, decl := range file.Decls {
		var doc *ast.CommentGroup
		switch d := decl.(type) {
		case *ast.FuncDecl:
			doc = d.Doc
			b.Functions = append(b.Functions, line(d.End())-line(d.Pos())+1)
			b.measureComments(file, d, line)
		case *ast.GenDecl:
			if d.Tok == token.IMPORT {
				continue
			}
			doc = d.Doc
		}
		b.Declarations++
		if doc != nil {
			b.Documented++
		}
	}
	return nil
}

// measureComments counts the comments inside fn's body, and those of
// them that take one line.
func (b *Budget) measureComments(file *ast.File, fn *ast.FuncDecl,
	line func(token.Pos) int) {
	if fn.Body == nil {
		return
	}
	for _, group := range file.Comments {
		if group.Pos() < fn.Body.Lbrace || group.End() > fn.Body.Rbrace {
			continue
		}
		b.InFunctionComments++
		if line(group.Pos()) == line(group.End()) {
			b.OneLineComments++
		}
	}
}

// lineKind says what a line holds.
type lineKind int

// The kinds of line.
const (
	blankLine lineKind = iota
	commentLine
	codeLine
)

// lineKinds classifies each line of src, indexed from 1, and counts the
// words of the comments that start on each.
func lineKinds(src []byte) (map[int]lineKind, map[int]int, error) {
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(src))
	var s scanner.Scanner
	var failed error
	s.Init(file, src, func(pos token.Position, msg string) {
		failed = fmt.Errorf("%v: %s", pos, msg)
	}, scanner.ScanComments)
	kinds, words := map[int]lineKind{}, map[int]int{}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.COMMENT {
			text := strings.NewReplacer("//", " ", "/*", " ", "*/", " ").
				Replace(lit)
			words[file.Line(pos)] += len(strings.Fields(text))
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue
		}
		first := file.Line(pos)
		last := file.Line(pos + token.Pos(len(lit)))
		if lit == "" {
			last = first
		}
		for l := first; l <= last; l++ {
			if tok != token.COMMENT {
				kinds[l] = codeLine
			} else if kinds[l] == blankLine {
				kinds[l] = commentLine
			}
		}
	}
	return kinds, words, failed
}

// denseLines marks the lines of each function that takes or lets go of
// a lock, starts a goroutine or selects, with the functions written
// inside it.
func denseLines(src []byte) (map[int]bool, error) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "", src, 0)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	dense := map[int]bool{}
	for _, decl := range file.Decls {
		f, ok := decl.(*ast.FuncDecl)
		if !ok || f.Body == nil || !concurrent(f.Body) {
			continue
		}
		for l := fset.Position(f.Pos()).Line; l <= fset.Position(
			f.End()).Line; l++ {
			dense[l] = true
		}
	}
	return dense, nil
}

// concurrent reports whether body takes or lets go of a lock, starts a
// goroutine or selects: a function that unlocks what its caller locked
// runs under that lock all the same.
func concurrent(body *ast.BlockStmt) bool {
	lockCalls := []string{"Lock", "RLock", "TryLock", "Unlock", "RUnlock"}
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt, *ast.SelectStmt:
			found = true
		case *ast.CallExpr:
			if call, ok := n.Fun.(*ast.SelectorExpr); ok &&
				slices.Contains(lockCalls, call.Sel.Name) {
				found = true
			}
		}
		return !found
	})
	return found
}

// FirstReadingMinutes is how long the first reading takes, at the stated
// pace: every section not marked detail, summed exactly and rounded once.
func (b Budget) FirstReadingMinutes() int {
	return int(math.Round(b.FirstReadingPrice().Minutes()))
}

// FirstReadingPrice sums the price of every section not marked detail.
func (b Budget) FirstReadingPrice() Price {
	var p Price
	for _, s := range b.Sections {
		if !s.Detail {
			p.Words += s.Words
			p.Dense += s.Dense
			p.Other += s.Code - s.Dense
		}
	}
	return p
}

// Claim is the sentence that the README, the package doc, tutorial 6 and
// the source page use for the file's size: code rounded to the hundred,
// the first reading's time to the half hour.
func (b Budget) Claim() string {
	hours := strconv.FormatFloat(
		math.Round(float64(b.FirstReadingMinutes())/30)/2, 'f', -1, 64)
	return fmt.Sprintf("about %s lines of code, %s of them on the first "+
		"reading, which takes about %s hours at %d words of prose and %d "+
		"lines of code a minute, %d where the code locks, starts a "+
		"goroutine or selects", hundreds(b.Code), hundreds(b.FirstReading),
		hours, WordsPerMinute, CodeLinesPerMinute, DenseLinesPerMinute)
}

// hundreds is n rounded to the hundred, with a thousands comma: 2,600.
func hundreds(n int) string {
	n = (n + 50) / 100 * 100
	if n < 1000 {
		return strconv.Itoa(n)
	}
	return fmt.Sprintf("%d,%03d", n/1000, n%1000)
}
