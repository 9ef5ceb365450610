// Package docs holds PopSub's documentation: the tutorials and the
// references as Markdown, which popsub serve shows as HTML under /docs/
// (Pages), and popsub.go rendered as a page with prose beside code
// (source.html), which it shows at /source.
package docs

//go:generate go run ./source/gen

import (
	"embed"
)

// SourcePage is popsub.go as a side-by-side page; see package source.
//
//go:embed source.html
var SourcePage []byte

// AsyncAPI is the protocol, machine-readable: an AsyncAPI 3 document
// with a JSON Schema for every frame (package asyncapi validates frames
// with it). popsub serve serves it at /asyncapi.json.
//
//go:embed asyncapi.json
var AsyncAPI []byte

// markdown holds the tutorials and references.
//
//go:embed *.md
var markdown embed.FS

// images holds the pictures the pages show.
//
//go:embed *.png
var images embed.FS
