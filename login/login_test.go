package login

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestThrottle_MemoryIsBoundedAndKeepsTheAttacker(t *testing.T) {
	var throttle Throttle
	now := time.Now()
	for i := range 30_000 {
		now = now.Add(time.Millisecond)
		throttle.Fail(now, fmt.Sprintf("user:name-%d", i), "addr:attacker")
	}
	if n := len(throttle.failures); n > maxKeys+1 {
		t.Fatalf("%d keys remembered, want at most %d", n, maxKeys+1)
	}
	if f := throttle.failures["addr:attacker"]; f.count != 30_000 {
		t.Fatalf("the attacker's address has %d failures, want 30000",
			f.count)
	}

	// Ten quiet minutes forget it all.
	later := now.Add(forgetAfter + time.Second)
	if at := throttle.Fail(later, "addr:attacker"); !at.Equal(later) {
		t.Fatalf("after a quiet spell the answer waits %v, want none",
			at.Sub(later))
	}
}

func TestHash_ChecksOnlyItsOwnPassword(t *testing.T) {
	hash, err := Hash("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hash, fmt.Sprintf("pbkdf2-sha256$%d$", Iterations)) {
		t.Fatalf("hash %q, want the pbkdf2-sha256 form", hash)
	}
	for password, want := range map[string]bool{"correct horse": true,
		"correct horse ": false, "": false} {
		if got := Check(hash, password); got != want {
			t.Errorf("Check(%q) = %v, want %v", password, got, want)
		}
	}
	if Check("pbkdf2-sha256$0$$", "") || Check("not a hash", "") {
		t.Error("Check accepted a malformed hash")
	}
}

// A first login is hashed before the guesses of connections that failed
// before: while every hash is under way, one guess waits in the guesses'
// one place and another behind it, and the first login queues for the
// next hash behind one guess, not two.
func TestGate_AFirstLoginGoesBeforeTheGuessesOfSocketsThatFailed(
	t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hash, err := HashAt("correct horse", 1000)
		if err != nil {
			t.Fatal(err)
		}
		g := NewGate(1, nil, nil)
		g.hashing <- struct{}{} // the hash under way
		for i := range 2 {
			go g.Check(nil, hash, "guess", true, fmt.Sprint(i), nil)
		}
		synctest.Wait()
		got := make(chan bool)
		go func() {
			right, _ := g.Check(nil, hash, "correct horse", false, "alice",
				nil)
			got <- right
		}()
		synctest.Wait()
		if len(g.retrying) != 1 {
			t.Fatalf("%d guesses in the guesses' place, want 1",
				len(g.retrying))
		}
		<-g.hashing // the hash under way ends
		if !<-got {
			t.Fatal("the right password was refused")
		}
	})
}

func TestDeadline_StopsWhileTheBrokerHashes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fired atomic.Bool
		d := NewDeadline(time.Second, func() { fired.Store(true) })
		time.Sleep(600 * time.Millisecond)

		// A hash that takes an hour of the broker's time costs the
		// client none of its second.
		resume, ok := d.Pause()
		if !ok {
			t.Fatal("pause: the deadline had passed, want 400ms left")
		}
		time.Sleep(time.Hour)
		resume()
		time.Sleep(399 * time.Millisecond)
		if fired.Load() {
			t.Fatal("the deadline fired with 1ms of the client's time left")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if !fired.Load() {
			t.Fatal("the deadline did not fire once the client's second was up")
		}
		if _, ok := d.Pause(); ok {
			t.Fatal("pause after the deadline reported time left")
		}
	})
}
