// Package netnstest builds network namespaces for tests with real packets:
// a routing "host" namespace and two workload namespaces on veth pairs, TCP
// echo servers, and dials from inside a namespace. Tests that use it need
// root and ip(8); Require skips them elsewhere, or fails them when
// VERDICT_REQUIRE_NETNS is set (CI).
package netnstest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// Require skips the test where network namespaces cannot be made (not
// root, no ip(8)), unless VERDICT_REQUIRE_NETNS is set (CI sets it): then a
// skip is a failure.
func Require(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "not root"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "no ip(8) (iproute2)"
	}
	if why == "" {
		return
	}
	if os.Getenv("VERDICT_REQUIRE_NETNS") != "" {
		t.Fatalf("network namespaces are required (VERDICT_REQUIRE_NETNS) but cannot be made: %s", why)
	}
	t.Skipf("network namespaces cannot be made here (%s); CI runs this test", why)
}

// Topo is three namespaces: a "host" H where the firewall runs and routes,
// and two workloads A (10.250.1.2) and B (10.250.2.2) on veth pairs to it
// (devices named by Dev: A's end, then H's end towards A; B's, H's towards B).
type Topo struct {
	H, A, B string
	Dev     [4]string
}

var topos atomic.Int32

// IP runs ip(8) with args; a failure fails the test.
func IP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// NewTopo makes the namespaces and links; they are deleted when the test ends.
func NewTopo(t testing.TB) *Topo {
	t.Helper()
	id := fmt.Sprintf("%x%d", os.Getpid()&0xffff, topos.Add(1)%10)
	tp := &Topo{H: "vfh" + id, A: "vfa" + id, B: "vfb" + id}
	for _, ns := range []string{tp.H, tp.A, tp.B} {
		IP(t, "netns", "add", ns)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
		IP(t, "-n", ns, "link", "set", "lo", "up")
	}
	for i, w := range []string{tp.A, tp.B} {
		in, out := fmt.Sprintf("vf%s%d", id, 2*i), fmt.Sprintf("vf%s%d", id, 2*i+1)
		tp.Dev[2*i], tp.Dev[2*i+1] = in, out
		IP(t, "link", "add", in, "type", "veth", "peer", "name", out)
		IP(t, "link", "set", in, "netns", w)
		IP(t, "link", "set", out, "netns", tp.H)
		IP(t, "-n", w, "addr", "add", fmt.Sprintf("10.250.%d.2/24", i+1), "dev", in)
		IP(t, "-n", tp.H, "addr", "add", fmt.Sprintf("10.250.%d.1/24", i+1), "dev", out)
		IP(t, "-n", w, "link", "set", in, "up")
		IP(t, "-n", tp.H, "link", "set", out, "up")
		IP(t, "-n", w, "route", "add", "default", "via", fmt.Sprintf("10.250.%d.1", i+1))
	}
	if out, err := exec.Command("ip", "netns", "exec", tp.H, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("ip_forward: %v %s", err, out)
	}
	return tp
}

// In runs f with the calling goroutine's thread in namespace ns: sockets
// made by f belong to ns.
func In(t testing.TB, ns string, f func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = orig.Close() }()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Close() }()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(err) // a thread left in another namespace must not be reused
		}
	}()
	f()
}

// Echo serves a line echo on addr inside ns until the test ends.
func Echo(t testing.TB, ns, addr string) {
	t.Helper()
	var ln net.Listener
	In(t, ns, func() {
		var err error
		if ln, err = net.Listen("tcp", addr); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
}

// Dial connects from ns, or fails within timeout.
func Dial(t testing.TB, ns, addr string, timeout time.Duration) (net.Conn, error) {
	t.Helper()
	var c net.Conn
	var err error
	In(t, ns, func() {
		d := net.Dialer{Timeout: timeout}
		c, err = d.DialContext(context.Background(), "tcp", addr)
	})
	return c, err
}

// RoundTrip sends a line and reads it back within timeout.
func RoundTrip(c net.Conn, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return fmt.Errorf("echoed %q", line)
	}
	return nil
}

// Connects reports whether a connection to addr from ns echoes a line
// (generous timeouts: a busy machine may be slow; a deadline, not a timing).
func Connects(t testing.TB, ns, addr string) bool {
	t.Helper()
	c, err := Dial(t, ns, addr, 10*time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	return RoundTrip(c, 10*time.Second) == nil
}

// Blocked: a connection attempt is dropped (no answer within the timeout,
// not refused: the listener is there).
func Blocked(t testing.TB, ns, addr string) bool {
	t.Helper()
	c, err := Dial(t, ns, addr, 2*time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return strings.Contains(err.Error(), "timeout")
}
