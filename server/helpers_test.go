package server

import (
	"encoding/json"
	"os"
	"testing"
)

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonNum(s string) json.Number { return json.Number(s) }
