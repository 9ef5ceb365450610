//go:build js && wasm

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"syscall/js"
)

// This file is the page's WebSocket: the browser's own, driven through
// syscall/js. A Go WebSocket library compiled to wasm wraps the same
// object but reports a closed connection as "closed", without the close
// code; the page needs the code to tell a server going away (1001) from
// a slow consumer cut off (4008) from a refused token (4001).

// closeInfo is how a socket ended: the close code and reason the browser
// reported (1006 when the connection dropped without a close frame).
type closeInfo struct {
	Code   int
	Reason string
}

// socket is one browser WebSocket. Frames the browser receives queue
// here without limit, as the browser itself would buffer them; the
// page's reader takes them in order.
type socket struct {
	ws    js.Value
	funcs []js.Func

	mu     sync.Mutex
	frames [][]byte
	ready  chan struct{} // has a value while frames is not empty
	ended  *closeInfo
	closed chan struct{} // closed once the socket has ended
}

// errUnreachable is what open returns when no connection was made.
var errUnreachable = errors.New("unreachable")

// open connects to url and returns once the socket is open, or fails
// with errUnreachable once the browser gives up.
func open(url string) (*socket, error) {
	s := &socket{ws: js.Global().Get("WebSocket").New(url),
		ready: make(chan struct{}, 1), closed: make(chan struct{})}
	opened := make(chan bool, 1)
	s.on("open", func(js.Value) { opened <- true })
	s.on("message", func(e js.Value) { s.receive(e.Get("data").String()) })
	s.on("close", func(e js.Value) {
		s.end(closeInfo{e.Get("code").Int(), e.Get("reason").String()})
		select {
		case opened <- false:
		default:
		}
	})
	// An error event always comes with a close event; the close says
	// more, so the error is not handled on its own.
	if !<-opened {
		return nil, errUnreachable
	}
	return s, nil
}

// on listens to the socket's event name. The callback runs on the
// browser's event loop and must not block.
func (s *socket) on(name string, fn func(js.Value)) {
	f := js.FuncOf(func(_ js.Value, args []js.Value) any {
		fn(args[0])
		return nil
	})
	s.funcs = append(s.funcs, f)
	s.ws.Call("addEventListener", name, f)
}

// receive queues one frame.
func (s *socket) receive(text string) {
	s.mu.Lock()
	s.frames = append(s.frames, []byte(text))
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// end records how the socket ended, once.
func (s *socket) end(info closeInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != nil {
		return
	}
	s.ended = &info
	close(s.closed)
}

// read returns the next frame, or how the socket ended once every frame
// received before the end has been read.
func (s *socket) read() ([]byte, *closeInfo) {
	for {
		s.mu.Lock()
		if len(s.frames) > 0 {
			frame := s.frames[0]
			s.frames = s.frames[1:]
			s.mu.Unlock()
			return frame, nil
		}
		ended := s.ended
		s.mu.Unlock()
		if ended != nil {
			return nil, ended
		}
		select {
		case <-s.ready:
		case <-s.closed:
		}
	}
}

// waiting is how many received frames are not read yet.
func (s *socket) waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.frames)
}

// send writes v as one JSON frame.
func (s *socket) send(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	select {
	case <-s.closed:
		return errors.New("the connection is closed")
	default:
	}
	s.ws.Call("send", string(data))
	return nil
}

// close ends the socket with code (1000, or 3000 to 4999: the only ones
// a browser may send).
func (s *socket) close(code int, reason string) {
	s.ws.Call("close", code, reason)
}

// release frees the socket's callbacks once it has ended.
func (s *socket) release() {
	<-s.closed
	for _, f := range s.funcs {
		f.Release()
	}
}

// authenticate opens a socket to url and sends the auth frame; it returns
// the socket and the connection's number from the broker's reply, or an
// error that says which way it failed.
func authenticate(url, token, name string) (*socket, uint64, error) {
	s, err := open(url)
	if err != nil {
		return nil, 0, err
	}
	go s.release()
	err = s.send(map[string]any{"type": "auth", "token": token,
		"client": name})
	if err != nil {
		return nil, 0, err
	}
	data, ended := s.read()
	if ended != nil {
		return nil, 0, &closedError{*ended}
	}
	var reply struct{ Type, Code, Message string }
	var conn struct {
		Conn uint64 `json:"conn"`
	}
	json.Unmarshal(data, &reply)
	json.Unmarshal(data, &conn)
	if reply.Type != "authenticated" {
		s.close(1000, "")
		return nil, 0, &refusedError{reply.Code, reply.Message}
	}
	return s, conn.Conn, nil
}

// refusedError is a token the broker refused.
type refusedError struct{ code, message string }

// Error says what the broker said.
func (e *refusedError) Error() string {
	return fmt.Sprintf("%s (%s)", e.message, e.code)
}

// closedError is a socket that ended before it authenticated.
type closedError struct{ info closeInfo }

// Error says how it ended.
func (e *closedError) Error() string {
	return fmt.Sprintf("closed with %d %s", e.info.Code, e.info.Reason)
}
