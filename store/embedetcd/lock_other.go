//go:build !unix

package embedetcd

import "os"

// lockFile opens path; without flock the data directory is not guarded.
func lockFile(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	return f, false, err
}

// probeBolt finds nothing without flock.
func probeBolt(string) (bool, error) { return false, nil }
