package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/internal/apiconv"
	"github.com/verdictpdp/verdict/internal/observed"
	verdictv1 "github.com/verdictpdp/verdict/proto/verdict/v1"
)

// The floods' meshes: the identity flood registers its fresh sets in
// floodMeshA while the victim's sets live in floodMeshB; the decision-log
// flood decides in logFloodMesh while the honest caller decides one real
// flow in honestMesh, a mesh no other scenario uses (so that every record and
// drop of it is the honest flow's).
const (
	floodMeshA   = "flood-a"
	floodMeshB   = "flood-b"
	logFloodMesh = "log-flood"
	honestMesh   = "honest"
)

// The attackers' loopback addresses: verdictd limits Identify per caller (an
// IP address without mTLS), so each attacker is a caller of its own, apart
// from the victim, the honest caller and the probes (127.0.0.1) and from the
// agents of callers (127.0.0.2 to 127.0.0.251).
var (
	identifyAttacker = net.IPv4(127, 0, 0, 252)
	logAttacker      = net.IPv4(127, 0, 0, 253)
)

// IdentifyFlood is what the identity flood measured.
type IdentifyFlood struct {
	// Endpoints: the attacker's endpoints by the code each got (OK, or the
	// error code of the Identified result: ResourceExhausted from the
	// per-caller limit).
	Endpoints map[string]int64 `json:"endpoints"`
	// Registered: fresh sets answered with an identity; Held: of those, the
	// ones mesh A still knew after the flood (DecideCompact of each);
	// Evicted: the others. verdictd exports no registry metric.
	Registered int64 `json:"registered"`
	Held       int64 `json:"held"`
	Evicted    int64 `json:"evicted"`
	// The victim: rounds of DecideBatch by tags, DecideCompact and
	// DecideBatch by identity; calls that failed, by code; identity answers
	// compared with the tag answer of the same flow, and those that differed
	// (an identity answered for another set) or did not resolve, in mesh B
	// (Unknown) and in the attacker's mesh A (UnknownA: evicted, answered
	// as it must be); the victim's Identify calls again after one.
	VictimRounds  int64            `json:"victimRounds"`
	VictimFailed  map[string]int64 `json:"victimFailed,omitempty"`
	Compared      int64            `json:"compared"`
	Mismatches    int64            `json:"mismatches"`
	Unknown       int64            `json:"unknown"`
	UnknownA      int64            `json:"unknownInFloodedMesh"`
	Reidentified  int64            `json:"reidentified"`
	MismatchFirst []string         `json:"mismatchExamples,omitempty"`
	// HeapPerSet: verdictd's live heap right after the flood over what it
	// was before, per set mesh A held (the registry keeps its sets by
	// design).
	HeapPerSet int64 `json:"heapPerSetBytes,omitempty"`
}

// LogFlood is what the decision-log flood measured.
type LogFlood struct {
	Path      string `json:"path"`
	MaxSize   int64  `json:"maxSize"`
	MaxFiles  int    `json:"maxFiles"`
	MaxRecord int64  `json:"maxRecord"`
	// Bound: max-size × max-files plus one record; MaxBytes: the most the
	// log's files held together, sampled every 10 ms; BytesBySecond: the
	// most of each second of the scenario.
	Bound         int64   `json:"boundBytes"`
	MaxBytes      int64   `json:"maxBytes"`
	BytesBySecond []int64 `json:"bytesBySecond"`
	// verdictd's counters over the scenario (verdict_decision_log_*).
	Offered   int64            `json:"offered"`
	Written   int64            `json:"written"`
	Repeats   int64            `json:"repeats"`
	Truncated int64            `json:"truncated"`
	Dropped   map[string]int64 `json:"droppedByMesh,omitempty"`
	SinkErrs  int64            `json:"sinkErrors"`
	// The file as a reader following it saw it: lines, lines over the
	// record cap, summary records and the drops they tell by mesh, and
	// rotations that passed before the reader got to a file.
	Lines     int64            `json:"lines"`
	Overlong  int64            `json:"overlongLines"`
	Summaries int64            `json:"summaries"`
	Told      map[string]int64 `json:"toldByMesh,omitempty"`
	Unread    int64            `json:"filesUnread"`
	// The honest flow: its decisions answered and failed; the decisions its
	// records stand for (Follow, each counting max(1, repeats)), in how many
	// records; and its drops told in the summaries and counted by the metric.
	HonestDecided int64  `json:"honestDecided"`
	HonestFailed  int64  `json:"honestFailed"`
	HonestWritten int64  `json:"honestWritten"`
	HonestRecords int64  `json:"honestRecords"`
	HonestInFile  int64  `json:"honestInFile"` // the same, from the file as read
	HonestTold    int64  `json:"honestTold"`
	HonestMetric  int64  `json:"honestDroppedMetric"`
	FollowErr     string `json:"followError,omitempty"`
	Accounted     bool   `json:"accounted"`
	// Verifiable: the reader read every file and the follower was never
	// dropped, so Accounted is a finding, not a guess.
	Verifiable bool `json:"verifiable"`
}

// logFloodArgs are verdictd's flags for the decision-log flood: a file sink
// at path with the run's caps.
func logFloodArgs(path string, maxSize int64, maxFiles int) []string {
	return []string{"--decision-log", "file:" + path, "--decision-log-max-size", strconv.FormatInt(maxSize, 10),
		"--decision-log-max-files", strconv.Itoa(maxFiles)}
}

// seedFloods writes the floods' meshes: allow-all in logFloodMesh; in
// floodMeshA and floodMeshB a DENY of victim-0 to the victim's destination
// beside an allow-all, so that an identity answered for another set shows
// as a different answer; one ALLOW in honestMesh.
func seedFloods(ctx context.Context, c *clients) error {
	sel := func(svc string) []resource.Selector {
		return []resource.Selector{{Match: map[string]string{resource.ServiceTag: svc}}}
	}
	pols := []*resource.Policy{
		{Mesh: floodMeshA, Name: "allow-all", Action: resource.Allow, Sources: sel("*"), Destinations: sel("*")},
		{Mesh: floodMeshA, Name: "deny-victim-0", Action: resource.Deny, Sources: sel("victim-0"), Destinations: sel("victim-db")},
		{Mesh: floodMeshB, Name: "allow-all", Action: resource.Allow, Sources: sel("*"), Destinations: sel("*")},
		{Mesh: floodMeshB, Name: "deny-victim-0", Action: resource.Deny, Sources: sel("victim-0"), Destinations: sel("victim-db")},
		{Mesh: logFloodMesh, Name: "allow-all", Action: resource.Allow, Sources: sel("*"), Destinations: sel("*")},
		{Mesh: honestMesh, Name: "web-to-api", Action: resource.Allow, Sources: sel("web"), Destinations: sel("api")},
	}
	req := &verdictv1.ApplyRequest{}
	for _, p := range pols {
		p.Type = resource.DefaultType
		pr, err := apiconv.ResourceToProto(p)
		if err != nil {
			return err
		}
		req.Resources = append(req.Resources, pr)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := c.pol.Apply(cctx, req)
	return err
}

// from dials n connections from the local address ip where the system has
// it (else from the default address): one caller, as verdictd sees callers.
func (h *hostile) from(ip net.IP, n int, opts ...grpc.DialOption) ([]*clients, error) {
	local := &net.TCPAddr{IP: ip}
	dial := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{LocalAddr: local}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		}
		return c, nil
	})
	out := make([]*clients, 0, n)
	for range n {
		c, err := dialClients(h.r.addr, append([]grpc.DialOption{dial}, opts...)...)
		if err != nil {
			closeAll(out)
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// compactWord is one DecideCompact answer, unpacked as docs/api.md gives
// its bits.
type compactWord struct {
	action string // ALLOW, DENY, or empty with a code
	code   uint32
	policy string
}

func unpackCompact(resp *verdictv1.DecideCompactResponse) []compactWord {
	out := make([]compactWord, len(resp.GetAnswers()))
	for i, w := range resp.GetAnswers() {
		a := compactWord{code: w >> 3 & 0xf}
		switch w & 3 {
		case 1:
			a.action = "ALLOW"
		case 2:
			a.action = "DENY"
		}
		if p := int(w >> 8); p > 0 && p <= len(resp.GetPolicies()) {
			a.policy = resp.GetPolicies()[p-1]
		}
		out[i] = a
	}
	return out
}

func actionWord(a verdictv1.Action) string {
	switch a {
	case verdictv1.Action_ACTION_ALLOW:
		return "ALLOW"
	case verdictv1.Action_ACTION_DENY:
		return "DENY"
	}
	return a.String()
}

const (
	victimSets = 8  // the victim's source sets; one destination set besides
	victimRate = 20 // the victim's rounds a second
	victimPort = 5432
	ppTCP      = 1 << 16 // DecideCompact's protocol bits for TCP
)

// victim is the Identify flood's victim in one mesh: source sets and one
// destination set it registers, and its three ways of deciding the same
// flows (by tags, DecideCompact, by identity).
type victim struct {
	mesh     string
	identify *verdictv1.IdentifyRequest // the sources, then the destination
	tagged   *verdictv1.DecideBatchRequest
	byID     *verdictv1.DecideBatchRequest
	compact  *verdictv1.DecideCompactRequest
}

func newVictim(mesh string, srcs []string) *victim {
	set := func(svc string) map[string]string { return map[string]string{resource.ServiceTag: svc, "env": "prod"} }
	v := &victim{mesh: mesh, identify: &verdictv1.IdentifyRequest{Mesh: mesh}, tagged: &verdictv1.DecideBatchRequest{}}
	for _, svc := range slices.Concat(srcs, []string{"victim-db"}) {
		v.identify.Endpoints = append(v.identify.Endpoints, &verdictv1.Endpoint{Tags: set(svc)})
	}
	dst := v.identify.Endpoints[len(srcs)]
	for _, src := range v.identify.Endpoints[:len(srcs)] {
		v.tagged.Requests = append(v.tagged.Requests, &verdictv1.DecideRequest{Mesh: mesh, Source: src, Destination: dst,
			Protocol: "TCP", Port: victimPort})
	}
	return v
}

// register calls Identify for the victim's sets and builds its requests by
// identity.
func (v *victim) register(ctx context.Context, c *clients) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := c.dec.Identify(cctx, v.identify)
	if err != nil {
		return err
	}
	ids := make([]uint64, 0, len(resp.GetResults()))
	for i, r := range resp.GetResults() {
		if r.GetError() != nil || r.GetIdentity() == 0 {
			return fmt.Errorf("the victim's Identify in mesh %s: endpoint %d: %v", v.mesh, i, r.GetError())
		}
		ids = append(ids, r.GetIdentity())
	}
	n := len(ids) - 1
	v.byID = &verdictv1.DecideBatchRequest{}
	v.compact = &verdictv1.DecideCompactRequest{Mesh: v.mesh}
	for i := range n {
		v.byID.Requests = append(v.byID.Requests, &verdictv1.DecideRequest{Mesh: v.mesh, Source: &verdictv1.Endpoint{Identity: ids[i]},
			Destination: &verdictv1.Endpoint{Identity: ids[n]}, Protocol: "TCP", Port: victimPort})
		v.compact.SourceIds = append(v.compact.SourceIds, ids[i])
		v.compact.DestinationIds = append(v.compact.DestinationIds, ids[n])
		v.compact.PortProtocols = append(v.compact.PortProtocols, victimPort|ppTCP)
	}
	return nil
}

// round decides the victim's flows the three ways and compares each identity
// answer with the tag answer; an identity that does not resolve counts in
// unknown, and the victim registers again, as a sidecar does.
func (v *victim) round(ctx context.Context, c *clients, res *IdentifyFlood, unknown *int64) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	failed := func(what string, err error) { res.VictimFailed[what+" "+codeOf(err)]++ }
	mismatch := func(how string, i int, got, want string) {
		res.Mismatches++
		if len(res.MismatchFirst) < 5 {
			res.MismatchFirst = append(res.MismatchFirst, fmt.Sprintf("%s of mesh %s flow %d: %s, by tags %s", how, v.mesh, i, got, want))
		}
	}
	tagged, err := c.dec.DecideBatch(cctx, v.tagged)
	if err != nil {
		failed("DecideBatch by tags", err)
		return
	}
	want := make([]string, len(v.tagged.Requests))
	for i, r := range tagged.GetResults() {
		if r.GetError() != nil {
			res.VictimFailed["DecideBatch by tags "+r.GetError().GetCode()]++
			continue
		}
		want[i] = actionWord(r.GetResponse().GetAction()) + " " + r.GetResponse().GetPolicy()
	}
	lost := false
	if resp, err := c.dec.DecideCompact(cctx, v.compact); err != nil {
		failed("DecideCompact", err)
	} else {
		for i, a := range unpackCompact(resp) {
			switch {
			case a.code == uint32(verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_SOURCE) ||
				a.code == uint32(verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_DESTINATION):
				*unknown++
				lost = true
			case a.code != 0:
				res.VictimFailed[fmt.Sprintf("DecideCompact code %d", a.code)]++
			case want[i] != "":
				res.Compared++
				if got := a.action + " " + a.policy; got != want[i] {
					mismatch("DecideCompact", i, got, want[i])
				}
			}
		}
	}
	if resp, err := c.dec.DecideBatch(cctx, v.byID); err != nil {
		failed("DecideBatch by identity", err)
	} else {
		for i, r := range resp.GetResults() {
			switch {
			case r.GetError().GetCode() == codes.NotFound.String():
				*unknown++
				lost = true
			case r.GetError() != nil:
				res.VictimFailed["DecideBatch by identity "+r.GetError().GetCode()]++
			case want[i] != "":
				res.Compared++
				if got := actionWord(r.GetResponse().GetAction()) + " " + r.GetResponse().GetPolicy(); got != want[i] {
					mismatch("Decide by identity", i, got, want[i])
				}
			}
		}
	}
	if lost {
		if err := v.register(ctx, c); err != nil {
			failed("Identify again", err)
		} else {
			res.Reidentified++
		}
	}
}

// identifyFlood: a victim registers tag sets in floodMeshB (and one flow's
// in floodMeshA), then decides each round by tags, by DecideCompact and by
// identity, and compares every identity answer with the tag answer of the
// same flow; meanwhile an attacker (IdentifyConns connections, one caller,
// no token) registers fresh sets of 1,000 in floodMeshA as fast as verdictd
// answers, for IdentifyFor. Mesh A's victim flow may be evicted (it must
// then answer unknown, never the DENY-less answer of another set); mesh B's
// must not be. After the flood, each set the attacker registered is looked
// up to count the ones mesh A evicted.
func (h *hostile) identifyFlood(ctx context.Context, s *HostileScenario) error {
	res := &IdentifyFlood{Endpoints: map[string]int64{}, VictimFailed: map[string]int64{}}
	s.Identify = res
	s.Keeps = identityMeshMaxBytes
	c, err := h.dial()
	if err != nil {
		return err
	}
	defer c.conn.Close()
	attackers, err := h.from(identifyAttacker, h.cfg.IdentifyConns)
	if err != nil {
		return err
	}
	defer closeAll(attackers)
	var srcs []string
	for i := range victimSets {
		srcs = append(srcs, fmt.Sprintf("victim-%d", i))
	}
	inB, inA := newVictim(floodMeshB, srcs), newVictim(floodMeshA, []string{"victim-0"})
	for _, v := range []*victim{inB, inA} {
		if err := v.register(ctx, c); err != nil {
			return err
		}
	}

	// The attacker.
	var (
		mu         sync.Mutex
		registered []uint64
		wg         sync.WaitGroup
	)
	end := time.Now().Add(h.cfg.IdentifyFor)
	for k, a := range attackers {
		wg.Go(func() {
			req := &verdictv1.IdentifyRequest{Mesh: floodMeshA, Endpoints: make([]*verdictv1.Endpoint, 1000)}
			for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
				for i := range req.Endpoints {
					req.Endpoints[i] = &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: fmt.Sprintf("fresh-%d-%d-%d", k, n, i)}}
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := a.dec.Identify(cctx, req)
				cancel()
				count(&mu, s.Codes, err)
				if err != nil {
					continue
				}
				mu.Lock()
				for _, r := range resp.GetResults() {
					code := cmpOr(r.GetError().GetCode(), "OK")
					res.Endpoints[code]++
					if code == "OK" {
						registered = append(registered, r.GetIdentity())
					}
				}
				mu.Unlock()
			}
		})
	}

	// The victim, until the attacker is done.
	tick := time.NewTicker(time.Second / victimRate)
	defer tick.Stop()
	for time.Now().Before(end) && ctx.Err() == nil {
		<-tick.C
		res.VictimRounds++
		inB.round(ctx, c, res, &res.Unknown)
		inA.round(ctx, c, res, &res.UnknownA)
	}
	wg.Wait()
	if len(res.VictimFailed) == 0 {
		res.VictimFailed = nil
	}
	// The heap the registry holds now, after the flood.
	kept, kerr := scrapeLive(ctx, h.r.metrics)
	s.Peak = kept

	// Which of the attacker's sets mesh A still holds.
	res.Registered = int64(len(registered))
	for len(registered) > 0 {
		n := min(len(registered), 1000)
		// An unknown destination: a known source answers its code without a
		// decision (nothing memoised or observed), an evicted one the
		// source's.
		req := &verdictv1.DecideCompactRequest{Mesh: floodMeshA, SourceIds: registered[:n], DestinationIds: slices.Repeat([]uint64{1}, n),
			PortProtocols: slices.Repeat([]uint32{80 | ppTCP}, n)}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := c.dec.DecideCompact(cctx, req)
		cancel()
		if err != nil {
			return fmt.Errorf("looking up the attacker's sets: %w", err)
		}
		for _, a := range unpackCompact(resp) {
			if a.code == uint32(verdictv1.CompactCode_COMPACT_CODE_UNKNOWN_DESTINATION) {
				res.Held++
			}
		}
		registered = registered[n:]
	}
	res.Evicted = res.Registered - res.Held
	if kerr == nil && res.Held > 0 {
		res.HeapPerSet = (kept.HeapLive - s.Before.HeapLive) / res.Held
	}
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// honestFlow is the decision-log flood's real flow; warm-up flows use other
// ports.
var honestFlow = &verdictv1.DecideRequest{Mesh: honestMesh, Source: &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: "web"}},
	Destination: &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: "api"}}, Protocol: "TCP", Port: 443}

const (
	honestRate   = 20      // the honest flow's decisions a second
	logMaxRecord = 4 << 10 // verdictd's default --decision-log-max-record (docs/logs.md)
)

// logFlood: the attacker (Concurrent connections, one caller) floods
// DecideBatch calls of 1,000 distinct flows with 2 KB of tags each, and
// DecideCompact calls of 1,000 flows (distinct ports) over two registered
// sets of 64 tags (63 of 1 KB) — the largest records — and over two sets of
// one tag — the cheapest decisions, the most records a second — for
// LogFloodFor; an honest caller decides one real flow in
// its own mesh all along. A reader follows the log file (through its
// rotations), a sampler adds up its files' sizes every 10 ms, and a Follow
// stream of the honest mesh sees the honest flow's records. At the end the
// honest flow's decisions must be accounted for: written (a record counts
// max(1, repeats)) or told dropped by a summary in the file.
// observedFlowBytes is an observed flow's slot, its ends aside (the table's
// test measures about 120).
const observedFlowBytes = 128

func (h *hostile) logFlood(ctx context.Context, s *HostileScenario) error {
	c := h.cfg
	res := &LogFlood{Path: h.logPath, MaxSize: c.LogMaxSize, MaxFiles: c.LogMaxFiles, MaxRecord: logMaxRecord,
		Told: map[string]int64{}}
	res.Bound = c.LogMaxSize*int64(c.LogMaxFiles) + res.MaxRecord
	s.Log = res
	// The flood's distinct flows stay in the observed-flows table, by
	// design: its bounds (docs/analysis.md) are what it may keep.
	s.Keeps = observed.DefaultMaxEndBytes + observed.DefaultMax*observedFlowBytes
	before, err := scrapeSeries(ctx, h.r.metrics, "verdict_decision_log_")
	if err != nil {
		return err
	}

	tail, err := openTail(h.logPath, res.MaxRecord)
	if err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var bg sync.WaitGroup
	bg.Go(func() { tail.follow(sctx) })
	disk := &diskSampler{path: h.logPath}
	bg.Go(func() { disk.run(sctx) })
	defer func() {
		stop()
		bg.Wait()
		tail.close()
	}()

	// The honest caller's Follow stream, known to be registered once it
	// delivers a warm-up flow's record.
	honest, err := h.dial()
	if err != nil {
		return err
	}
	defer honest.conn.Close()
	fol, err := verdictv1.NewDecisionLogServiceClient(honest.conn).Follow(sctx, &verdictv1.FollowRequest{Mesh: honestMesh})
	if err != nil {
		return fmt.Errorf("follow the honest mesh: %w", err)
	}
	var (
		written, records atomic.Int64
		warm             = make(chan struct{}, 1)
		folErr           = make(chan error, 1)
	)
	go func() {
		for {
			m, err := fol.Recv()
			if err != nil {
				folErr <- err
				return
			}
			r := m.GetRecord()
			if r.GetPort() != honestFlow.GetPort() {
				select {
				case warm <- struct{}{}:
				default:
				}
				continue
			}
			records.Add(1)
			written.Add(max(r.GetRepeats(), 1))
		}
	}()
	for i := 0; ; i++ {
		w := &verdictv1.DecideRequest{Mesh: honestMesh, Source: honestFlow.Source, Destination: honestFlow.Destination,
			Protocol: "TCP", Port: uint32(10000 + i)}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := honest.dec.Decide(cctx, w)
		cancel()
		if err != nil {
			return fmt.Errorf("the honest caller's warm-up: %w", err)
		}
		select {
		case <-warm:
		case err := <-folErr:
			return fmt.Errorf("the honest mesh's Follow: %w", err)
		case <-time.After(100 * time.Millisecond):
			if i < 100 {
				continue
			}
			return errors.New("the honest mesh's Follow saw no record of 100 decisions")
		}
		break
	}

	// The attacker.
	attackers, err := h.from(logAttacker, c.Concurrent)
	if err != nil {
		return err
	}
	defer closeAll(attackers)
	big := func(svc string) *verdictv1.Endpoint {
		ep := &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: svc}}
		for i := range resource.MaxTagsPerWorkload - 1 {
			ep.Tags[fmt.Sprintf("k%02d", i)] = strings.Repeat(string(rune('a'+i%26)), resource.MaxTagValueLength)
		}
		return ep
	}
	small := func(svc string) *verdictv1.Endpoint {
		return &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: svc}}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ids, err := attackers[0].dec.Identify(cctx, &verdictv1.IdentifyRequest{Mesh: logFloodMesh,
		Endpoints: []*verdictv1.Endpoint{big("big-src"), big("big-dst"), small("small-src"), small("small-dst")}})
	cancel()
	if err != nil {
		return fmt.Errorf("register the flood's sets: %w", err)
	}
	var sets []uint64 // big source and destination, small source and destination
	for _, r := range ids.GetResults() {
		if r.GetIdentity() == 0 {
			return fmt.Errorf("register the flood's sets: %v", ids.GetResults())
		}
		sets = append(sets, r.GetIdentity())
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	end := time.Now().Add(c.LogFloodFor)
	pad := strings.Repeat("x", resource.MaxTagValueLength)
	flooding := func() bool { return time.Now().Before(end) && ctx.Err() == nil }
	call := func(rpc string, f func(context.Context) error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		countRPC(&mu, s.Codes, rpc, f(cctx))
	}
	// compact floods flows from src to dst, each on a port of its own
	// (TCP, then UDP) until the 131,070 are used, then again.
	compact := func(a *clients, k int, rpc string, src, dst uint64) {
		req := &verdictv1.DecideCompactRequest{Mesh: logFloodMesh, SourceIds: slices.Repeat([]uint64{src}, 1000),
			DestinationIds: slices.Repeat([]uint64{dst}, 1000), PortProtocols: make([]uint32, 1000)}
		for n := 0; flooding(); n++ {
			for i := range req.PortProtocols {
				f := (k*1000003 + n*1000 + i) % (2 * 65535)
				req.PortProtocols[i] = uint32(1+f%65535) | uint32(1+f/65535)<<16
			}
			call(rpc, func(ctx context.Context) error { _, err := a.dec.DecideCompact(ctx, req); return err })
		}
	}
	// Each connection carries the three floods at once.
	for k, a := range attackers {
		wg.Go(func() {
			batch := &verdictv1.DecideBatchRequest{}
			for range 1000 {
				batch.Requests = append(batch.Requests, &verdictv1.DecideRequest{Mesh: logFloodMesh,
					Source:      &verdictv1.Endpoint{Tags: map[string]string{"pad": pad}},
					Destination: &verdictv1.Endpoint{Tags: map[string]string{resource.ServiceTag: "flood-db", "pad": pad}},
					Protocol:    "TCP", Port: 8080})
			}
			for n := 0; flooding(); n++ {
				for i, r := range batch.Requests { // every flow a new one: none folds into repeats
					r.Source.Tags[resource.ServiceTag] = fmt.Sprintf("flood-%d-%d-%d", k, n, i)
				}
				call("DecideBatch", func(ctx context.Context) error { _, err := a.dec.DecideBatch(ctx, batch); return err })
			}
		})
		wg.Go(func() { compact(a, k, "DecideCompact of 64 tags", sets[0], sets[1]) })
		wg.Go(func() { compact(a, k, "DecideCompact of 1 tag", sets[2], sets[3]) })
	}

	// The honest flow, all along and one second after.
	tick := time.NewTicker(time.Second / honestRate)
	defer tick.Stop()
	for time.Now().Before(end.Add(time.Second)) && ctx.Err() == nil {
		<-tick.C
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := honest.dec.Decide(cctx, honestFlow)
		cancel()
		if err != nil {
			res.HonestFailed++
			continue
		}
		res.HonestDecided++
	}
	wg.Wait()
	s.Peak, _ = scrapeLive(ctx, h.r.metrics)

	// Until the honest flow is accounted for: its repeats are written at the
	// end of their window (5 s), its drops told by the next summary (every
	// 10 s).
	honestMetric := func() int64 {
		now, err := scrapeSeries(ctx, h.r.metrics, "verdict_decision_log_dropped_total")
		if err != nil {
			return -1
		}
		return byLabel(now, "verdict_decision_log_dropped_total", "mesh")[honestMesh] -
			byLabel(before, "verdict_decision_log_dropped_total", "mesh")[honestMesh]
	}
	deadline := time.Now().Add(16 * time.Second)
	for {
		res.HonestWritten, res.HonestRecords = written.Load(), records.Load()
		res.HonestTold = tail.toldOf(honestMesh)
		got := res.HonestWritten + res.HonestTold
		res.Accounted = got >= res.HonestDecided && got <= res.HonestDecided+res.HonestFailed
		if res.Accounted || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
	res.HonestMetric = honestMetric()
	select {
	case err := <-folErr:
		res.FollowErr = err.Error()
	default:
	}
	stop()
	bg.Wait()

	res.MaxBytes, res.BytesBySecond = disk.most, disk.bySecond
	tail.mu.Lock()
	res.Lines, res.Overlong, res.Summaries, res.Unread = tail.lines, tail.overlong, tail.summaries, tail.unread
	res.HonestInFile = tail.honest
	for m, n := range tail.told {
		res.Told[m] = n
	}
	tail.mu.Unlock()
	res.Verifiable = res.Unread == 0 && res.FollowErr == ""
	after, err := scrapeSeries(ctx, h.r.metrics, "verdict_decision_log_")
	if err != nil {
		return err
	}
	res.counters(before, after)
	return nil
}

// counters are verdictd's decision-log counters over the scenario.
func (res *LogFlood) counters(before, after map[string]int64) {
	delta := func(name string) int64 { return sumOf(after, name) - sumOf(before, name) }
	res.Offered, res.Written = delta("verdict_decision_log_offered_total"), delta("verdict_decision_log_written_total")
	res.Repeats, res.Truncated = delta("verdict_decision_log_repeats_total"), delta("verdict_decision_log_truncated_total")
	res.SinkErrs = delta("verdict_decision_log_sink_errors_total")
	res.Dropped = map[string]int64{}
	b := byLabel(before, "verdict_decision_log_dropped_total", "mesh")
	for m, n := range byLabel(after, "verdict_decision_log_dropped_total", "mesh") {
		if d := n - b[m]; d > 0 {
			res.Dropped[m] = d
		}
	}
}

// countRPC counts a call's code under its RPC's name: "DecideBatch OK".
func countRPC(mu *sync.Mutex, m map[string]int64, rpc string, err error) {
	mu.Lock()
	m[rpc+" "+codeOf(err)]++
	mu.Unlock()
}

// fmtSizes prints byte counts in MiB, one decimal, space-separated.
func fmtSizes(bs []int64) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = fmt.Sprintf("%.1f", float64(b)/(1<<20))
	}
	return strings.Join(parts, " ") + " MiB"
}
