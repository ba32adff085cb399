package decisionlog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// rotatingFile is the file of the JSON-lines file sink: path, written to,
// and its backups path.1 (the newest) to path.N, N = maxFiles-1. It is used
// by the logger's goroutine only.
type rotatingFile struct {
	path     string
	maxSize  int64
	maxFiles int
	f        *os.File // nil after a failed rotation: the next write reopens
	size     int64    // bytes in f
}

func openRotating(path string, maxSize int64, maxFiles int) (*rotatingFile, error) {
	if maxSize <= 0 || maxFiles < 1 {
		return nil, fmt.Errorf("decision log file %s: a size cap over 0 and at least 1 file", path)
	}
	r := &rotatingFile{path: path, maxSize: maxSize, maxFiles: maxFiles}
	if err := r.open(); err != nil {
		return nil, err
	}
	r.removeBeyond() // backups left by a run with more files
	return r, nil
}

func (r *rotatingFile) open() error {
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		return errors.Join(err, f.Close())
	}
	r.f, r.size = f, st.Size()
	return nil
}

// full reports whether n more bytes, after buffered ones not yet written,
// would take the file past its cap (a line never waits for an empty file).
func (r *rotatingFile) full(buffered int64, n int) bool {
	size := r.size + buffered
	return r.f == nil || size > 0 && size+int64(n) > r.maxSize
}

// Write appends p to the current file.
func (r *rotatingFile) Write(p []byte) (int, error) {
	if r.f == nil {
		if err := r.open(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

// rotate closes the file, shifts the backups (the oldest beyond the cap is
// removed) and starts a new, empty file. When a rename fails the file is
// emptied instead: the cap holds before the old records do.
func (r *rotatingFile) rotate() error {
	var errs []error
	if r.f != nil {
		errs = append(errs, r.f.Close())
		r.f = nil
	}
	if r.maxFiles == 1 {
		errs = append(errs, ignoreNotExist(os.Remove(r.path)))
	} else {
		errs = append(errs, ignoreNotExist(os.Remove(r.backup(r.maxFiles-1))))
		for i := r.maxFiles - 2; i >= 1; i-- {
			errs = append(errs, ignoreNotExist(os.Rename(r.backup(i), r.backup(i+1))))
		}
		if err := os.Rename(r.path, r.backup(1)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err, ignoreNotExist(os.Remove(r.path)))
		}
	}
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	r.f, r.size = f, 0
	return errors.Join(errs...)
}

func (r *rotatingFile) backup(i int) string { return r.path + "." + strconv.Itoa(i) }

// removeBeyond removes backups numbered maxFiles or more.
func (r *rotatingFile) removeBeyond() {
	dir, base := filepath.Split(r.path)
	dir = filepath.Clean(dir + ".")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), base+".")
		if i, err := strconv.Atoi(n); ok && err == nil && i >= r.maxFiles {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Close closes the current file.
func (r *rotatingFile) Close() error {
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

func ignoreNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
