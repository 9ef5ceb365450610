package main

import "encoding/json"

// jsonUnmarshal decodes text into v.
func jsonUnmarshal(text string, v any) error {
	return json.Unmarshal([]byte(text), v)
}
