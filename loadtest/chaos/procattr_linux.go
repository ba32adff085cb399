package chaos

import "syscall"

// childAttr makes a child process die with the chaos process, even when that
// one is killed: no verdictd outlives a run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
