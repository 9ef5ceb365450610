// Package login is the machinery behind PopSub's credentials: password
// hashes, a gate and a throttle that ration guesses, and the checks a
// token must pass.
//
// # The contract
//
// popsub.go's section "Logins and passwords" says how guesses are
// rationed; this package does it, and popsub.go relies on it for these:
// Gate.Login checks a login and holds a wrong answer for its turn; Check
// says whether a password matches its stored hash, in constant time;
// Dummy makes a hash as costly as the costliest user's, for names that do
// not exist; a Throttle says when the answer to a failure may leave, one
// at a time per user and per address; Verify says whether a token is
// genuine and current, Sign signs one and Decode reads its claims; and a
// Deadline is an auth timeout that a hash pauses.
//
// # Hashes
//
// Passwords are stored as PBKDF2-SHA256 hashes from the standard
// library, at the iteration count OWASP recommends; bcrypt or argon2
// would have been a dependency for the same protection. Such a hash is
// slow on purpose, a quarter of a second of a core here: that is what
// makes a stolen hash expensive to guess, and why the broker rations
// guesses before it hashes them.
//
// # What each trick buys
//
// Measured with BenchmarkLoginBesideGuessers (docs/security.md):
//
//	trick                                  buys
//	answers held, one at a time per key    16 sockets guess no faster than 1
//	an unknown name costs a known one's    no timing tells names apart
package login

import (
	"bytes"
	"cmp"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Password hashing is PBKDF2-SHA256 from the standard library, at the
// iteration count OWASP recommends, stored as
// pbkdf2-sha256$ITERATIONS$SALT$KEY with base64 salt and key.
const Iterations = 600_000

// Dummy makes the hash an unknown user's password is checked against:
// at the iteration count of the costliest of hashes, so that an unknown
// name takes as long as a known one.
func Dummy(hashes []string) string {
	iterations := 0
	for _, h := range hashes {
		parts := strings.Split(h, "$")
		if n, err := strconv.Atoi(parts[min(1, len(parts)-1)]); err == nil {
			iterations = max(iterations, n)
		}
	}
	dummy, _ := HashAt("", cmp.Or(iterations, Iterations))
	return dummy
}

// Hash returns the stored form of password, for popsub.User.
func Hash(password string) (string, error) {
	return HashAt(password, Iterations)
}

// HashAt hashes password with a fresh salt at iterations: Hash at the
// recommended count, tests at a cheap one.
func HashAt(password string, iterations int) (string, error) {
	salt := make([]byte, 16)
	rand.Read(salt)
	key, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	encode := base64.RawStdEncoding.EncodeToString
	return fmt.Sprintf("pbkdf2-sha256$%d$%s$%s", iterations, encode(salt),
		encode(key)), nil
}

// Check reports whether password matches hash, in constant time.
func Check(hash, password string) bool {
	parts := strings.Split(hash, "$")
	if len(parts) != 4 || parts[0] != "pbkdf2-sha256" {
		return false
	}
	iterations, err := strconv.Atoi(parts[1])
	salt, err1 := base64.RawStdEncoding.DecodeString(parts[2])
	key, err2 := base64.RawStdEncoding.DecodeString(parts[3])
	if err != nil || err1 != nil || err2 != nil || len(key) == 0 ||
		iterations < 1 {
		return false
	}
	got, err := pbkdf2.Key(sha256.New, password, salt, iterations, len(key))
	return err == nil && subtle.ConstantTimeCompare(got, key) == 1
}

// Login throttling. The answer to a failure for a key (a user, or an
// address) leaves no sooner than the answer to the key's previous one,
// plus a hold: none for the first failure, then 250 ms, doubling up to
// maxDelay. Answers for one key thus leave one at a time, however
// many sockets guess at once. Ten quiet minutes forget a key. Past
// maxKeys keys the quietest tenth is forgotten, so a stranger who
// invents new names cannot wash out its own address's hold, or the one
// on the name it attacks.
const (
	baseDelay   = 250 * time.Millisecond
	maxDelay    = 4 * time.Second
	forgetAfter = 10 * time.Minute
	maxKeys     = 10_000
)

// Throttle counts recent login failures per key.
type Throttle struct {
	mu       sync.Mutex             // guards failures
	failures map[string]keyFailures // key → recent failures
}

// keyFailures is one key's recent failures.
type keyFailures struct {
	count int       // failures since the last success or forgetting
	last  time.Time // when the newest failure happened
	next  time.Time // when the newest failure's answer leaves
}

// Fail counts a failure at now against keys and returns when its answer
// may leave: after every earlier answer for any of the keys, by the
// longest of their holds.
func (t *Throttle) Fail(now time.Time, keys ...string) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failures == nil {
		t.failures = map[string]keyFailures{}
	}
	release := now
	for _, key := range keys {
		release = later(release, t.recent(key, now).answer(now))
	}
	for _, key := range keys {
		f := t.recent(key, now)
		t.failures[key] = keyFailures{f.count + 1, now, release}
	}
	t.forgetQuietest()
	return release
}

// TooLate reports whether the answer to a failure for key, now, would
// leave after deadline, behind answers for key still waiting to leave.
// Once they have left, one more guess is worth a hash whatever its hold:
// so a flood from one address costs a hash per hold, and a user behind
// that address gets in once the flood's answers have drained.
func (t *Throttle) TooLate(key string, deadline time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	f := t.recent(key, now)
	return f.next.After(now) && f.answer(now).After(deadline)
}

// answer is when the answer to one more failure at now may leave: after
// the newest one's, by a hold that doubles with each failure.
func (f keyFailures) answer(now time.Time) time.Time {
	hold := time.Duration(0)
	if f.count > 0 {
		hold = min(baseDelay<<min(f.count-1, 8), maxDelay)
	}
	return later(f.next, now).Add(hold)
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// recent returns key's failures, or none if they are forgotten by now.
// The caller holds t.mu.
func (t *Throttle) recent(key string, now time.Time) keyFailures {
	f := t.failures[key]
	if now.Sub(f.last) > forgetAfter {
		return keyFailures{}
	}
	return f
}

// Succeed forgets key's failures.
func (t *Throttle) Succeed(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.failures, key)
}

// forgetQuietest drops the tenth of the keys that failed longest ago,
// once there are more than maxKeys. The caller holds t.mu.
func (t *Throttle) forgetQuietest() {
	if len(t.failures) <= maxKeys {
		return
	}
	keys := slices.SortedFunc(maps.Keys(t.failures), func(a, b string) int {
		return t.failures[a].last.Compare(t.failures[b].last)
	})
	for _, key := range keys[:len(keys)/10] {
		delete(t.failures, key)
	}
}

// Count is how many failures key has on record now.
func (t *Throttle) Count(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.recent(key, time.Now()).count
}

// Gate rations password hashes, which are slow on purpose. Hashes take
// turns, at most the places NewGate is given; a connection's first login
// goes ahead of the guesses of connections that failed before, which
// queue for a turn one at a time; and a guess whose wrong answer would
// leave too late to be heard is not hashed at all. Its Throttle holds
// the answers to failures.
type Gate struct {
	Throttle
	// hashing holds a token per hash under way; retrying one for the
	// guess that waits for a turn.
	hashing, retrying chan struct{}
	// stop ends every wait: the broker is shutting down.
	stop <-chan struct{}
	// users are the accounts; dummy returns the hash an unknown user's
	// password is checked against (the package's Dummy), made on first
	// use: hashing takes a noticeable moment.
	users map[string]User
	dummy func() string
}

// User is an account that may log in with a password.
type User struct {
	// PasswordHash is what Hash made of the password.
	PasswordHash string
	// Publish and Subscribe are the grants of tokens from login; nil
	// means every ordinary topic.
	Publish, Subscribe []string
}

// NewGate returns a gate for users that lets places hashes run at once,
// and ends every wait once stop is closed.
func NewGate(places int, stop <-chan struct{}, users map[string]User) *Gate {
	return &Gate{hashing: make(chan struct{}, places),
		retrying: make(chan struct{}, 1), stop: stop, users: users,
		dummy: sync.OnceValue(func() string {
			var hashes []string
			for _, user := range users {
				hashes = append(hashes, user.PasswordHash)
			}
			return Dummy(hashes)
		})}
}

// Login checks a login by name with password from remote (an address
// and port), when the gate gives it a turn, and reports the user and
// true if the password is right. guessing says the connection failed a
// login before, and is set when this one fails; deadline is its auth
// timeout, paused while the hash runs, or nil. A wrong answer is held
// for its turn (the Throttle), and an answer nobody would hear (done or
// stop closed, or a guess not worth a hash) until done or stop.
func (g *Gate) Login(done <-chan struct{}, name, password, remote string,
	guessing *bool, deadline *Deadline) (User, bool) {
	host, _, _ := net.SplitHostPort(remote) // "" if it has no port
	userKey, addressKey := "user:"+name, "addr:"+cmp.Or(host, remote)

	// An unknown user costs the same hash as a known one, so timing does
	// not tell a stranger which names exist.
	user, known := g.users[name]
	if !known {
		user.PasswordHash = g.dummy()
	}
	right, checked := g.Check(done, user.PasswordHash, password, *guessing,
		addressKey, deadline)
	switch {
	case !checked:
		g.Hold(time.Time{}, done)
		return User{}, false
	case right && known:
		// Success clears the user's failures, not the address's: one
		// right password does not excuse a thousand wrong ones.
		g.Succeed(userKey)
		return user, true
	}
	*guessing = true
	g.Hold(g.Fail(time.Now(), userKey, addressKey), done)
	return User{}, false
}

// Hold waits until at (for ever, if at is zero), or until done or the
// gate's stop is closed: a held answer must not hold up a shutdown.
func (g *Gate) Hold(at time.Time, done <-chan struct{}) {
	var timer <-chan time.Time
	if !at.IsZero() {
		timer = time.After(time.Until(at))
	}
	select {
	case <-timer:
	case <-done:
	case <-g.stop:
	}
}

// Check waits for a turn, then reports whether password matches hash.
// guessing says the connection failed a login before: then, if by its
// turn the answer to a failure for address would leave after deadline
// runs out (nil: never), the guess is not hashed. The deadline is
// paused while the hash runs. checked is false if nothing was hashed:
// done or stop closed first, the guess came too late, or the deadline
// ran out.
func (g *Gate) Check(done <-chan struct{}, hash, password string,
	guessing bool, address string, deadline *Deadline) (right, checked bool) {
	if guessing && !g.enter(g.retrying, done) {
		return false, false
	}
	entered := g.enter(g.hashing, done)
	if guessing {
		<-g.retrying
	}
	if !entered {
		return false, false
	}
	defer func() { <-g.hashing }()
	if at := deadline.At(); guessing && !at.IsZero() &&
		g.TooLate(address, at) {
		return false, false
	}
	resume, ok := deadline.Pause()
	if !ok {
		return false, false
	}
	defer resume()
	return Check(hash, password), true
}

// enter takes a place in turns, a channel whose capacity is the places,
// unless done or the gate's stop is closed first; it reports whether it
// got one.
func (g *Gate) enter(turns chan struct{}, done <-chan struct{}) bool {
	select {
	case turns <- struct{}{}:
		return true
	case <-done:
	case <-g.stop:
	}
	return false
}

// Registered returns the registered claims of a token for subject sub,
// issued now and expiring after ttl, with iss and aud when issuer and
// audience are not empty.
func Registered(sub, issuer, audience string,
	ttl time.Duration) jwt.RegisteredClaims {
	now := time.Now()
	c := jwt.RegisteredClaims{Subject: sub, Issuer: issuer,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl))}
	if audience != "" {
		c.Audience = jwt.ClaimStrings{audience}
	}
	return c
}

// Sign signs claims with secret, HS256.
func Sign(claims jwt.Claims, secret []byte) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(secret)
}

// Decode decodes a token's claims from data into v, refusing an exp
// that is a string: RFC 7519 makes it a number, and the JWT library
// would take "1796085975", and with it a client's mistake, as a date.
func Decode(data []byte, v any) error {
	var probe struct{ Exp json.RawMessage }
	if json.Unmarshal(data, &probe) == nil &&
		bytes.HasPrefix(probe.Exp, []byte(`"`)) {
		return errors.New("exp must be a number (RFC 7519)")
	}
	return json.Unmarshal(data, v)
}

// MaxTokenBytes is the longest token Verify parses: a forged token
// cannot make the parser decode megabytes of base64.
const MaxTokenBytes = 4 << 10

// Verify parses token into claims and checks it with secret: at most
// MaxTokenBytes, HS256 only (so neither alg none nor an RSA key passed
// off as an HMAC secret gets through), exp required and honoured within
// leeway, iss and aud when issuer and audience are not empty, and a sub.
func Verify(token string, claims jwt.Claims, secret []byte, issuer,
	audience string, leeway time.Duration) error {
	if len(token) == 0 || len(token) > MaxTokenBytes {
		return errors.New("token missing or too long")
	}
	options := []jwt.ParserOption{jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithExpirationRequired(), jwt.WithLeeway(leeway)}
	if issuer != "" {
		options = append(options, jwt.WithIssuer(issuer))
	}
	if audience != "" {
		options = append(options, jwt.WithAudience(audience))
	}
	_, err := jwt.ParseWithClaims(token, claims,
		func(*jwt.Token) (any, error) { return secret, nil }, options...)
	if err != nil {
		return err
	}
	if sub, _ := claims.GetSubject(); sub == "" {
		return errors.New("token has no sub")
	}
	return nil
}

// Deadline is a clock a connection must beat to authenticate: when it
// runs out, the function given to NewDeadline runs. Pause stops it
// while the broker, not the client, spends the time (a hash). Only one
// goroutine uses a Deadline.
type Deadline struct {
	at    time.Time   // when the timer fires, unless paused
	timer *time.Timer // runs the expiry
}

// NewDeadline starts a clock that calls expire after timeout.
func NewDeadline(timeout time.Duration, expire func()) *Deadline {
	return &Deadline{at: time.Now().Add(timeout),
		timer: time.AfterFunc(timeout, expire)}
}

// At is when the clock runs out, unless paused; zero for a nil Deadline.
func (d *Deadline) At() time.Time {
	if d == nil {
		return time.Time{}
	}
	return d.at
}

// Stop stops the clock for good: the client authenticated, or left. It
// reports whether it stopped the clock before it ran out.
func (d *Deadline) Stop() bool { return d.timer.Stop() }

// Pause stops the clock and returns the function that starts it again
// with the time it had left; ok is false if it ran out first. A nil
// Deadline (a connection already authenticated) has nothing to pause.
func (d *Deadline) Pause() (resume func(), ok bool) {
	if d == nil {
		return func() {}, true
	}
	if !d.timer.Stop() {
		return nil, false
	}
	left := time.Until(d.at)
	return func() {
		d.at = time.Now().Add(left)
		d.timer.Reset(left)
	}, true
}
