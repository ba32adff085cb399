//go:build !linux

package chaos

import "syscall"

// childAttr: elsewhere the children are stopped by Close only.
func childAttr() *syscall.SysProcAttr { return nil }
