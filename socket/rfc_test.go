package socket

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// rfcCase is one case of the table below: what a client sends, and what
// RFC 6455 says a server must make of it.
type rfcCase struct {
	// autobahn is the case of the Autobahn test suite it follows.
	autobahn, name string
	// send is what the client writes, in one write; a case the server
	// should take whole ends with the client's own close.
	send []byte
	// read are the messages Read returns; pongs the payloads of the
	// pongs the server sends, in order; closed the code of its close
	// frame (1005: one with no code).
	read   []string
	pongs  []string
	closed websocket.StatusCode
}

// closing is a client's close frame with code and reason.
func closing(code uint16, reason string) []byte {
	return frame(opClose, true,
		string(binary.BigEndian.AppendUint16(nil, code))+reason)
}

// normal is the client's close that ends a case the server takes whole.
var normal = closing(1000, "")

// withLength is a client's final text frame whose 64-bit length field
// says n, followed by payload.
func withLength(n uint64, payload string) []byte {
	b := binary.BigEndian.AppendUint64([]byte{0x80 | opText, 0x80 | 127}, n)
	return append(append(b, 0, 0, 0, 0), payload...) // mask 0: as is
}

// rfcCases are the cases of the Autobahn test suite's sections 1 to 7
// (framing, pings and pongs, reserved bits, opcodes, fragmentation,
// UTF-8, close handling), with what RFC 6455 wants of a server, written
// here from the RFC. PopSub speaks text only: where Autobahn expects a
// binary message echoed, PopSub closes with 1003, as section 7.4.1 lets
// an endpoint that cannot accept a type of data.
func rfcCases() []rfcCase {
	cases := []rfcCase{
		// 1: framing.
		{"1.1.1", "empty text", slices.Concat(frame(opText, true, ""),
			normal), []string{""}, nil, 1000},
		{"1.1.2", "text of 125 bytes", slices.Concat(frame(opText, true,
			strings.Repeat("*", 125)), normal),
			[]string{strings.Repeat("*", 125)}, nil, 1000},
		{"1.1.3", "text of 126 bytes, a 16-bit length", slices.Concat(
			frame(opText, true, strings.Repeat("*", 126)), normal),
			[]string{strings.Repeat("*", 126)}, nil, 1000},
		{"1.1.5", "text of 65,536 bytes, a 64-bit length", slices.Concat(
			frame(opText, true, strings.Repeat("*", 65536)), normal),
			[]string{strings.Repeat("*", 65536)}, nil, 1000},
		{"1.2.1", "binary", frame(opBinary, true, "\x00\xff"), nil, nil,
			websocket.StatusUnsupportedData},
		{"1.x", "a 64-bit length with its top bit set",
			withLength(1<<63+15, strings.Repeat("x", 15)), nil, nil,
			websocket.StatusProtocolError},

		// 2: pings and pongs.
		{"2.1", "ping, empty", slices.Concat(frame(opPing, true, ""), normal),
			nil, []string{""}, 1000},
		{"2.2", "ping with text", slices.Concat(frame(opPing, true,
			"Hello, world!"), normal), nil, []string{"Hello, world!"}, 1000},
		{"2.3", "ping with binary", slices.Concat(frame(opPing, true,
			"\x00\xff\xfe\xfd"), normal), nil, []string{"\x00\xff\xfe\xfd"},
			1000},
		{"2.4", "ping of 125 bytes", slices.Concat(frame(opPing, true,
			strings.Repeat("*", 125)), normal), nil,
			[]string{strings.Repeat("*", 125)}, 1000},
		{"2.5", "ping of 126 bytes", frame(opPing, true,
			strings.Repeat("*", 126)), nil, nil, websocket.StatusProtocolError},
		{"2.6", "an unasked pong is ignored", slices.Concat(frame(opPong,
			true, "unasked"), frame(opText, true, "after"), normal),
			[]string{"after"}, nil, 1000},
		{"2.10", "ten pings, ten pongs", slices.Concat(slices.Repeat(
			frame(opPing, true, "p"), 10), normal), nil,
			slices.Repeat([]string{"p"}, 10), 1000},

		// 3: reserved bits.
		{"3.1", "RSV1 on text", slices.Concat([]byte{0xc0 | opText},
			frame(opText, true, "x")[1:]), nil, nil,
			websocket.StatusProtocolError},
		{"3.2", "RSV2 after a good message", slices.Concat(frame(opText,
			true, "good"), []byte{0xa0 | opText}, frame(opText, true,
			"x")[1:]), []string{"good"}, nil, websocket.StatusProtocolError},
		{"3.7", "RSV on a ping", slices.Concat([]byte{0xf0 | opPing},
			frame(opPing, true, "x")[1:]), nil, nil,
			websocket.StatusProtocolError},

		// 5: fragmentation.
		{"5.1", "a fragmented ping", frame(opPing, false, "x"), nil, nil,
			websocket.StatusProtocolError},
		{"5.2", "a fragmented pong", frame(opPong, false, "x"), nil, nil,
			websocket.StatusProtocolError},
		{"5.3", "text in two fragments", slices.Concat(frame(opText, false,
			"frag"), frame(opContinuation, true, "ment"), normal),
			[]string{"fragment"}, nil, 1000},
		{"5.6", "a ping between two fragments", slices.Concat(frame(opText,
			false, "frag"), frame(opPing, true, "ping"),
			frame(opContinuation, true, "ment"), normal),
			[]string{"fragment"}, []string{"ping"}, 1000},
		{"5.9", "a continuation with no message", frame(opContinuation,
			true, "x"), nil, nil, websocket.StatusProtocolError},
		{"5.18", "text inside a fragmented message", slices.Concat(
			frame(opText, false, "a"), frame(opText, true, "b")), nil, nil,
			websocket.StatusProtocolError},
		{"5.x", "binary continuing a fragmented text", slices.Concat(
			frame(opText, false, "a"), frame(opBinary, true, "b")), nil, nil,
			websocket.StatusProtocolError},

		// 6: UTF-8.
		{"6.2.1", "valid UTF-8 of many widths", slices.Concat(frame(opText,
			true, "κόσμε €𝄞"), normal), []string{"κόσμε €𝄞"}, nil, 1000},
		{"6.2.3", "valid UTF-8 split inside a character", slices.Concat(
			frame(opText, false, "\xe2\x82"), frame(opContinuation, true,
				"\xac"), normal), []string{"€"}, nil, 1000},
		{"6.3.1", "invalid UTF-8", frame(opText, true, "\xce\xba\xe1\xbd"+
			"\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64"),
			nil, nil, websocket.StatusInvalidFramePayloadData},
		{"6.4.1", "invalid UTF-8 across fragments", slices.Concat(
			frame(opText, false, "\xce\xba\xe1\xbd"), frame(opContinuation,
				true, "\xf4\x90\x80\x80")), nil, nil,
			websocket.StatusInvalidFramePayloadData},
		{"6.5.x", "an overlong encoding", frame(opText, true, "\xc0\xaf"),
			nil, nil, websocket.StatusInvalidFramePayloadData},
		{"6.6.x", "a surrogate", frame(opText, true, "\xed\xa0\x80"), nil,
			nil, websocket.StatusInvalidFramePayloadData},

		// 7: close handling.
		{"7.1.1", "a close after a message", slices.Concat(frame(opText,
			true, "Hello"), normal), []string{"Hello"}, nil, 1000},
		{"7.1.3", "nothing is read after a close", slices.Concat(normal,
			frame(opText, true, "late")), nil, nil, 1000},
		{"7.3.1", "a close with no payload", frame(opClose, true, ""), nil,
			nil, websocket.StatusNoStatusRcvd},
		{"7.3.2", "a close with a payload of one byte",
			frame(opClose, true, "\x03"), nil, nil,
			websocket.StatusProtocolError},
		{"7.3.4", "a close with a reason", closing(1000, "done"), nil, nil,
			1000},
		{"7.3.5", "a close with a reason of 123 bytes", closing(1000,
			strings.Repeat("*", 123)), nil, nil, 1000},
		{"7.3.6", "a close of 126 bytes", closing(1000,
			strings.Repeat("*", 124)), nil, nil, websocket.StatusProtocolError},
		{"7.5.1", "a close reason that is not UTF-8", closing(1000,
			"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"), nil,
			nil, websocket.StatusInvalidFramePayloadData},
	}
	// 4: opcodes no one has defined.
	for _, op := range []byte{3, 4, 5, 6, 7, 11, 12, 13, 14, 15} {
		cases = append(cases, rfcCase{"4.x", fmt.Sprint("opcode ", op),
			frame(op, true, "x"), nil, nil, websocket.StatusProtocolError})
	}
	// 7.7 and 7.9: the codes a close may carry are echoed; the others
	// get 1002.
	for _, code := range []uint16{1000, 1001, 1002, 1003, 1007, 1008, 1009,
		1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999} {
		cases = append(cases, rfcCase{"7.7.x", fmt.Sprint("code ", code),
			closing(code, ""), nil, nil, websocket.StatusCode(code)})
	}
	for _, code := range []uint16{0, 999, 1004, 1005, 1006, 1015, 1016,
		1100, 2000, 2999, 5000, 65535} {
		cases = append(cases, rfcCase{"7.9.x", fmt.Sprint("code ", code),
			closing(code, ""), nil, nil, websocket.StatusProtocolError})
	}
	return cases
}

func TestRead_FollowsRFC6455AsAutobahnTestsIt(t *testing.T) {
	for _, tc := range rfcCases() {
		t.Run(tc.autobahn+" "+tc.name, func(t *testing.T) {
			server, accepted := serveOne(t, Options{WriteTimeout: time.Second,
				LargeFrames: make(chan struct{}, 1)})
			client := dialRaw(t, server, nil)
			c := <-accepted
			c.SetReadLimit(1 << 20)
			read := make(chan []string, 1)
			go func() {
				var messages []string
				for {
					data, err := c.Read()
					if err != nil {
						read <- messages
						return
					}
					messages = append(messages, string(data))
				}
			}()

			client.conn.Write(tc.send)
			var pongs []string
			for {
				op, payload := client.next()
				if op == opPong {
					pongs = append(pongs, string(payload))
					continue
				}
				if op != opClose {
					t.Fatalf("the server sent op %d", op)
				}
				code := websocket.StatusNoStatusRcvd
				if len(payload) >= 2 {
					code = websocket.StatusCode(binary.BigEndian.Uint16(payload))
				}
				if code != tc.closed {
					t.Fatalf("closed with %d (%q), want %d", code, payload,
						tc.closed)
				}
				break
			}
			// The client answers a close it did not start, and leaves.
			client.conn.Write(normal)
			client.conn.Close()
			if got := <-read; !slices.Equal(got, tc.read) {
				t.Fatalf("Read returned %d messages %.40q, want %.40q",
					len(got), got, tc.read)
			}
			if !slices.Equal(pongs, tc.pongs) {
				t.Fatalf("pongs %q, want %q", pongs, tc.pongs)
			}
		})
	}
}
