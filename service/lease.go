package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// maxAttempts bounds the re-read-and-decide loop of one request; each lost
// compare-and-set means another writer made progress.
const maxAttempts = 8

func newLeaseID() string {
	var b [16]byte // 128 random bits
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

// requestHash names one logical acquire: the message id of its granting
// write and the key of its cancel tombstone derive from it.
func requestHash(resource, requestID string) string {
	h := sha256.Sum256([]byte(resource + "\x00" + requestID))
	return hex.EncodeToString(h[:20])
}

func grantMsgID(hash string) string { return "acq-" + hash }

func sameLease(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (s *Service) ttl(ms int64) (time.Duration, error) {
	if ms == 0 {
		return s.cfg.DefaultTTL, nil
	}
	d := time.Duration(ms) * time.Millisecond
	if ms < 0 || d < s.cfg.MinTTL || d > s.cfg.MaxTTL {
		return 0, fmt.Errorf("%w: ttl_ms %d outside [%d, %d]", streams.ErrInvalid, ms, s.cfg.MinTTL.Milliseconds(), s.cfg.MaxTTL.Milliseconds())
	}
	return d, nil
}

// current returns what is known of key. With fresh it reads from the
// stream leader; otherwise it may answer from the tracker, whose view can
// be stale. Callers commit only by compare-and-set on the revision they
// got. A "locked" answer may rest on the tracker's view of a lone instance
// (see follow.go; an instance that follows others refuses only on a
// read); the other negative answers (lease_lost, released:false,
// cancelled:false) rest on a fresh read proven by confirmNegative.
func (s *Service) current(ctx context.Context, key string, fresh bool) (observation, error) {
	if !fresh {
		if o, ok := s.tracker.get(key); ok {
			return o, nil
		}
		if s.watchSynced.Load() {
			// Never written as far as the watcher knows: try the
			// compare-and-set on revision 0 without a read.
			return observation{}, nil
		}
	}
	e, err := s.store.read(ctx, key)
	if err != nil {
		return observation{}, err
	}
	return s.tracker.observe(key, e), nil
}

func leaseResponse(resource string, token uint64, rec *streams.Record) *streams.LeaseResponse {
	return &streams.LeaseResponse{Resource: resource, LeaseID: rec.LeaseID, Token: token, TTLms: rec.TTLms, ExpiresAt: rec.ExpiresAt}
}

func lockedError(o observation) *opError {
	return &opError{code: streams.CodeLocked, msg: "resource is held by another lease", holder: &streams.Holder{
		Owner: o.rec.Owner, Token: o.rec.TokenAt(o.rev), ExpiresAt: o.rec.ExpiresAt,
	}}
}

// extend writes a renewal of the lease observed in o with a new TTL, by
// compare-and-set on o's revision. The token stays the grant revision.
func (s *Service) extend(ctx context.Context, resource, key string, o observation, ttl time.Duration) (*streams.LeaseResponse, error) {
	now := s.cfg.Clock.Now()
	rec := *o.rec
	rec.Token = o.rec.TokenAt(o.rev)
	rec.TTLms = ttl.Milliseconds()
	rec.RenewedAt = streams.FormatTime(now)
	rec.ExpiresAt = streams.FormatTime(now.Add(ttl))
	seq, _, err := s.store.put(ctx, key, &rec, o.rev, "")
	if err != nil {
		if !errors.Is(err, errConflict) {
			s.tracker.forget(key)
		}
		return nil, err
	}
	s.tracker.observe(key, entry{rev: seq, rec: &rec})
	return leaseResponse(resource, rec.Token, &rec), nil
}

// confirmNegative proves, before a negative answer (lease_lost,
// released:false, cancelled:false), that the fresh read o is current: a
// stream leader cut off by a partition that has just healed can still
// answer reads from old state. On errConflict the caller reads again.
func (s *Service) confirmNegative(ctx context.Context, key string, o observation) error {
	err := s.store.confirm(ctx, key, o.rev)
	if errors.Is(err, errConflict) {
		s.tracker.forget(key)
	}
	return err
}

func (s *Service) acquire(ctx context.Context, req *streams.AcquireRequest, sl *slot) (*streams.LeaseResponse, error) {
	if err := streams.ValidateResource(req.Resource); err != nil {
		return nil, err
	}
	if err := streams.ValidateRequestID(req.RequestID); err != nil {
		return nil, err
	}
	if err := streams.ValidateOwner(req.Owner); err != nil {
		return nil, err
	}
	ttl, err := s.ttl(req.TTLms)
	if err != nil {
		return nil, err
	}
	if req.WaitMs < 0 || time.Duration(req.WaitMs)*time.Millisecond > s.cfg.MaxWait {
		return nil, fmt.Errorf("%w: wait_ms %d outside [0, %d]", streams.ErrInvalid, req.WaitMs, s.cfg.MaxWait.Milliseconds())
	}
	key := streams.LeaseKey(req.Resource)
	hash := requestHash(req.Resource, req.RequestID)
	if req.WaitMs > 0 {
		return s.acquireWaiting(req, key, hash, ttl, time.Duration(req.WaitMs)*time.Millisecond, sl)
	}
	defer s.lockKey(key)()
	return s.tryGrant(ctx, req, key, hash, ttl, false)
}

// leaseEnded is the answer to a retry of an acquire whose lease has ended.
func leaseEnded(requestID string) *opError {
	return newOpError(streams.CodeLeaseLost, "request_id %q was granted before, and that lease has ended", requestID)
}

// tryGrant makes one decision on an acquire: grant, return the request's
// existing lease, or refuse. With fresh, it decides on a read from the
// stream leader rather than on what the watcher last saw. The caller holds
// the key's stripe lock.
func (s *Service) tryGrant(ctx context.Context, req *streams.AcquireRequest, key, hash string, ttl time.Duration, fresh bool) (*streams.LeaseResponse, error) {
	if s.tracker.hasEnded(key, req.RequestID) {
		return nil, leaseEnded(req.RequestID)
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		o, err := s.current(ctx, key, fresh)
		if err != nil {
			return nil, err
		}
		if o.held() {
			if o.rec.RequestID == req.RequestID {
				// A retry of the acquire that holds the lease: the same
				// lease, renewed, because the caller counts its deadline
				// from this request.
				resp, err := s.extend(ctx, req.Resource, key, o, ttl)
				if errors.Is(err, errConflict) {
					fresh = true
					continue
				}
				return resp, err
			}
			if !s.tracker.expired(o, time.Now()) {
				if !fresh && s.Following() {
					// Another instance may have ended the lease since
					// the watcher last delivered (it lags by
					// milliseconds under load, by seconds after a
					// leader change): refuse only on a read.
					fresh = true
					continue
				}
				// A lone instance refuses on its own view, without a
				// read: it made every write but those behind its back.
				return nil, lockedError(o)
			}
			// Expired by observation: take it over by compare-and-set on
			// the revision that expired.
		} else if o.end.Ended(req.RequestID, s.cfg.Clock.Now(), s.tracker.window) {
			return nil, leaseEnded(req.RequestID)
		}
		if ok, ahead := s.mayClaim(streams.EncodeResource(req.Resource), hash, o); !ok {
			s.log.Debug("free but reserved", "resource", req.Resource, "request_id", req.RequestID, "ahead", ahead)
			return nil, newOpError(streams.CodeLocked, "resource is free but reserved for the %d waiters ahead", ahead)
		}
		now := s.cfg.Clock.Now()
		rec := &streams.Record{
			LeaseID:   newLeaseID(),
			Owner:     req.Owner,
			RequestID: req.RequestID,
			TTLms:     ttl.Milliseconds(),
			GrantedAt: streams.FormatTime(now),
			RenewedAt: streams.FormatTime(now),
			ExpiresAt: streams.FormatTime(now.Add(ttl)),
		}
		seq, dup, err := s.store.put(ctx, key, rec, o.rev, grantMsgID(hash))
		if errors.Is(err, errConflict) {
			s.metrics.conflicts.Inc()
			fresh = true
			continue
		}
		if err != nil {
			s.tracker.forget(key)
			return nil, err
		}
		if dup {
			return s.earlierGrant(ctx, req, key, seq, ttl)
		}
		s.tracker.observe(key, entry{rev: seq, rec: rec})
		return leaseResponse(req.Resource, seq, rec), nil
	}
	return nil, fmt.Errorf("%w: %d attempts lost to concurrent writers", errConflict, maxAttempts)
}

// earlierGrant answers an acquire whose granting write JetStream reported
// as a duplicate of an earlier write at seq (an earlier attempt of the same
// request_id, or its cancel tombstone): the same lease if it is still
// current, otherwise lease_lost, never a second lease.
func (s *Service) earlierGrant(ctx context.Context, req *streams.AcquireRequest, key string, seq uint64, ttl time.Duration) (*streams.LeaseResponse, error) {
	for attempt := 0; attempt < maxAttempts; attempt++ {
		o, err := s.current(ctx, key, true)
		if err != nil {
			return nil, err
		}
		if !o.held() || o.rec.RequestID != req.RequestID || o.rec.TokenAt(o.rev) != seq {
			return nil, newOpError(streams.CodeLeaseLost, "request_id %q was granted before (revision %d) or cancelled, and that lease is no longer current", req.RequestID, seq)
		}
		resp, err := s.extend(ctx, req.Resource, key, o, ttl)
		if errors.Is(err, errConflict) {
			continue
		}
		return resp, err
	}
	return nil, fmt.Errorf("%w: %d attempts lost to concurrent writers", errConflict, maxAttempts)
}

func (s *Service) renew(ctx context.Context, req *streams.RenewRequest) (*streams.LeaseResponse, error) {
	if err := streams.ValidateResource(req.Resource); err != nil {
		return nil, err
	}
	if err := streams.ValidateLeaseID(req.LeaseID); err != nil {
		return nil, err
	}
	ttl, err := s.ttl(req.TTLms)
	if err != nil {
		return nil, err
	}
	key := streams.LeaseKey(req.Resource)
	defer s.lockKey(key)()
	fresh := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		o, err := s.current(ctx, key, fresh)
		if err != nil {
			return nil, err
		}
		if !o.held() || !sameLease(o.rec.LeaseID, req.LeaseID) {
			if !fresh {
				fresh = true
				continue
			}
			if err := s.confirmNegative(ctx, key, o); err != nil {
				if errors.Is(err, errConflict) {
					continue
				}
				return nil, err
			}
			return nil, newOpError(streams.CodeLeaseLost, "lease is no longer current")
		}
		resp, err := s.extend(ctx, req.Resource, key, o, ttl)
		if errors.Is(err, errConflict) {
			s.metrics.conflicts.Inc()
			fresh = true
			continue
		}
		return resp, err
	}
	return nil, fmt.Errorf("%w: %d attempts lost to concurrent writers", errConflict, maxAttempts)
}

func (s *Service) release(ctx context.Context, req *streams.ReleaseRequest) (*streams.ReleaseResponse, error) {
	if err := streams.ValidateResource(req.Resource); err != nil {
		return nil, err
	}
	if err := streams.ValidateLeaseID(req.LeaseID); err != nil {
		return nil, err
	}
	key := streams.LeaseKey(req.Resource)
	defer s.lockKey(key)()
	released, err := s.deleteIf(ctx, key, func(rec *streams.Record) bool { return sameLease(rec.LeaseID, req.LeaseID) })
	if err != nil {
		return nil, err
	}
	if released {
		s.wakeHead(streams.EncodeResource(req.Resource))
	}
	return &streams.ReleaseResponse{Resource: req.Resource, Released: released}, nil
}

// endMark returns the body of the delete marker that ends the lease rec at
// key, or nil for a key that is not a lease's.
func (s *Service) endMark(key string, rec *streams.Record) *streams.EndMark {
	if !strings.HasPrefix(key, streams.LeaseKeyPrefix) {
		return nil
	}
	return &streams.EndMark{RequestID: rec.RequestID, EndedAt: streams.FormatTime(s.cfg.Clock.Now())}
}

// deleteIf deletes the lease at key by compare-and-set if match accepts its
// record, and reports whether it did. A negative answer is always
// confirmed by a read from the stream leader. The caller holds the key's
// stripe lock.
func (s *Service) deleteIf(ctx context.Context, key string, match func(*streams.Record) bool) (bool, error) {
	fresh := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		o, err := s.current(ctx, key, fresh)
		if err != nil {
			return false, err
		}
		if !o.held() || !match(o.rec) {
			if !fresh {
				fresh = true
				continue
			}
			if err := s.confirmNegative(ctx, key, o); err != nil {
				if errors.Is(err, errConflict) {
					continue
				}
				return false, err
			}
			return false, nil
		}
		end := s.endMark(key, o.rec)
		seq, err := s.store.del(ctx, key, o.rev, end)
		if errors.Is(err, errConflict) {
			s.metrics.conflicts.Inc()
			fresh = true
			continue
		}
		if err != nil {
			s.tracker.forget(key)
			return false, err
		}
		s.tracker.observe(key, entry{rev: seq, end: end})
		return true, nil
	}
	return false, fmt.Errorf("%w: %d attempts lost to concurrent writers", errConflict, maxAttempts)
}

func (s *Service) cancel(ctx context.Context, req *streams.CancelRequest) (*streams.CancelResponse, error) {
	if err := streams.ValidateResource(req.Resource); err != nil {
		return nil, err
	}
	if err := streams.ValidateRequestID(req.RequestID); err != nil {
		return nil, err
	}
	key := streams.LeaseKey(req.Resource)
	hash := requestHash(req.Resource, req.RequestID)
	defer s.lockKey(key)()
	// The tombstone carries the grant's message id: an acquire of this
	// request arriving later (delayed, or retried) within the retry window
	// is then a duplicate and is never granted.
	if _, _, err := s.store.tombstone(ctx, "cancel."+hash, grantMsgID(hash)); err != nil {
		return nil, err
	}
	released, err := s.deleteIf(ctx, key, func(rec *streams.Record) bool { return rec.RequestID == req.RequestID })
	if err != nil {
		return nil, err
	}
	wkey := streams.WaitKey(req.Resource, hash)
	var wake string
	if o, ok := s.tracker.get(wkey); ok && o.held() {
		wake = o.rec.Wake
	}
	dequeued, err := s.deleteKey(ctx, wkey)
	if err != nil {
		return nil, err
	}
	if dequeued && wake != "" {
		// Let the waiting request (on whichever instance) stop at once.
		_ = s.nc.Publish(wake, nil)
	}
	if o, ok := s.tracker.get(key); released || dequeued && (!ok || !o.held()) {
		s.wakeHead(streams.EncodeResource(req.Resource))
	}
	return &streams.CancelResponse{Resource: req.Resource, Cancelled: released || dequeued}, nil
}

func (s *Service) status(ctx context.Context, req *streams.StatusRequest) (*streams.StatusResponse, error) {
	if err := streams.ValidateResource(req.Resource); err != nil {
		return nil, err
	}
	o, err := s.current(ctx, streams.LeaseKey(req.Resource), true)
	if err != nil {
		return nil, err
	}
	resp := &streams.StatusResponse{Resource: req.Resource}
	resp.Waiters, _ = s.tracker.waiterCounts(streams.EncodeResource(req.Resource), "")
	if o.held() {
		resp.Held = true
		resp.Owner = o.rec.Owner
		resp.Token = o.rec.TokenAt(o.rev)
		resp.ExpiresAt = o.rec.ExpiresAt
	}
	return resp, nil
}
