package wire

import "strings"

// SeedFrames are frames of every shape, good and bad, for fuzz targets
// that read frames: this package's, and the broker's.
var SeedFrames = []string{
	`{"type":"auth","token":"x"}`,
	`{"type":"publish","topic":"a/b","payload":{"k":[1,2]},"qos":1}`,
	`{"type":"publish","topic":"a","payload":"\u2028\n","message_id":""}`,
	`{"type":"subscribe","topic":"a/+/#","after":18446744073709551615}`,
	`{"type":"ack","message_ids":["a","b"],"topic":"t","seq":3}`,
	`{"type":"publish","topic":"a","payload":1e999}`,
	`{"type":"subscribe","topic":"` + strings.Repeat("a/", 200) + `"}`,
	`{"type":`, `[]`, `null`, `{"type":null}`, `{"qos":-1}`,
	` { "type" : "ack" , "topic" : "t" , "seq" : 0 } `,
	`{"type":"publish","payload":[{"a":"]}"},"\""],"topic":"t"}`,
	`{"type":"auth","batch":true,"client":"é"}`, `{}`, `{"seq":01}`,
	`{"Type":"ping"}`, `{"type":"ping"}x`, `{"payload":"a"b}`,
}
