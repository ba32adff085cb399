package etcd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine/resource"
	"github.com/verdictpdp/verdict/store"
)

// maxAttempts bounds Apply's retries when another writer changes a key between
// its read and its transaction (only for ops without an expected revision).
const maxAttempts = 16

// maxRecordRaces bounds the retries of an Apply whose transaction failed
// because other writers recorded later times first (record.go): each such
// failure means another write went through, so they end, but many writers
// of one replica can make one of them lose several times running.
const maxRecordRaces = 64

// raftOverhead is what etcd adds around a transaction before comparing it with
// --max-request-bytes (the request header and framing), with room to spare.
const raftOverhead = 512

// Apply implements store.Store.
//
// A put must keep the stored creationTime, so Apply reads the current values
// of its keys, then sends one transaction guarded by their mod revisions (the
// caller's expected revisions, or the ones just read): if another writer got
// in between and the caller expected nothing, it reads again and retries.
//
// Referential integrity (store.Integrity) is part of the same transaction:
//   - a scope a put names (a policy's scope, a scope's parent) must exist at
//     commit: Compare(CreateRevision(scope key) > 0);
//   - a deleted scope must have no dependent at commit. The read (one
//     revision R, in the same read transaction as the keys) lists the mesh's
//     policies and scopes and finds none naming it; the transaction then
//     compares that every key under <mesh>/policies/ and <mesh>/scopes/ still
//     has a mod revision ≤ R (one range compare each). A policy or scope
//     written after R — the only way a new dependent can appear — fails the
//     compare, and Apply reads again.
//
// etcd runs transactions one after the other, so of a delete of scope S and a
// put of a policy in S racing, whichever commits second fails its compare:
// the put if S is gone, the delete if the policy (mod revision > R) is there.
// Never both. The price is a read of the mesh's policies per scope delete, and
// a retry when the mesh is written meanwhile.
//
// One form per type (store.Form) is kept with a marker per mesh and type
// under the store's meta prefix (metaKey): <meta>forms/<mesh>/<type>/targeting
// and …/content hold the form the type's policies use. A put compares the
// markers' values with its form (Compare(Value(marker) = form)): writers of
// one form never conflict with each other, and a put of another form fails the
// compare. Such a put — or the first of a type, with no marker yet — switches
// the form: it reads the type's policies at revision R with the markers,
// finds none of another form (other than those it rewrites or deletes), and
// the transaction compares every key under <mesh>/policies/<type>/ to a mod
// revision ≤ R and the markers' mod revisions, and writes the markers. So of
// two writers racing with two forms, whichever commits second fails a compare,
// reads again, and finds the other's policy: ErrIntegrity. The markers only
// ever say a form the type's API-written policies all use: a write that set
// them found no other at R, and every later put of another form must change
// them first.
//
// The read is skipped when the caller says what its keys hold (Op.Current,
// from its snapshot) and no scope is deleted: the transaction is then guarded
// by those mod revisions, stamped with those creationTimes, and sent at once —
// one round trip instead of two. If a guard fails (the snapshot lagged, or a
// scope named is missing), nothing was written and Apply reads and retries as
// above, so a wrong Current costs a round trip and changes no outcome.
func (s *Store) Apply(ctx context.Context, ops []store.Op) (int64, error) {
	keys, err := store.CheckOps(ops)
	if err != nil {
		return 0, err
	}
	integ, err := store.CheckIntegrity(ops, keys)
	if err != nil {
		return 0, err
	}
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	if len(ops) == 0 {
		cctx, cancel := s.callCtx(ctx)
		defer cancel()
		resp, err := s.cli.Get(cctx, s.prefix, clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil {
			err = mapErr("read revision", err)
			s.observe(ctx, err, 0)
			return 0, err
		}
		s.observe(ctx, nil, resp.Header.Revision)
		return resp.Header.Revision, nil
	}
	paths := make([]string, len(ops))
	for i, k := range keys {
		paths[i] = s.key(k)
	}
	if cur, ok := knownCurrent(ops, integ); ok {
		rev, done, _, err := s.commit(ctx, ops, paths, cur, integ, 0, fastForms(integ), s.lastRecord())
		if err != nil || done {
			return rev, err
		}
		// A Current was wrong (the caller's snapshot lags), or a form marker
		// is missing or says another form: read and retry.
	}
	switching := make([]bool, len(integ.Forms)) // forms whose type's policies are read
	races := 0                                  // transactions that failed on the write record alone, it seems
	for attempt := 0; ; attempt++ {
		cur, rd, err := s.readCurrent(ctx, ops, paths, integ, switching)
		if err != nil {
			return 0, err
		}
		for i, op := range ops {
			if !store.ExpectationHolds(op.ExpectedRevision, cur[i].mod) {
				return 0, store.Conflict(keys[i], op.ExpectedRevision, cur[i].mod)
			}
		}
		if len(rd.missing) > 0 {
			return 0, store.Missing(rd.missing)
		}
		if len(rd.dependents) > 0 {
			return 0, store.InUse(rd.dependents)
		}
		if len(rd.mixed) > 0 {
			return 0, store.MixedForms(rd.mixed)
		}
		guards, reread := formGuards(integ, rd, switching)
		if reread {
			// A marker does not say the write's form: read that type's
			// policies (at a new revision, with everything else).
			continue
		}
		rev, done, raced, err := s.commit(ctx, ops, paths, cur, integ, rd.rev, guards, rd.record)
		if err != nil || done {
			return rev, err
		}
		if raced && races < maxRecordRaces {
			// Another writer recorded a later time between our read and our
			// transaction: nothing of ours is in question, and waiting would
			// only let more writers pass. Read and send again at once,
			// without counting an attempt (bounded apart).
			races++
			attempt--
			continue
		}
		if attempt+1 == maxAttempts {
			return 0, fmt.Errorf("%w: the keys kept changing during %d attempts", store.ErrConflict, maxAttempts)
		}
		// A guard failed: the next read tells whether the caller's expectation
		// broke (a conflict) or another writer only raced ours (retry). Writers
		// racing on one key back off for a random while, growing with the
		// attempts, so that one of them gets through instead of all of them
		// reading and failing in step.
		if err := backOff(ctx, attempt); err != nil {
			return 0, err
		}
	}
}

// backOff waits a random time in [0, 2^attempt ms), at most 128 ms, or until
// ctx ends.
func backOff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 7)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// knownCurrent is what ops hold now according to their Currents, when that
// is enough to write them in one transaction with no read first: every op
// that needs its key's current value (a put, a guarded delete) carries a
// Current that meets its expected revision, and no scope is deleted (its
// dependents are found by a read).
func knownCurrent(ops []store.Op, integ store.Integrity) ([]current, bool) {
	if len(integ.DeletedScopes) > 0 {
		return nil, false
	}
	cur := make([]current, len(ops))
	for i, op := range ops {
		if op.Resource == nil && op.ExpectedRevision == store.AnyRevision {
			continue
		}
		c := op.Current
		if c == nil || !store.ExpectationHolds(op.ExpectedRevision, c.ModRevision) {
			return nil, false
		}
		cur[i] = current{mod: c.ModRevision, known: true, created: c.CreationTime}
	}
	return cur, true
}

// formGuard is how a transaction keeps one of the write's forms (see Apply):
// with switching false, by comparing the markers' values with the form; with
// switching true, by comparing the type's policies to mod revisions ≤ the read
// revision and the markers to the mod revisions read, and writing the markers.
type formGuard struct {
	form      store.Form
	switching bool
	mods      [2]int64 // the targeting and content markers' mod revisions (0: absent)
}

// fastForms guards every form of the write by its markers' values.
func fastForms(integ store.Integrity) []formGuard {
	out := make([]formGuard, len(integ.Forms))
	for i, f := range integ.Forms {
		out[i] = formGuard{form: f}
	}
	return out
}

// formGuards returns the guards of the write's forms after a read: a form its
// markers say is guarded by them; one they do not say switches, which needs
// its type's policies read (reread: not read yet; switching is updated).
func formGuards(integ store.Integrity, rd integrityRead, switching []bool) (_ []formGuard, reread bool) {
	out := make([]formGuard, len(integ.Forms))
	for i, f := range integ.Forms {
		m := rd.markers[i]
		if m.says(f) {
			// The markers say the write's form (again: another writer
			// of it may have set them since an earlier attempt): they
			// guard it alone, and no longer every policy of the type.
			switching[i] = false
			out[i] = formGuard{form: f}
			continue
		}
		if !switching[i] {
			switching[i], reread = true, true
		}
		out[i] = formGuard{form: f, switching: true, mods: [2]int64{m.mod[0], m.mod[1]}}
	}
	return out, reread
}

// markers is what a type's form markers hold: values ("" absent) and mod
// revisions, [0] targeting and [1] content.
type markers struct {
	value [2]string
	mod   [2]int64
}

func (m markers) says(f store.Form) bool {
	return m.value[0] == f.Targeting && (f.Content == "" || m.value[1] == f.Content)
}

// formKeys are the etcd keys of f's markers: targeting, content.
func (s *Store) formKeys(f store.Form) [2]string {
	base := s.meta + "forms/" + f.Mesh + "/" + f.Type + "/"
	return [2]string{base + "targeting", base + "content"}
}

// commit sends ops as one transaction guarded by cur (the mod revision each
// key holds), integ's compares (dependents' ranges as read at rev), the
// forms' guards and the write record's (last: what the record key is known to
// hold). done is false when a guard failed: nothing was written.
//
// The transaction records the write (record.go): its time — now, or the last
// recorded time when the clock reads earlier, so that recorded times never go
// backwards — and its writer. The puts are stamped with the same time.
func (s *Store) commit(ctx context.Context, ops []store.Op, paths []string, cur []current, integ store.Integrity,
	rev int64, forms []formGuard, last recordState) (_ int64, done, raced bool, _ error) {
	now := s.cfg.Now().UTC()
	if now.Before(last.at) {
		now = last.at
	}
	var cmps []clientv3.Cmp
	var then []clientv3.Op
	size := &pb.TxnRequest{}
	{
		c, put := s.recordOps(ctx, now, last)
		cmps, then = append(cmps, c), append(then, put)
		size.Compare = append(size.Compare, c.GetCompare())
		size.Success = append(size.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte(s.recordKey()), Value: []byte(put.ValueBytes())}}})
	}
	for _, k := range integ.MustExist {
		p := s.key(k)
		c := clientv3.Compare(clientv3.CreateRevision(p), ">", 0)
		cmps = append(cmps, c)
		size.Compare = append(size.Compare, c.GetCompare())
	}
	for _, r := range integ.DependentRanges() {
		c := clientv3.Compare(clientv3.ModRevision(s.prefix+r), "<", rev+1).WithPrefix()
		cmps = append(cmps, c)
		size.Compare = append(size.Compare, c.GetCompare())
	}
	for _, g := range forms {
		keys := s.formKeys(g.form)
		values := [2]string{g.form.Targeting, g.form.Content}
		n := 1 // markers in play: targeting, and content when the write has one
		if g.form.Content != "" {
			n = 2
		}
		if g.switching {
			c := clientv3.Compare(clientv3.ModRevision(s.prefix+g.form.Range()), "<", rev+1).WithPrefix()
			cmps = append(cmps, c)
			size.Compare = append(size.Compare, c.GetCompare())
		}
		for j := range n {
			c := clientv3.Compare(clientv3.Value(keys[j]), "=", values[j])
			if g.switching {
				c = clientv3.Compare(clientv3.ModRevision(keys[j]), "=", g.mods[j])
				then = append(then, clientv3.OpPut(keys[j], values[j]))
				size.Success = append(size.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
					RequestPut: &pb.PutRequest{Key: []byte(keys[j]), Value: []byte(values[j])}}})
			}
			cmps = append(cmps, c)
			size.Compare = append(size.Compare, c.GetCompare())
		}
	}
	for i, op := range ops {
		mod := cur[i].mod
		guard := op.Resource != nil || op.ExpectedRevision != store.AnyRevision
		if guard {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(paths[i]), "=", mod))
			size.Compare = append(size.Compare, &pb.Compare{Key: []byte(paths[i]), Target: pb.Compare_MOD,
				TargetUnion: &pb.Compare_ModRevision{ModRevision: mod}})
		}
		if op.Resource == nil {
			then = append(then, clientv3.OpDelete(paths[i]))
			size.Success = append(size.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{
				RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(paths[i])}}})
			continue
		}
		stamped := cur[i].stamp(op.Resource, now)
		if op.Restore {
			stamped = store.StampRestore(op.Resource, now)
		}
		value, err := resource.EncodeJSON(stamped)
		if err != nil {
			return 0, false, false, fmt.Errorf("%w: ops[%d]: %w", store.ErrInvalidArgument, i, err)
		}
		then = append(then, clientv3.OpPut(paths[i], string(value)))
		size.Success = append(size.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
			RequestPut: &pb.PutRequest{Key: []byte(paths[i]), Value: value}}})
	}
	if n := proto.Size(size) + raftOverhead; n > store.MaxTxnBytes {
		return 0, false, false, fmt.Errorf("%w: %d bytes, over the limit of %d per transaction", store.ErrTooLarge, n, store.MaxTxnBytes)
	}
	cctx, cancel := s.callCtx(ctx)
	// On failure the record key is read, to tell a race on it from a
	// failed guard of the write's own keys.
	resp, err := s.cli.Txn(cctx).If(cmps...).Then(then...).Else(clientv3.OpGet(s.recordKey())).Commit()
	cancel()
	if err != nil {
		err = mapErr("apply", err)
		s.observe(ctx, err, 0)
		return 0, false, false, err
	}
	s.observe(ctx, nil, resp.Header.Revision)
	if resp.Succeeded {
		s.recorded(now)
		return resp.Header.Revision, true, false, nil
	}
	if len(resp.Responses) > 0 {
		st := readRecordState(resp.Responses[0].GetResponseRange().GetKvs())
		raced = st.exists && !st.broken && st.at.After(now)
	}
	return resp.Header.Revision, false, raced, nil
}

// current is what a key holds: its mod revision (0: nothing) and the stored
// value, or with known the creationTime of that value (Op.Current).
type current struct {
	mod     int64
	value   []byte
	known   bool
	created time.Time
}

// stamp sets a put's times over what the key holds (store.Stamp).
func (c current) stamp(r resource.Resource, now time.Time) resource.Resource {
	if c.known {
		return store.StampCurrent(r, store.Current{ModRevision: c.mod, CreationTime: c.created}, now)
	}
	return store.Stamp(r, c.value, now)
}

// integrityRead is what readCurrent found of a write's integrity: the
// revision it read at, the scopes named that do not exist, the stored
// dependents of deleted scopes (path → the scope it names), the markers of
// the write's forms, and the stored policies whose forms mix with the
// write's (path → how), among the types read.
type integrityRead struct {
	rev        int64
	record     recordState // what the write record key holds
	missing    []resource.Key
	dependents map[string]resource.Key
	markers    []markers
	mixed      map[string]string
}

// readCurrent reads, in one transaction (one revision), the keys of ops, the
// scopes they name, the ranges where dependents of the scopes they delete can
// be, the markers of their forms, and the policies of the types of the forms
// that are switching.
func (s *Store) readCurrent(ctx context.Context, ops []store.Op, paths []string, integ store.Integrity,
	switching []bool) ([]current, integrityRead, error) {
	out := make([]current, len(ops))
	rd := integrityRead{markers: make([]markers, len(integ.Forms))}
	var gets []clientv3.Op
	var idx []int
	for i, op := range ops {
		if op.Resource != nil || op.ExpectedRevision != store.AnyRevision {
			gets = append(gets, clientv3.OpGet(paths[i]))
			idx = append(idx, i)
		}
	}
	nKeys := len(gets)
	for _, k := range integ.MustExist {
		gets = append(gets, clientv3.OpGet(s.key(k), clientv3.WithKeysOnly()))
	}
	nExist := len(gets)
	ranges := integ.DependentRanges()
	for _, r := range ranges {
		gets = append(gets, clientv3.OpGet(s.prefix+r, clientv3.WithPrefix()))
	}
	nDeps := len(gets)
	for _, f := range integ.Forms {
		keys := s.formKeys(f)
		gets = append(gets, clientv3.OpGet(keys[0]), clientv3.OpGet(keys[1]))
	}
	nMarkers := len(gets)
	for i, f := range integ.Forms {
		if switching[i] {
			gets = append(gets, clientv3.OpGet(s.prefix+f.Range(), clientv3.WithPrefix()))
		}
	}
	gets = append(gets, clientv3.OpGet(s.recordKey()))
	s.reads.Add(1)
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(cctx).Then(gets...).Commit()
	if err != nil {
		err = mapErr("apply: read", err)
		s.observe(ctx, err, 0)
		return nil, rd, err
	}
	rd.rev = resp.Header.Revision
	last := resp.Responses[len(resp.Responses)-1]
	resp.Responses = resp.Responses[:len(resp.Responses)-1]
	rd.record = readRecordState(last.GetResponseRange().GetKvs())
	for j, r := range resp.Responses {
		kvs := r.GetResponseRange().GetKvs()
		switch {
		case j < nKeys:
			if len(kvs) > 0 {
				out[idx[j]] = current{mod: kvs[0].ModRevision, value: kvs[0].Value}
			}
		case j < nExist:
			if len(kvs) == 0 {
				rd.missing = append(rd.missing, integ.MustExist[j-nKeys])
			}
		case j < nDeps:
			for _, kv := range kvs {
				p := s.path(kv.Key)
				if d, ok := integ.Dependent(p, kv.Value); ok {
					if rd.dependents == nil {
						rd.dependents = map[string]resource.Key{}
					}
					rd.dependents[p] = d
				}
			}
		case j < nMarkers:
			if len(kvs) > 0 {
				m := &rd.markers[(j-nDeps)/2]
				m.value[(j-nDeps)%2], m.mod[(j-nDeps)%2] = string(kvs[0].Value), kvs[0].ModRevision
			}
		default:
			for _, kv := range kvs {
				p := s.path(kv.Key)
				if why, ok := integ.FormConflict(p, kv.Value); ok {
					if rd.mixed == nil {
						rd.mixed = map[string]string{}
					}
					rd.mixed[p] = why
				}
			}
		}
	}
	return out, rd, nil
}
