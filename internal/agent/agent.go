// Package agent is verdict's firewall agent (cmd/verdict-agent): it follows
// WatchRules with address sets for each workload it guards and keeps an
// nftables table of its own (internal/firewall) equal to their rules, one
// atomic netlink batch per change. It keeps the last rules when verdictd is
// unreachable (fail static), reconnects with backoff, and says so in its
// metrics (docs/agent.md).
package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc"

	"github.com/verdictpdp/verdict/internal/firewall"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// Agent runs one configuration.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	prog    *firewall.Programmer
	nftOpt  []nftables.ConnOption
	client  verdictv1.WatchServiceClient
	m       *metrics
	stance  *stance
	closers []func() error

	mu     sync.Mutex
	ws     map[string]*guarded // by key: "workload/NAME" or "address/ADDR"
	nextID int
	kick   chan struct{}
	hold   bool // a table of an earlier run is in force and no rules arrived yet (applyLoop only)
}

// Run runs the agent until ctx ends (New, then Agent.Run).
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	a, err := New(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}

// New checks the configuration and prepares an agent: nothing is
// programmed and no stream opened before Run.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: log, m: newMetrics(), ws: map[string]*guarded{}, kick: make(chan struct{}, 1)}
	if cfg.NetNS != "" {
		ns, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("--netns: %w", err)
		}
		a.closers = append(a.closers, ns.Close)
		a.nftOpt = append(a.nftOpt, nftables.WithNetNSFd(int(ns)))
	}
	prog, err := firewall.New(cfg.Table, a.nftOpt...)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.prog = prog
	dopts, err := cfg.dialOptions()
	if err != nil {
		a.Close()
		return nil, err
	}
	conn, err := grpc.NewClient(cfg.Server, dopts...)
	if err != nil {
		a.Close()
		return nil, fmt.Errorf("--server: %w", err)
	}
	a.closers = append(a.closers, conn.Close)
	a.client = verdictv1.NewWatchServiceClient(conn)
	if cfg.Initial == InitialDrop {
		a.stance = dropStance(ctx, cfg.Server)
	}
	return a, nil
}

// Close releases the connection and the namespace handle; the table stays.
func (a *Agent) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		_ = a.closers[i]()
	}
	a.closers = nil
}

// Remove deletes the agent's table (for an operator taking the agent away).
func (a *Agent) Remove() error { return a.prog.Remove() }

// Run follows the guarded workloads and programs their rules until ctx
// ends. The table stays as programmed when it returns (a stopped agent is
// fail static too).
func (a *Agent) Run(ctx context.Context) error {
	cfg, log := a.cfg, a.log
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.MetricsListen != "" {
		lis, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		log.Info("serving metrics", "addr", "http://"+lis.Addr().String()+"/metrics")
		hs := &http.Server{Handler: promhttp.HandlerFor(a.m.reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		wg.Go(func() { _ = hs.Serve(lis) })
		wg.Go(func() {
			<-ctx.Done()
			_ = hs.Close()
		})
	}
	for _, name := range cfg.Workloads {
		a.guard(ctx, &wg, "workload/"+name, chainName(name), &verdictv1.Endpoint{Workload: name}, netip.Addr{})
	}
	if len(cfg.Interfaces) > 0 {
		wg.Go(func() { a.followInterfaces(ctx, &wg) })
	}
	// A table left by an earlier run stays in force until the first apply,
	// which replaces it whole; with none, the stance applies at once to the
	// addresses already known.
	fresh, err := a.tableAbsent()
	if err != nil {
		log.Warn("cannot read the nftables tables; the first apply replaces ours whole", "err", err)
	}
	a.hold = !fresh
	a.signal()
	a.applyLoop(ctx)
	return nil
}

// dropStance drops every packet of a workload without rules but the agent's
// own connection to verdictd (when the guarded address is this host's).
func dropStance(ctx context.Context, server string) *stance {
	st := &stance{in: firewall.Side{Fallback: firewall.Deny}, out: firewall.Side{Fallback: firewall.Deny},
		sets: map[string][]netip.Prefix{}}
	host, port, err := net.SplitHostPort(server)
	if err != nil {
		return st // a Unix socket
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return st
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(lctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return st
	}
	for _, ad := range addrs {
		ad = ad.Unmap()
		st.sets["verdictd"] = append(st.sets["verdictd"], netip.PrefixFrom(ad, ad.BitLen()))
	}
	st.out.Rules = []firewall.Rule{{Peer: "verdictd", Action: firewall.Allow, Comment: "initial stance: the agent's connection to verdictd",
		Ports: []firewall.Ports{{Protocol: "tcp", Ranges: [][2]uint16{{uint16(pn), uint16(pn)}}}}}}
	return st
}

func (a *Agent) tableAbsent() (bool, error) {
	c, err := nftables.New(a.nftOpt...)
	if err != nil {
		return false, err
	}
	t, err := c.ListTableOfFamily(a.cfg.Table, nftables.TableFamilyINet)
	if err != nil || t == nil {
		return true, nil //nolint:nilerr // ENOENT: no such table
	}
	return false, nil
}

// guard starts following one workload.
func (a *Agent) guard(ctx context.Context, wg *sync.WaitGroup, key, chain string, ep *verdictv1.Endpoint, self netip.Addr) {
	a.mu.Lock()
	a.nextID++
	g := &guarded{id: "w" + strconv.Itoa(a.nextID), chain: chain}
	if self.IsValid() {
		g.addrs = []netip.Addr{self}
	}
	a.ws[key] = g
	a.mu.Unlock()
	a.m.connected.WithLabelValues(key).Set(0)
	a.m.failStatic.WithLabelValues(key).Set(0)
	wg.Go(func() { a.follow(ctx, key, g.id, chain, ep, self) })
}

// follow keeps a WatchRules stream open for one workload: on failure it
// keeps the rules held (fail static) and reconnects with jittered
// exponential backoff, reset by a stream that delivered rules.
func (a *Agent) follow(ctx context.Context, key, id, chain string, ep *verdictv1.Endpoint, self netip.Addr) {
	backoff := a.cfg.BackoffMin
	for ctx.Err() == nil {
		delivered, err := a.stream(ctx, key, id, chain, ep, self)
		if ctx.Err() != nil {
			return
		}
		a.m.connected.WithLabelValues(key).Set(0)
		a.m.reconnects.WithLabelValues(key).Inc()
		a.mu.Lock()
		held := a.ws[key] != nil && a.ws[key].ready
		a.mu.Unlock()
		if held {
			a.m.failStatic.WithLabelValues(key).Set(1)
		}
		if delivered {
			backoff = a.cfg.BackoffMin
		}
		wait := backoff/2 + rand.N(backoff/2+1) //nolint:gosec // jitter, not a secret
		a.log.Warn("WatchRules stream down; the last rules stay in force", "workload", key, "err", err,
			"retry_in", wait.Round(time.Millisecond), "fail_static", held)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		backoff = min(2*backoff, a.cfg.BackoffMax)
	}
}

// stream follows one WatchRules stream until it fails; delivered says
// whether it brought rules.
func (a *Agent) stream(ctx context.Context, key, id, chain string, ep *verdictv1.Endpoint, self netip.Addr) (delivered bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := a.client.WatchRules(ctx, &verdictv1.WatchRulesRequest{Mesh: a.cfg.Mesh, Type: a.cfg.Type,
		Workload: ep, AddressSets: true})
	if err != nil {
		return false, err
	}
	var held *guarded // this stream's state: deltas apply to it
	for {
		m, err := s.Recv()
		if err != nil {
			return delivered, err
		}
		switch m.GetKind() {
		case verdictv1.WatchRulesKind_WATCH_RULES_KIND_SET_DELTAS:
			if held == nil {
				a.m.msgErrs.WithLabelValues(key).Inc()
				return delivered, errors.New("set deltas before the rules")
			}
			next := held.clone()
			if err := next.applyDeltas(m); err != nil {
				a.m.msgErrs.WithLabelValues(key).Inc()
				return delivered, fmt.Errorf("revision %d refused: %w", m.GetRevision(), err)
			}
			held = next
		default: // RULES (UNSPECIFIED is read as RULES)
			g, err := translate(id, chain, self, m)
			if err != nil {
				a.m.msgErrs.WithLabelValues(key).Inc()
				return delivered, fmt.Errorf("revision %d refused: %w", m.GetRevision(), err)
			}
			held = g
		}
		delivered = true
		a.m.connected.WithLabelValues(key).Set(1)
		a.m.failStatic.WithLabelValues(key).Set(0)
		a.mu.Lock()
		if _, ok := a.ws[key]; ok { // not dropped meanwhile
			a.ws[key] = held
		}
		a.mu.Unlock()
		a.log.Debug("rules received", "workload", key, "revision", m.GetRevision(), "kind", m.GetKind().String())
		a.signal()
	}
}

// clone copies the state a delta changes (the sets); the rest is shared and
// never modified.
func (g *guarded) clone() *guarded {
	c := *g
	c.sets = make(map[string]map[netip.Prefix]bool, len(g.sets))
	for n, members := range g.sets {
		m := make(map[netip.Prefix]bool, len(members))
		for p := range members {
			m[p] = true
		}
		c.sets[n] = m
	}
	return &c
}

func (a *Agent) signal() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// applyLoop programs the newest state after every change: changes that
// arrive while an apply runs are programmed together by the next one (one
// batch). A refused batch is retried after BackoffMin.
func (a *Agent) applyLoop(ctx context.Context) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-retry:
		}
		retry = nil
		if err := a.apply(); err != nil {
			a.m.applyErrs.Inc()
			a.log.Error("apply refused; retrying", "err", err)
			retry = time.After(a.cfg.BackoffMin)
		}
	}
}

func (a *Agent) apply() error {
	a.mu.Lock()
	ws := make([]*guarded, 0, len(a.ws))
	revs := map[string]int64{}
	for key, g := range a.ws {
		ws = append(ws, g)
		if g.ready {
			revs[key] = g.revision
		}
	}
	a.mu.Unlock()
	if a.hold && len(revs) == 0 {
		return nil // the earlier run's table stays until rules arrive
	}
	a.hold = false
	slices.SortFunc(ws, func(x, y *guarded) int { return cmp.Or(cmp.Compare(len(x.id), len(y.id)), strings.Compare(x.id, y.id)) })
	start := time.Now()
	st, err := a.prog.Apply(ruleset(ws, a.stance))
	if err != nil {
		return err
	}
	a.m.applyTime.Observe(time.Since(start).Seconds())
	kind := "elements"
	if st.Full {
		kind = "full"
	}
	a.m.applies.WithLabelValues(kind).Inc()
	a.m.rules.Set(float64(st.Rules))
	a.m.elements.Set(float64(st.Elements))
	for key, rev := range revs {
		a.m.revision.WithLabelValues(key).Set(float64(rev))
	}
	a.log.Info("applied", "kind", kind, "rules", st.Rules, "sets", st.Sets, "elements", st.Elements,
		"added", st.ElementsAdded, "deleted", st.ElemsDel, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// followInterfaces guards the addresses of the named interfaces (in the
// agent's network namespace, or --netns), rescanning them: a new address is
// watched (WatchRules by address), a gone one dropped from the table.
func (a *Agent) followInterfaces(ctx context.Context, wg *sync.WaitGroup) {
	cancels := map[netip.Addr]context.CancelFunc{}
	for {
		addrs, err := localAddrs(a.cfg.NetNS, a.cfg.Interfaces)
		if err != nil {
			a.log.Warn("reading interface addresses", "err", err)
		} else {
			for _, ad := range addrs {
				if _, ok := cancels[ad]; ok {
					continue
				}
				wctx, cancel := context.WithCancel(ctx)
				cancels[ad] = cancel
				a.log.Info("guarding a local address", "address", ad)
				a.guard(wctx, wg, "address/"+ad.String(), chainName("ip-"+ad.String()),
					&verdictv1.Endpoint{Address: ad.String()}, ad)
			}
			for ad, cancel := range cancels {
				if !slices.Contains(addrs, ad) {
					cancel()
					delete(cancels, ad)
					key := "address/" + ad.String()
					a.mu.Lock()
					delete(a.ws, key)
					a.mu.Unlock()
					a.m.connected.DeleteLabelValues(key)
					a.m.failStatic.DeleteLabelValues(key)
					a.m.revision.DeleteLabelValues(key)
					a.log.Info("address gone from the interfaces; no longer guarded", "address", ad)
				}
			}
			a.signal()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(a.cfg.InterfaceRescan):
		}
	}
}

// localAddrs are the unicast addresses of the named interfaces (not
// link-local, not loopback), read in the namespace nsPath ("" = ours).
func localAddrs(nsPath string, names []string) ([]netip.Addr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if nsPath != "" {
		orig, err := netns.Get()
		if err != nil {
			return nil, err
		}
		defer func() { _ = orig.Close() }()
		ns, err := netns.GetFromPath(nsPath)
		if err != nil {
			return nil, err
		}
		defer func() { _ = ns.Close() }()
		if err := netns.Set(ns); err != nil {
			return nil, err
		}
		defer func() {
			if err := netns.Set(orig); err != nil {
				panic(err) // a thread left in another namespace must not be reused
			}
		}()
	}
	var out []netip.Addr
	for _, name := range names {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", name, err)
		}
		as, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", name, err)
		}
		for _, x := range as {
			n, ok := x.(*net.IPNet)
			if !ok {
				continue
			}
			ad, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			ad = ad.Unmap()
			if ad.IsLoopback() || ad.IsLinkLocalUnicast() || ad.IsMulticast() || ad.IsUnspecified() {
				continue
			}
			if !slices.Contains(out, ad) {
				out = append(out, ad)
			}
		}
	}
	return out, nil
}
