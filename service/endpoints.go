package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetlock/jetlock/streams"
)

// The transport: requests arrive through micro endpoints, pass the reply
// subject guard and the admission gate (gate.go), and are decoded,
// validated and handed to the lock logic (locks.go) on a worker goroutine
// (workers.go); the reply goes straight back on the request's reply
// subject.

// addEndpoints registers one micro endpoint per operation on svc.
func (s *Service) addEndpoints(svc micro.Service) error {
	grp := svc.AddGroup(s.cfg.Prefix + "." + streams.APIVersion)
	for _, op := range streams.Operations {
		// micro endpoint names allow no dots: "admin.revoke" is endpoint
		// admin_revoke on subject <prefix>.v1.admin.revoke.
		name := strings.ReplaceAll(op, ".", "_")
		if err := grp.AddEndpoint(name, micro.HandlerFunc(func(r micro.Request) { s.dispatch(op, r) }), micro.WithEndpointSubject(op)); err != nil {
			return fmt.Errorf("add endpoint %s: %w", op, err)
		}
	}
	return nil
}

// replyAllowed reports whether the service may publish a reply on subject.
// It never publishes on a subject that starts with '$' (the JetStream, KV
// and system APIs) or lies under its own prefix (its request, wake and
// heartbeat subjects), nor on one that is not a valid subject: a request
// names its reply subject, and a reply published there would act with the
// service's rights. An empty subject (a plain publish) gets no reply.
func (s *Service) replyAllowed(subject string) bool {
	if subject == "" {
		return true
	}
	if subject[0] == '$' || subject == s.cfg.Prefix || strings.HasPrefix(subject, s.cfg.Prefix+".") {
		return false
	}
	return !strings.ContainsAny(subject, "*> \t\r\n") && !strings.Contains(subject, "..") &&
		subject[0] != '.' && subject[len(subject)-1] != '.'
}

// dispatch answers a request in a worker goroutine, so that one slow store
// round trip never holds up the subscription. A request whose reply
// subject the service must not publish on is dropped before any work. The
// gate bounds the requests processed at once (MaxInFlight) and queues the
// next MaxQueued; beyond those, or after QueueWait in the queue, the
// service sheds load: it answers unavailable rather than letting requests
// queue until their callers have given up.
func (s *Service) dispatch(op string, r micro.Request) {
	if !s.replyAllowed(r.Reply()) {
		s.report.refusedReply(op, r.Reply())
		return
	}
	s.dispatched.Add(1)
	s.inflight.Add(1)
	received := time.Now()
	s.gate.enter(pending{
		at: received,
		run: func(sl *slot) {
			defer func() {
				sl.release()
				s.inflight.Done()
			}()
			resp, err := s.handle(op, r, received, sl)
			code := ""
			if err != nil {
				oe := toOpError(err)
				code = oe.code
				if oe.code == streams.CodeInternal {
					s.log.Error("internal error", "op", op, "err", err)
				}
				s.replyError(r, oe)
			} else {
				s.replyJSON(r, resp)
			}
			s.report.request(op, code, time.Since(received))
		},
		shed: func(reason string, waited time.Duration) {
			defer s.inflight.Done()
			var oe *opError
			if reason == shedWaited {
				oe = newOpError(streams.CodeUnavailable, "service overloaded: the request waited %v for one of %d places; retry with backoff", waited.Round(time.Millisecond), s.cfg.MaxInFlight)
			} else {
				oe = newOpError(streams.CodeUnavailable, "service overloaded: %d requests in progress and %d queued; retry with backoff", s.cfg.MaxInFlight, s.cfg.MaxQueued)
			}
			s.replyError(r, oe)
			s.report.shed(op, reason, waited)
		},
	})
}

// handle decodes, validates and serves one request received at received;
// its store work must end within QueueWait+OpTimeout of that.
func (s *Service) handle(op string, r micro.Request, received time.Time, sl *slot) (any, error) {
	ctx := s.deadlines.get(received)
	var who origin
	if s.wantOrigin {
		who = requestOrigin(r.Headers())
	}
	switch op {
	case streams.OpAcquire:
		g, wait, err := s.acquireRequest(r.Data(), who)
		if err != nil {
			return nil, err
		}
		if err := s.limits.allow(g.owner, who); err != nil {
			return nil, err
		}
		s.report.touched(g.resource)
		if wait > 0 {
			return s.acquireWaiting(g, wait, sl)
		}
		return s.locks.acquire(ctx, g)
	case streams.OpRenew:
		var req streams.RenewRequest
		if err := decode(r.Data(), &req); err != nil {
			return nil, err
		}
		ttl, err := s.ttl(req.TTLms)
		if err != nil {
			return nil, err
		}
		return s.locks.renew(ctx, req.Resource, req.LeaseID, ttl, who)
	case streams.OpRelease:
		var req streams.ReleaseRequest
		if err := decode(r.Data(), &req); err != nil {
			return nil, err
		}
		return s.locks.release(ctx, req.Resource, req.LeaseID, who)
	case streams.OpCancel:
		var req streams.CancelRequest
		if err := decode(r.Data(), &req); err != nil {
			return nil, err
		}
		return s.locks.cancel(ctx, req.Resource, req.RequestID, who)
	case streams.OpStatus:
		var req streams.StatusRequest
		if err := decode(r.Data(), &req); err != nil {
			return nil, err
		}
		return s.locks.status(ctx, req.Resource)
	case streams.OpList:
		var req streams.ListRequest
		if err := decode(r.Data(), &req); err != nil {
			return nil, err
		}
		return s.locks.list(&req), nil
	case streams.OpRevoke:
		var req streams.RevokeRequest
		if err := decode(r.Data(), &req); err != nil {
			return nil, err
		}
		return s.locks.revoke(ctx, req.Resource, req.Reason, who)
	}
	return nil, fmt.Errorf("unknown operation %q", op)
}

// decode decodes a request body strictly and validates it.
func decode(data []byte, req interface{ Validate() error }) error {
	if err := streams.Decode(data, req); err != nil {
		return err
	}
	return req.Validate()
}

// acquireRequest decodes and validates an acquire: every number is
// bounds-checked before any arithmetic.
func (s *Service) acquireRequest(data []byte, who origin) (*grantReq, time.Duration, error) {
	var req streams.AcquireRequest
	if err := decode(data, &req); err != nil {
		return nil, 0, err
	}
	ttl, err := s.ttl(req.TTLms)
	if err != nil {
		return nil, 0, err
	}
	if req.WaitMs < 0 || req.WaitMs > s.cfg.MaxWait.Milliseconds() {
		return nil, 0, fmt.Errorf("%w: wait_ms %d outside [0, %d]", streams.ErrInvalid, req.WaitMs, s.cfg.MaxWait.Milliseconds())
	}
	hold, err := s.maxHold(req.MaxHoldMs)
	if err != nil {
		return nil, 0, err
	}
	g := &grantReq{resource: req.Resource, requestID: req.RequestID, owner: req.Owner,
		key: streams.LeaseKey(req.Resource), hash: requestHash(req.Resource, req.RequestID),
		ttl: ttl, maxHold: hold, who: who}
	return g, time.Duration(req.WaitMs) * time.Millisecond, nil
}

// ttl converts a request's ttl_ms, checked against the bounds first.
func (s *Service) ttl(ms int64) (time.Duration, error) {
	if ms == 0 {
		return s.cfg.DefaultTTL, nil
	}
	if ms < s.cfg.MinTTL.Milliseconds() || ms > s.cfg.MaxTTL.Milliseconds() {
		return 0, fmt.Errorf("%w: ttl_ms %d outside [%d, %d]", streams.ErrInvalid, ms, s.cfg.MinTTL.Milliseconds(), s.cfg.MaxTTL.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// maxHold converts a request's max_hold_ms (0: the deployment's cap),
// checked against the bounds first.
func (s *Service) maxHold(ms int64) (time.Duration, error) {
	if ms == 0 {
		return 0, nil
	}
	limit := s.cfg.MaxHold
	if limit == 0 {
		limit = streams.MaxHoldCeiling
	}
	if ms < s.cfg.MinTTL.Milliseconds() || ms > limit.Milliseconds() {
		return 0, fmt.Errorf("%w: max_hold_ms %d outside [%d, %d]", streams.ErrInvalid, ms, s.cfg.MinTTL.Milliseconds(), limit.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// requestOrigin returns who sent a request, from the Nats-Request-Info
// header the NATS server sets on requests that cross an account import
// (deploy/ makes callers reach the service that way, so the header is the
// server's word, not the caller's).
func requestOrigin(h micro.Headers) origin {
	info := nats.Header(h).Get("Nats-Request-Info")
	if info == "" {
		return origin{}
	}
	var ci struct {
		Account string `json:"acc"`
		User    string `json:"user"`
	}
	if jsonv2.Unmarshal([]byte(info), &ci, jsonv2.RejectUnknownMembers(false)) != nil {
		return origin{}
	}
	return origin{account: ci.Account, user: ci.User}
}

// replyJSON and replyError answer on the request's reply subject directly.
// They run in the request's own goroutine, after micro's handler has
// returned; micro's Respond and Error record the outcome in the request for
// its statistics without a lock, which would race with micro reading it.
// The price: micro's error counts stay zero (the Prometheus metrics and the
// endpoint stats data count results).
func (s *Service) replyJSON(r micro.Request, v any) {
	if a, ok := v.(appender); ok {
		buf := encode(a)
		defer buf.free()
		s.reply(&nats.Msg{Subject: r.Reply(), Data: buf.b})
		return
	}
	body, err := marshal(v)
	if err != nil {
		s.replyError(r, newOpError(streams.CodeInternal, "encode reply: %v", err))
		return
	}
	s.reply(&nats.Msg{Subject: r.Reply(), Data: body})
}

func (s *Service) replyError(r micro.Request, oe *opError) {
	body, _ := json.Marshal(streams.ErrorResponse{Error: streams.ErrorDetail{Code: oe.code, Message: oe.msg, Holder: oe.holder,
		RetryAfterMs: oe.retryAfter.Milliseconds()}})
	m := &nats.Msg{Subject: r.Reply(), Data: body, Header: nats.Header{}}
	m.Header.Set(micro.ErrorHeader, oe.msg)
	m.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(streams.StatusCode(oe.code)))
	s.reply(m)
}

func (s *Service) reply(m *nats.Msg) {
	if m.Subject == "" {
		return // a request without a reply subject (a plain publish)
	}
	if err := s.nc.PublishMsg(m); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("reply failed", "err", err)
	}
}

// marshal encodes a body that has no hand-written encoder (the bodies
// written on every request have theirs: see encode) with the
// encoding/json/v2 prototype. A value json/v2 refuses (a string that is
// not valid UTF-8, which validation keeps out of records and replies) goes
// through encoding/json, which replaces the bad bytes.
func marshal(v any) ([]byte, error) {
	if b, err := jsonv2.Marshal(v); err == nil {
		return b, nil
	}
	return json.Marshal(v)
}
