// Package docs holds PopSub's documentation: the tutorials and the
// protocol reference as Markdown, and popsub.go rendered as a page with
// prose beside code (source.html), which popsub serve shows at /source.
package docs

//go:generate go run ./source/gen

import _ "embed"

// SourcePage is popsub.go as a side-by-side page; see package source.
//
//go:embed source.html
var SourcePage []byte
