//go:build unix

package embedetcd

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
)

// lockFile takes an exclusive, non-blocking flock on path (created if
// missing). held reports another process holding it.
func lockFile(path string) (f *os.File, held bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // never locked, nothing written
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, true, nil
		}
		return nil, false, err
	}
	return f, false, nil
}

// probeBolt reports whether another process holds etcd's database in dir
// (bbolt's flock on member/snap/db), without waiting for it: an etcd, or a
// verdictd from before the data directory's own lock, running on dir.
func probeBolt(dir string) (held bool, err error) {
	path := filepath.Join(dir, "member", "snap", "db")
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer func() { _ = f.Close() }() // releases the probe's lock, if it got it
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return true, nil
		}
		return false, err
	}
	return false, nil
}
