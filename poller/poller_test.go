//go:build linux

package poller

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// pair returns both ends of a TCP connection on 127.0.0.1, the server's
// as a raw connection to park.
func pair(t *testing.T) (syscall.RawConn, net.Conn, net.Conn) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	client, err := net.Dial("tcp", listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := listener.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	raw, err := server.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return raw, client, server
}

// wakes counts a wake's runs.
func wakes() (func(), func(t *testing.T, want int)) {
	ran := make(chan struct{}, 8)
	return func() { ran <- struct{}{} }, func(t *testing.T, want int) {
		t.Helper()
		for range want {
			select {
			case <-ran:
			case <-time.After(10 * time.Second):
				t.Fatal("the parked socket was never woken")
			}
		}
		// Once the test's own traffic is done, no second wake-up comes.
		select {
		case <-ran:
			t.Fatal("woken twice for one park")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A parked socket wakes once when bytes come, is out of the table
// then, and parks again, re-armed, for the next bytes.
func TestPark_WakesOnceWhenReadable(t *testing.T) {
	raw, client, server := pair(t)
	var p Parking
	wake, expect := wakes()
	if !p.Park(raw, nil, wake) || !p.Parked() {
		t.Fatal("a quiet socket did not park")
	}
	client.Write([]byte("a"))
	client.Write([]byte("b"))
	expect(t, 1)
	if p.Parked() {
		t.Fatal("a woken socket is still parked")
	}
	server.Read(make([]byte, 2))
	if !p.Park(raw, nil, wake) {
		t.Fatal("the second park failed")
	}
	client.Write([]byte("c"))
	expect(t, 1)
}

// A socket with bytes waiting wakes as soon as it parks; one whose peer
// hangs up wakes too.
func TestPark_WakesForBytesAlreadyThereAndForAHangUp(t *testing.T) {
	raw, client, _ := pair(t)
	var p Parking
	wake, expect := wakes()
	client.Write([]byte("early"))
	time.Sleep(10 * time.Millisecond) // the bytes' way over loopback
	if !p.Park(raw, nil, wake) {
		t.Fatal("park failed")
	}
	expect(t, 1)

	raw, client, _ = pair(t)
	var q Parking
	wake, expect = wakes()
	if !q.Park(raw, nil, wake) {
		t.Fatal("park failed")
	}
	client.Close()
	expect(t, 1)
}

// Unpark wakes a parked socket at once, and only once however often it
// is called; a socket whose close came first is not parked at all.
func TestPark_UnparkAndAClosedSocket(t *testing.T) {
	raw, _, server := pair(t)
	var p Parking
	wake, expect := wakes()
	if !p.Park(raw, nil, wake) {
		t.Fatal("park failed")
	}
	p.Unpark()
	p.Unpark()
	expect(t, 1)

	closed := make(chan struct{})
	close(closed)
	if p.Park(raw, closed, wake) || p.Parked() {
		t.Fatal("a closing socket parked")
	}
	server.Close()
	if p.Park(raw, nil, wake) {
		t.Fatal("a closed descriptor parked")
	}
}

// A closed socket's Unpark, once the kernel has given its descriptor's
// number to a new socket, leaves the new socket's park alone: removing
// the number from the epoll set there lost the new socket's wake-ups.
func TestPark_AStaleUnparkLeavesTheNextSocketAlone(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	accept := func() (net.Conn, syscall.RawConn, int) {
		server, err := listener.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { server.Close() })
		raw, _ := server.(*net.TCPConn).SyscallConn()
		fd := -1
		raw.Control(func(s uintptr) { fd = int(s) })
		return server, raw, fd
	}
	dial := func() net.Conn {
		client, err := net.Dial("tcp", listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		return client
	}
	clientA := dial()
	serverA, rawA, fdA := accept()
	clientB := dial()

	// A parks and is woken: it stays in the epoll set, disarmed.
	var a, b Parking
	wakeA, expectA := wakes()
	a.Park(rawA, nil, wakeA)
	clientA.Write([]byte("x"))
	expectA(t, 1)
	serverA.Close()

	// B's socket takes the lowest number free: A's.
	_, rawB, fdB := accept()
	if fdB != fdA {
		t.Fatalf("the new socket has descriptor %d, not the closed %d: "+
			"this test needs the number reused", fdB, fdA)
	}
	wakeB, expectB := wakes()
	if !b.Park(rawB, nil, wakeB) {
		t.Fatal("park failed")
	}
	a.Unpark()
	clientB.Write([]byte("y"))
	expectB(t, 1)
}
