package etcd

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/verdictpdp/verdict/engine"
	"github.com/verdictpdp/verdict/store"
)

// maxAttempts bounds Apply's retries when another writer changes a key between
// its read and its transaction (only for ops without an expected revision).
const maxAttempts = 16

// raftOverhead is what etcd adds around a transaction before comparing it with
// --max-request-bytes (the request header and framing), with room to spare.
const raftOverhead = 512

// Apply implements store.Store.
//
// A put must keep the stored creationTime, so Apply reads the current values
// of its keys, then sends one transaction guarded by their mod revisions (the
// caller's expected revisions, or the ones just read): if another writer got
// in between and the caller expected nothing, it reads again and retries.
func (s *Store) Apply(ctx context.Context, ops []store.Op) (int64, error) {
	keys, err := store.CheckOps(ops)
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
		paths[i] = k.Path(s.cfg.Prefix)
	}
	for attempt := 0; ; attempt++ {
		cur, err := s.readCurrent(ctx, ops, paths)
		if err != nil {
			return 0, err
		}
		now := s.cfg.Now()
		var cmps []clientv3.Cmp
		var then []clientv3.Op
		size := &pb.TxnRequest{}
		for i, op := range ops {
			mod := cur[i].mod
			if !store.ExpectationHolds(op.ExpectedRevision, mod) {
				return 0, store.Conflict(keys[i], op.ExpectedRevision, mod)
			}
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
			value, err := engine.EncodeJSON(store.Stamp(op.Resource, cur[i].value, now))
			if err != nil {
				return 0, fmt.Errorf("%w: ops[%d]: %w", store.ErrInvalidArgument, i, err)
			}
			then = append(then, clientv3.OpPut(paths[i], string(value)))
			size.Success = append(size.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{
				RequestPut: &pb.PutRequest{Key: []byte(paths[i]), Value: value}}})
		}
		if n := proto.Size(size) + raftOverhead; n > store.MaxTxnBytes {
			return 0, fmt.Errorf("%w: %d bytes, over the limit of %d per transaction", store.ErrTooLarge, n, store.MaxTxnBytes)
		}
		cctx, cancel := s.callCtx(ctx)
		resp, err := s.cli.Txn(cctx).If(cmps...).Then(then...).Commit()
		cancel()
		if err != nil {
			err = mapErr("apply", err)
			s.observe(ctx, err, 0)
			return 0, err
		}
		s.observe(ctx, nil, resp.Header.Revision)
		if resp.Succeeded {
			return resp.Header.Revision, nil
		}
		if attempt+1 == maxAttempts {
			return 0, fmt.Errorf("%w: the keys kept changing during %d attempts", store.ErrConflict, maxAttempts)
		}
		// A guard failed: the next read tells whether the caller's expectation
		// broke (a conflict) or another writer only raced ours (retry).
	}
}

type current struct {
	mod   int64
	value []byte
}

// readCurrent reads the keys of ops in one transaction (one revision).
func (s *Store) readCurrent(ctx context.Context, ops []store.Op, paths []string) ([]current, error) {
	out := make([]current, len(ops))
	var gets []clientv3.Op
	var idx []int
	for i, op := range ops {
		if op.Resource != nil || op.ExpectedRevision != store.AnyRevision {
			gets = append(gets, clientv3.OpGet(paths[i]))
			idx = append(idx, i)
		}
	}
	if len(gets) == 0 {
		return out, nil
	}
	cctx, cancel := s.callCtx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(cctx).Then(gets...).Commit()
	if err != nil {
		err = mapErr("apply: read", err)
		s.observe(ctx, err, 0)
		return nil, err
	}
	for j, r := range resp.Responses {
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) > 0 {
			out[idx[j]] = current{mod: kvs[0].ModRevision, value: kvs[0].Value}
		}
	}
	return out, nil
}
