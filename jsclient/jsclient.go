// Package jsclient holds popsub.js, the JavaScript client that popsub
// serve serves at /popsub.js: one ES module with no dependencies, for
// browsers and Node. Its tests, in this folder, drive it in Node and in
// Chromium against a real broker.
package jsclient

import _ "embed"

// Source is popsub.js.
//
//go:embed popsub.js
var Source []byte
