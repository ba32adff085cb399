package embedetcd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// ErrDirInUse: another process runs on the member's data directory. etcd
// would wait for its database's file lock for ever, deaf to signals; Start
// says so at once instead.
var ErrDirInUse = errors.New("in use by another process")

// lockName is the file in a data directory whose flock a running member holds
// (released when its process ends, however it ends).
const lockName = "verdict.lock"

// lockDir takes dir's lock, creating dir if missing: ErrDirInUse when another
// process holds it, or holds etcd's database there.
func lockDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: data directory %s: %w", ErrStart, dir, err)
	}
	f, held, err := lockFile(filepath.Join(dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("%w: data directory %s: lock: %w", ErrStart, dir, err)
	}
	if !held {
		held, err = probeBolt(dir)
		if err != nil || held {
			_ = f.Close() // a lock file: nothing was written to it
		}
		if err != nil {
			return nil, fmt.Errorf("%w: data directory %s: %w", ErrStart, dir, err)
		}
	}
	if held {
		return nil, fmt.Errorf("data directory %s is %w (another verdictd or etcd): stop it, or give this one another --data-dir", dir, ErrDirInUse)
	}
	return f, nil
}
