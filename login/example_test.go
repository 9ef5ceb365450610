package login_test

import (
	"fmt"
	"strings"

	"github.com/popsub/popsub/login"
)

// Hash makes the password_hash of a [users.NAME] config entry.
func ExampleHash() {
	hash, err := login.Hash("correct horse battery staple")
	fmt.Println(strings.HasPrefix(hash, "pbkdf2-sha256$600000$"), err)
	// Output:
	// true <nil>
}
