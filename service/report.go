package service

import (
	"context"
	"log/slog"
	"time"

	"golang.org/x/time/rate"
)

// reporter turns what the service does into metrics, audit records and
// logs. The audit log has one record per grant, renew refusal, release,
// expiry, hand-over, cancel and revoke, with fixed keys — event, resource,
// token, owner, outcome, instance, and the caller's account and user when
// the NATS server vouched for them — and never a lease id.
type reporter struct {
	m        *metrics
	hot      *hot
	audit    *slog.Logger // nil: no audit log
	log      *slog.Logger
	instance string
	// warnings limits the warnings a flood of bad requests can log.
	warnings *rate.Limiter
}

func newReporter(m *metrics, audit, log *slog.Logger, instance string) *reporter {
	return &reporter{m: m, hot: newHot(), audit: audit, log: log, instance: instance, warnings: rate.NewLimiter(10, 20)}
}

// record writes one audit record.
func (r *reporter) record(event, resource string, token uint64, owner, outcome string, who origin, attrs ...slog.Attr) {
	if r.audit == nil {
		return
	}
	all := append([]slog.Attr{slog.String("event", event), slog.String("resource", resource), slog.Uint64("token", token),
		slog.String("owner", owner), slog.String("outcome", outcome), slog.String("instance", r.instance)}, attrs...)
	if who.user != "" || who.account != "" {
		all = append(all, slog.String("account", who.account), slog.String("user", who.user))
	}
	r.audit.LogAttrs(context.Background(), slog.LevelInfo, "audit", all...)
}

// granted: a lease was granted, through an acquire or a hand-over.
func (r *reporter) granted(resource string, token uint64, owner string, who origin, via string) {
	r.record("grant", resource, token, owner, via, who)
}

// renewRefused: a renewal was answered lease_lost.
func (r *reporter) renewRefused(resource, reason string, who origin) {
	r.m.renewFailures.WithLabelValues(reason).Inc()
	r.record("renew_refused", resource, 0, "", reason, who)
}

// ended: a release, revoke, cancel or expiry ended a lease (outcome
// "ended") or found none to end ("not_held").
func (r *reporter) ended(why endReason, resource string, token uint64, owner, outcome string, who origin, attrs ...slog.Attr) {
	switch {
	case outcome != "ended":
	case why == endExpiry:
		r.m.expired.Inc()
	case why == endRevoke:
		r.m.revokes.Inc()
	}
	if why == endCancel {
		return // the cancel's own record says it
	}
	r.record(string(why), resource, token, owner, outcome, who, attrs...)
}

// session: a session was opened, closed (session_close) or expired
// (session_expiry). The audit record names its owner, never its id.
func (r *reporter) session(event, owner string, who origin) {
	r.m.sessionEvents.WithLabelValues(event).Inc()
	r.record("session_"+event, "", 0, owner, "ok", who)
}

// keptAlive: a session was kept alive, holding leases leases.
func (r *reporter) keptAlive(leases int) { r.m.sessionLeases.Observe(float64(leases)) }

// handedOver: a lease ended with its resource granted to the head waiter.
func (r *reporter) handedOver(resource string, d time.Duration) {
	r.m.handovers.Inc()
	r.m.handoverTime.Observe(d.Seconds())
	r.record("handover", resource, 0, "", "granted", origin{})
}

// cancelled: a cancel released the request's lease, dequeued its waiter,
// or found neither.
func (r *reporter) cancelled(resource string, released, dequeued bool, who origin) {
	outcome := "nothing"
	switch {
	case released:
		outcome = "released"
	case dequeued:
		outcome = "dequeued"
	}
	r.record("cancel", resource, 0, "", outcome, who)
}

func (r *reporter) conflict() { r.m.conflicts.Inc() }

// refusedReply: a request named a reply subject the service must not
// publish on, or none (its outcome could reach nobody), and was dropped
// unexecuted.
func (r *reporter) refusedReply(op, subject string) {
	if subject == "" {
		r.m.refused.WithLabelValues(op, "no_reply").Inc()
		return
	}
	r.m.refused.WithLabelValues(op, "reply_subject").Inc()
	if r.warnings.Allow() {
		r.log.Warn("request dropped: its reply subject is one the service never publishes on", "op", op, "reply", subject)
	}
}

// foreign: a value that is not a jetlock record was seen at key.
func (r *reporter) foreign(key string, rev uint64, err error) {
	r.m.foreign.Inc()
	if r.warnings.Allow() {
		r.log.Warn("value in the bucket that jetlock did not write: it is nobody's lease", "key", key, "rev", rev, "err", err)
	}
}

// request: a request was answered with code ("" for success) d after its
// receipt.
func (r *reporter) request(op, code string, d time.Duration) { r.m.observe(op, code, d) }

// shed: a request was answered unavailable by the gate after waiting.
func (r *reporter) shed(op, reason string, waited time.Duration) {
	r.m.shedCount.WithLabelValues(op, reason).Inc()
	r.m.observe(op, "unavailable", waited)
}

// touched: a request named resource.
func (r *reporter) touched(resource string) { r.hot.touch(resource) }

// commit: a write to the bucket took d.
func (r *reporter) commit(op string, d time.Duration) {
	r.m.commitTime.WithLabelValues(op).Observe(d.Seconds())
}

// limited: a request was refused for fair use.
func (r *reporter) limited(scope string) { r.m.rateLimited.WithLabelValues(scope).Inc() }
