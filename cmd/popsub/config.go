package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/popsub/popsub"
)

// configFile is what a TOML configuration file says: a value for a
// setting's key ("broker.ack_timeout"), and the users who may log in.
// It accepts the original PopSub's config/default.toml layout too
// ([server] host, port, jwt_secret; [broker] message_ttl_secs), so its
// users can bring their file.
type configFile struct {
	values map[string]any // "section.key" → the decoded value
	secret string         // server.jwt_secret
	users  map[string]popsub.User
}

// originalKeys are the original's keys that no setting has; configFile
// turns them into settings' values.
var originalKeys = []string{"server.host", "server.port",
	"server.jwt_secret", "broker.message_ttl_secs"}

// loadConfig reads a TOML file. A key PopSub does not know is an error
// that names it: a typo must not silently fall back to a default.
func loadConfig(path string, settings []setting) (configFile, error) {
	var raw map[string]any
	if _, err := toml.DecodeFile(path, &raw); err != nil {
		return configFile{}, fmt.Errorf("config %s: %w", path, err)
	}
	known := map[string]bool{}
	for _, s := range settings {
		known[s.key] = true
	}
	for _, key := range originalKeys {
		known[key] = true
	}
	f := configFile{values: map[string]any{}}
	for section, table := range raw {
		entries, ok := table.(map[string]any)
		if !ok {
			return f, fmt.Errorf("config %s: unknown key %s", path, section)
		}
		if section == "users" {
			users, err := usersOf(entries)
			if err != nil {
				return f, fmt.Errorf("config %s: %w", path, err)
			}
			f.users = users
			continue
		}
		for key, value := range entries {
			name := section + "." + key
			if !known[name] {
				return f, fmt.Errorf("config %s: unknown key %s", path, name)
			}
			f.values[name] = value
		}
	}
	return f, f.original()
}

// original turns the original's keys into settings' values, where the
// file does not set the settings themselves.
func (f *configFile) original() error {
	if secret, ok := f.values["server.jwt_secret"].(string); ok {
		f.secret = secret
	}
	host, hasHost := f.values["server.host"].(string)
	port, hasPort := f.values["server.port"].(int64)
	if _, set := f.values["server.addr"]; !set && (hasHost || hasPort) {
		f.values["server.addr"] = net.JoinHostPort(cmp.Or(host,
			"127.0.0.1"), strconv.FormatInt(cmp.Or(port, 8080), 10))
	}
	if secs, ok := f.values["broker.message_ttl_secs"].(int64); ok {
		if _, set := f.values["broker.ttl"]; !set {
			f.values["broker.ttl"] = (time.Duration(secs) *
				time.Second).String()
		}
	}
	return nil
}

// usersOf reads the [users.NAME] tables.
func usersOf(tables map[string]any) (map[string]popsub.User, error) {
	users := map[string]popsub.User{}
	for name, table := range tables {
		entry, _ := table.(map[string]any)
		hash, _ := entry["password_hash"].(string)
		if !strings.HasPrefix(hash, "pbkdf2-sha256$") {
			return nil, errors.New("user " + name + " needs a password_hash " +
				"from 'popsub hash-password'")
		}
		users[name] = popsub.User{PasswordHash: hash,
			Publish:   stringsOf(entry["publish"]),
			Subscribe: stringsOf(entry["subscribe"])}
	}
	return users, nil
}

// stringsOf is a TOML array of strings, or nil.
func stringsOf(v any) []string {
	items, _ := v.([]any)
	var out []string
	for _, item := range items {
		if s, ok := item.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// configPath finds --config in args, or POPSUB_CONFIG. It is read before
// the flags, because the file's values are the flags' defaults.
func configPath(args []string) string {
	for i, arg := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if name != "config" || !strings.HasPrefix(arg, "-") {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return os.Getenv("POPSUB_CONFIG")
}
