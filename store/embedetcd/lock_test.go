//go:build unix

package embedetcd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/verdictpdp/verdict/store/embedetcd"
)

// TestDataDirInUse: a second member on a data directory in use fails at
// once, naming the directory, instead of waiting for etcd's database lock
// for ever (issue 34 item 4); so does one while another process holds the
// database there. Once the first member is closed, the directory is free.
func TestDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	first, err := embedetcd.Start(storeCtx(t), embedetcd.Config{Dir: dir, Fast: true, NoFsync: true, Private: true})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := os.ReadFile(filepath.Join(dir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = embedetcd.Start(storeCtx(t), embedetcd.Config{Dir: dir, Fast: true, NoFsync: true, Private: true})
	if !errors.Is(err, embedetcd.ErrDirInUse) || !strings.Contains(err.Error(), "data directory "+dir+" is in use by another process") {
		t.Fatalf("a second member on %s: %v, want ErrDirInUse naming the directory", dir, err)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "tls", "ca.pem")); string(now) != string(certs) {
		t.Fatal("the refused member rewrote the first one's certificates")
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := embedetcd.Start(storeCtx(t), embedetcd.Config{Dir: dir, Fast: true, NoFsync: true}); !errors.Is(err, embedetcd.ErrDirInUse) {
		t.Fatalf("a member on the directory of a stopped one (Stop keeps it for Restart): %v, want ErrDirInUse", err)
	}
	first.Close()

	// Another process's etcd: bbolt's lock on the database, not verdict's.
	db, err := os.OpenFile(filepath.Join(dir, "member", "snap", "db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(db.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, err = embedetcd.Start(storeCtx(t), embedetcd.Config{Dir: dir, Fast: true, NoFsync: true})
	db.Close()
	if !errors.Is(err, embedetcd.ErrDirInUse) {
		t.Fatalf("a member on a directory whose database another process holds: %v, want ErrDirInUse", err)
	}

	again, err := embedetcd.Start(storeCtx(t), embedetcd.Config{Dir: dir, Fast: true, NoFsync: true})
	if err != nil {
		t.Fatalf("the directory once free: %v", err)
	}
	again.Close()
}

// storeCtx bounds a start: a guard against a hang, not a timing assertion.
func storeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
