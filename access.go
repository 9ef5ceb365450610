package popsub

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// This file holds who may do what, and how often: the claims of a token
// and how they are checked and signed, the login frame with its password
// hashing and throttling, the publish rate limit, and the topic rules
// that both routing and grants rest on. popsub.go decides when each is
// checked and what follows; here is how.

// Claims are what a token says about its holder: who (sub), until when
// (exp), and optionally which topics it may publish and subscribe to.
type Claims struct {
	jwt.RegisteredClaims
	// Publish lists the filters the holder may publish to; nil means
	// every ordinary topic (none starting with $).
	Publish []string `json:"publish,omitempty"`
	// Subscribe lists the filters the holder may subscribe to; nil means
	// every ordinary topic. $sys/… and $dead/… need an explicit grant.
	Subscribe []string `json:"subscribe,omitempty"`
}

// verify checks a token: HS256 only (so neither alg none nor an RSA key
// passed off as an HMAC secret gets through), exp and sub required, and
// iss and aud when the broker is configured with them.
func (b *Broker) verify(token string) (*Claims, error) {
	// The length cap comes before parsing: a forged token cannot make the
	// parser decode megabytes of base64.
	if len(token) == 0 || len(token) > maxTokenBytes {
		return nil, errors.New("token missing or too long")
	}
	options := []jwt.ParserOption{jwt.WithValidMethods([]string{"HS256"}),
		jwt.WithExpirationRequired(), jwt.WithLeeway(tokenLeeway)}
	if b.opts.Issuer != "" {
		options = append(options, jwt.WithIssuer(b.opts.Issuer))
	}
	if b.opts.Audience != "" {
		options = append(options, jwt.WithAudience(b.opts.Audience))
	}
	claims := &Claims{}
	_, err := jwt.ParseWithClaims(token, claims,
		func(*jwt.Token) (any, error) { return b.opts.Secret, nil },
		options...)
	if err != nil {
		return nil, err
	}
	if claims.Subject == "" {
		return nil, errors.New("token has no sub")
	}
	return claims, nil
}

// untilExpiry is how long a verified token has left, leeway included.
func untilExpiry(claims *Claims) time.Duration {
	return time.Until(claims.ExpiresAt.Time) + tokenLeeway
}

// Sign signs the claims with secret, HS256.
func (c Claims) Sign(secret []byte) (string, error) {
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// NewToken signs a token for subject sub that expires after ttl and may
// use every ordinary topic.
func NewToken(secret []byte, sub string, ttl time.Duration) (string, error) {
	now := time.Now()
	return Claims{RegisteredClaims: jwt.RegisteredClaims{
		Subject:   sub,
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}.Sign(secret)
}

// User is an account that may log in with a password.
type User struct {
	// PasswordHash is what HashPassword made of the password.
	PasswordHash string
	// Publish and Subscribe are the grants of tokens from login; nil
	// means every ordinary topic.
	Publish, Subscribe []string
}

// login answers a login frame with a token, as the original did. Each
// failure slows the next attempt for that user and that address; the
// delay is capped, so a stranger guessing cannot lock a user out.
func (b *Broker) login(f frame, remote string) reply {
	if len(b.opts.Users) == 0 {
		return errorReply("login_unavailable", "no users are configured")
	}
	keys := []string{"user:" + f.Username, "addr:" + hostOf(remote)}
	time.Sleep(b.logins.delay(keys...))

	// An unknown user costs the same hash as a known one, so timing does
	// not tell a stranger which names exist.
	user, known := b.opts.Users[f.Username]
	if !known {
		user.PasswordHash = dummyHash()
	}
	if !checkPassword(user.PasswordHash, f.Password) || !known {
		b.logins.record(false, keys...)
		b.logger.Info("login failed", "user", f.Username, "remote", remote)
		return errorReply("invalid_credentials", "invalid credentials")
	}

	// Success clears the user's failures, not the address's: one right
	// password does not excuse a thousand wrong ones from the same place.
	b.logins.record(true, keys[0])
	token, err := b.loginToken(f.Username, user)
	if err != nil {
		return errorReply("internal", "could not sign a token")
	}
	return reply{Type: "login_response", Token: token}
}

// loginToken signs a token for a user who logged in, with the user's
// grants and the broker's issuer and audience, so verify accepts it.
func (b *Broker) loginToken(name string, user User) (string, error) {
	now := time.Now()
	claims := Claims{Publish: user.Publish, Subscribe: user.Subscribe}
	claims.Subject, claims.Issuer = name, b.opts.Issuer
	claims.IssuedAt = jwt.NewNumericDate(now)
	claims.ExpiresAt = jwt.NewNumericDate(now.Add(b.opts.LoginTokenTTL))
	if b.opts.Audience != "" {
		claims.Audience = jwt.ClaimStrings{b.opts.Audience}
	}
	return claims.Sign(b.opts.Secret)
}

// Password hashing is PBKDF2-SHA256 from the standard library, at the
// iteration count OWASP recommends, stored as
// pbkdf2-sha256$ITERATIONS$SALT$KEY with base64 salt and key.
const passwordIterations = 600_000

// dummyHash is checked for unknown users, so they cost as much as real
// ones. It is made on first use: hashing takes a noticeable moment.
var dummyHash = sync.OnceValue(func() string {
	hash, _ := hashPassword("", passwordIterations)
	return hash
})

// HashPassword returns the stored form of password for a User.
func HashPassword(password string) (string, error) {
	return hashPassword(password, passwordIterations)
}

// hashPassword hashes password with a fresh salt at iterations.
func hashPassword(password string, iterations int) (string, error) {
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

// checkPassword reports whether password matches hash, in constant time.
func checkPassword(hash, password string) bool {
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

// Login throttling: the first failure costs nothing, each further one
// doubles the wait before the next attempt, up to loginMaxDelay, and ten
// quiet minutes forget it all.
const (
	loginBaseDelay = 250 * time.Millisecond
	loginMaxDelay  = 4 * time.Second
	loginForget    = 10 * time.Minute
	loginMaxKeys   = 10_000 // more keys than this, and old ones are dropped
)

// loginThrottle counts recent login failures per key (user or address).
type loginThrottle struct {
	mu       sync.Mutex               // guards failures
	failures map[string]loginFailures // key → recent failures
}

// loginFailures is one key's recent failures.
type loginFailures struct {
	count int       // failures since the last success or forgetting
	last  time.Time // when the newest failure happened
}

// delay is how long the next attempt for any of keys must wait.
func (t *loginThrottle) delay(keys ...string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	var wait time.Duration
	for _, key := range keys {
		f := t.failures[key]
		if f.count < 2 || time.Since(f.last) > loginForget {
			continue
		}
		wait = max(wait, min(loginBaseDelay<<min(f.count-2, 8),
			loginMaxDelay))
	}
	return wait
}

// record counts a failure against keys, or clears them on success.
func (t *loginThrottle) record(ok bool, keys ...string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failures == nil || len(t.failures) > loginMaxKeys {
		t.failures = make(map[string]loginFailures)
	}
	for _, key := range keys {
		if ok {
			delete(t.failures, key)
			continue
		}
		f := t.failures[key]
		if time.Since(f.last) > loginForget {
			f.count = 0
		}
		t.failures[key] = loginFailures{f.count + 1, time.Now()}
	}
}

// hostOf is the host part of a remote address.
func hostOf(remote string) string {
	if host, _, err := net.SplitHostPort(remote); err == nil {
		return host
	}
	return remote
}

// allowPublish takes one publish from the connection's token bucket,
// which refills at PublishRate per second up to one second's worth.
// Only the reader goroutine calls it, so the bucket needs no lock.
func (c *connection) allowPublish() bool {
	rate := c.broker.opts.PublishRate
	if rate <= 0 {
		return true
	}
	now := time.Now()
	c.tokens = min(max(rate, 1), c.tokens+now.Sub(c.refilled).Seconds()*rate)
	c.refilled = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// # Topic rules
//
// Topic rules are MQTT's, because most readers already know them: levels
// separated by "/", "+" matches one level, "#" matches the rest and must
// come last, and a wildcard in the first level never matches a topic
// starting with "$", so that "#" does not drown a subscriber in the
// broker's own traffic. The same matcher routes messages and checks
// permissions, so the two can never disagree about what a filter means.

// validTopic explains why name cannot be published to, or returns "".
func validTopic(name string) string {
	if msg := validFilter(name); msg != "" {
		return msg
	}
	if isWildcard(name) {
		return "wildcards are for subscriptions, not publishes"
	}
	return ""
}

// validFilter explains why filter cannot be subscribed to, or returns "".
// NUL is refused because durable keys use it as a separator.
func validFilter(filter string) string {
	switch {
	case filter == "":
		return "topic is empty"
	case len(filter) > maxTopicBytes:
		return "topic is longer than 256 bytes"
	case strings.ContainsRune(filter, 0):
		return "topic contains a NUL character"
	}
	// Wildcards must fill a level: "a+" or "#b" would be a typo that MQTT
	// refuses too, not a pattern. SplitSeq, not Split: every publish
	// comes through here, and it allocates nothing.
	afterHash := false
	for level := range strings.SplitSeq(filter, "/") {
		if afterHash {
			return "# must be the last level"
		}
		if strings.ContainsAny(level, "+#") && len(level) > 1 {
			return "a wildcard must fill a whole level"
		}
		afterHash = level == "#"
	}
	return ""
}

// isWildcard reports whether filter has a + or # level.
func isWildcard(filter string) bool {
	return strings.ContainsAny(filter, "+#")
}

// covers reports whether every topic that filter matches is also matched
// by grant. For a plain topic as filter, that is "grant matches topic",
// so one function routes messages and checks permissions.
func covers(grant, filter string) bool {
	if strings.HasPrefix(filter, "$") && (strings.HasPrefix(grant, "+") ||
		strings.HasPrefix(grant, "#")) {
		return false
	}

	// Walk both level by level. "#" in the grant covers whatever is
	// left; in the filter it is covered only by a "#" in the grant.
	for {
		level, rest, more := strings.Cut(grant, "/")
		if level == "#" {
			return true
		}
		name, filterRest, filterMore := strings.Cut(filter, "/")
		if name == "#" || (level != "+" && level != name) {
			return false
		}
		if !filterMore {
			return !more || rest == "#"
		}
		if !more {
			return false
		}
		grant, filter = rest, filterRest
	}
}

// allowed reports whether grants permit filter. No grants at all (nil)
// means every ordinary topic; $-topics always need an explicit grant.
func allowed(grants []string, filter string) bool {
	if grants == nil {
		return !strings.HasPrefix(filter, "$")
	}
	return slices.ContainsFunc(grants, func(grant string) bool {
		return covers(grant, filter)
	})
}
