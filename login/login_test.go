package login

import (
	"fmt"
	"strings"
	"testing"
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
