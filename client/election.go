package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetlock/jetlock/streams"
)

// Elections. An election is a lock whose lease carries a value: the
// candidates queue for the lock in FIFO order (Campaign), the holder is
// the leader and announces itself with its value (Proclaim), and whoever
// wants to know who leads reads the holder (Leader) or follows the
// service's events (Observe). Like etcd's concurrency.Election, with a
// fencing token per leadership and a loss signal that fires before anyone
// else could become leader.

var (
	// ErrNoLeader: the election has no leader (Election.Leader).
	ErrNoLeader = errors.New("jetlock: election has no leader")
	// ErrNotLeader: Election.Proclaim without a leadership won by this
	// Election's Campaign, or after it was lost or resigned.
	ErrNotLeader = errors.New("jetlock: not the leader")
)

// Election is one election, named like a resource. Make one per
// candidate (NewElection) and Campaign with it; an Election that only
// reads (Leader, Observe) campaigns for nothing. It is safe for
// concurrent use.
type Election struct {
	c    *Client
	sess *Session // nil: leaderships of their own, renewed by themselves
	name string
	opts []AcquireOption

	mu     sync.Mutex
	leader *Leadership // the leadership Campaign won last, until resigned
}

// NewElection returns the election name (a valid resource name). opts
// apply to every Campaign: TTL (the leadership's TTL: how long a leader
// that vanished keeps the election before the next candidate takes over),
// Owner, MaxHold (a leader steps down at the hold cap), Wait (how long
// Campaign waits at most) and RequestID (a campaign retried with the same
// id after a restart finds its leadership; do not reuse it for a new
// campaign after Resign, which it would find ended). Invalid options
// return an error wrapping ErrInvalidOption; an invalid name, one
// wrapping ErrInvalidOption and ErrInvalidRequest.
//
// The election's name is its lock's resource: do not lock it by other
// means. Its value and leader are shown to every caller who may send
// status (Election.Leader): do not put secrets in a value.
func (c *Client) NewElection(name string, opts ...AcquireOption) (*Election, error) {
	return newElection(c, nil, name, opts)
}

// NewElection returns the election name for the session: its leaderships
// live as long as the session (see Session.Acquire) and end with it. The
// TTL option is refused (ErrInvalidOption).
func (s *Session) NewElection(name string, opts ...AcquireOption) (*Election, error) {
	return newElection(s.c, s, name, opts)
}

func newElection(c *Client, s *Session, name string, opts []AcquireOption) (*Election, error) {
	if err := streams.ValidateResource(name); err != nil {
		return nil, optionError("election "+name, err)
	}
	ao, err := readAcquireOptions(opts)
	if err != nil {
		return nil, err
	}
	if s != nil && ao.ttl != 0 {
		return nil, fmt.Errorf("%w: TTL with a session: a session's lease lives as long as its session (set SessionTTL instead)", ErrInvalidOption)
	}
	return &Election{c: c, sess: s, name: name, opts: opts}, nil
}

// optionError is an invalid input the client refuses before sending
// anything, said by what and caused by a contract validator's err: it
// matches ErrInvalidOption and, as the service would answer it,
// ErrInvalidRequest.
func optionError(what string, err error) error {
	detail := what + ": " + trimWords(err.Error(), ErrInvalidRequest)
	inner := &wrapped{sentinel: ErrInvalidRequest, cause: err, text: detail}
	return &wrapped{sentinel: ErrInvalidOption, cause: inner, text: ErrInvalidOption.Error() + ": " + detail}
}

// checkValue checks a candidate's value: 1 to 1024 bytes of UTF-8 text
// without control characters.
func checkValue(value string) error {
	if value == "" {
		return optionError("election value", fmt.Errorf("%w: value is required: a candidate announces itself with it", streams.ErrInvalid))
	}
	if err := streams.ValidateValue(value); err != nil {
		return optionError("election value", err)
	}
	return nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Leadership is a won election: the lease of the election's lock, whose
// Token is the leader's fencing token (strictly larger than every earlier
// leader's) and whose Lost closes when the client can no longer prove
// that it leads, before the service could elect anyone else (see Lease).
// Pass Token with every write the leader makes to what it leads, and let
// that resource refuse smaller tokens (package fence): that, not Lost, is
// what stops a leader that was paused past its TTL.
type Leadership struct {
	*Lease
	e *Election
}

// Campaign stands for election with value (1 to 1024 bytes of UTF-8 text
// without control characters, shown to everyone: an address, a host
// name) and waits in the election's FIFO queue until it is elected, ctx
// ends (then nothing is left queued or granted, and it returns ctx.Err())
// or the Wait option's bound passes (a *HeldError, matching ErrLocked).
// A long wait is a sequence of waiting acquires with the same request id,
// as Client.Acquire's.
//
// When this Election already leads (a Leadership that Campaign returned,
// not lost or resigned), Campaign returns it, after proclaiming value if
// it differs.
// Concurrent Campaigns of one Election are candidates of their own, and
// Proclaim and Resign act on the leadership won last: use one Election
// per candidate.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if err := checkValue(value); err != nil {
		return nil, err
	}
	if ld := e.current(); ld != nil {
		if ld.Value() == value {
			return ld, nil
		}
		if err := ld.Proclaim(ctx, value); !errors.Is(err, ErrLeaseLost) {
			if err != nil {
				return nil, err
			}
			return ld, nil
		}
		// Lost meanwhile: campaign anew.
	}
	read := func() (acquireOptions, error) {
		ao, err := readAcquireOptions(e.opts)
		ao.value = value
		return ao, err
	}
	do := func(ctx context.Context, ao acquireOptions) (*Lease, error) { return e.c.acquire(ctx, e.name, ao) }
	var l *Lease
	var err error
	if e.sess != nil {
		l, err = e.sess.acquire(ctx, read, do)
	} else {
		var ao acquireOptions
		if ao, err = read(); err == nil {
			l, err = do(ctx, ao)
		}
	}
	if err != nil {
		return nil, err
	}
	ld := &Leadership{Lease: l, e: e}
	e.mu.Lock()
	e.leader = ld
	e.mu.Unlock()
	return ld, nil
}

// current returns the leadership Campaign won last while it is not lost.
func (e *Election) current() *Leadership {
	e.mu.Lock()
	ld := e.leader
	e.mu.Unlock()
	if ld == nil || ld.Lease.life.check() || (ld.sess != nil && ld.sess.life.check()) {
		return nil
	}
	return ld
}

// Proclaim replaces the value of the leadership Campaign won last,
// without a new election (the token stays): see Leadership.Proclaim. It
// returns an error wrapping ErrNotLeader when this Election does not lead.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	ld := e.current()
	if ld == nil {
		return fmt.Errorf("%w of election %s", ErrNotLeader, e.name)
	}
	return ld.Proclaim(ctx, value)
}

// Resign ends the leadership Campaign won last (see Leadership.Resign).
// It returns nil when this Election does not lead.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	ld := e.leader
	e.mu.Unlock()
	if ld == nil {
		return nil
	}
	return ld.Resign(ctx)
}

// Election returns the election the leadership is of.
func (ld *Leadership) Election() *Election { return ld.e }

// Value returns the leader's value: Campaign's, or the last one Proclaim
// set.
func (ld *Leadership) Value() string {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.value
}

// Proclaim replaces the leader's value (1 to 1024 bytes, as Campaign's)
// without a new election: the token stays, and observers see a
// "proclaimed" change. It renews the leadership as well (one held in a
// session changes its value only: the session keeps it). When the service
// refuses it because the leadership has ended, Lost closes and Proclaim
// returns an error wrapping ErrLeaseLost; ErrUnavailable means the value
// may or may not have been replaced (Proclaim again: it is idempotent).
func (ld *Leadership) Proclaim(ctx context.Context, value string) error {
	if err := checkValue(value); err != nil {
		return err
	}
	l := ld.Lease
	l.checkLost()
	select {
	case <-l.life.lost:
		return wrapErr(ErrLeaseLost, fmt.Errorf("proclaim: %w", context.Cause(l.life.ctx)))
	default:
	}
	req := streams.RenewRequest{Resource: l.resource, LeaseID: l.id, Value: value}
	if l.sess == nil {
		req.TTLms = l.want.Milliseconds()
	}
	var resp streams.LeaseResponse
	var sent time.Time
	err := l.c.retry(ctx, func() error {
		sent = time.Now()
		return l.c.call(ctx, streams.OpRenew, &req, &resp, 0)
	})
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			l.life.markLost(wrapErr(ErrLeaseLost, fmt.Errorf("proclaim refused: %w", err)))
		}
		return err
	}
	if resp.Token != l.token {
		return fmt.Errorf("%w: proclaim: reply has token %d, the leadership %d", ErrInternal, resp.Token, l.token)
	}
	if l.sess == nil {
		// A leadership of its own is renewed too; one held in a session
		// changes its value only, and lives as its session does.
		l.life.setDeadline(sent, time.Duration(resp.TTLms)*time.Millisecond)
	}
	l.recordReply(&resp)
	l.mu.Lock()
	l.value = value
	l.mu.Unlock()
	return nil
}

// Resign ends the leadership: Lost closes at once, and the service hands
// the election to the next candidate in the same write that ends this
// one (see Lease.Release, whose errors it returns).
func (ld *Leadership) Resign(ctx context.Context) error {
	err := ld.Release(ctx)
	ld.e.mu.Lock()
	if ld.e.leader == ld {
		ld.e.leader = nil
	}
	ld.e.mu.Unlock()
	return err
}

// LeaderInfo is an election's leader as the service sees it.
type LeaderInfo struct {
	// Value is the leader's value.
	Value string
	// Token is the leader's fencing token.
	Token uint64
	// Owner is the leader's owner text, shown only to the NATS user that
	// holds the leadership and to operators (see Status).
	Owner string
	// ExpiresAt is the service's view of the leadership's expiry.
	ExpiresAt time.Time
	// InSession is true when a session holds the leadership.
	InSession bool
}

// Leader returns the election's current leader, or an error wrapping
// ErrNoLeader when there is none. It is a status read, as Client.Status
// is: never decide from it that you lead (hold a Leadership), nor that a
// leader's writes may be accepted (fence them with its token).
func (e *Election) Leader(ctx context.Context) (*LeaderInfo, error) {
	st, err := e.status(ctx)
	if err != nil {
		return nil, err
	}
	if !st.Held {
		return nil, fmt.Errorf("%w: %s", ErrNoLeader, e.name)
	}
	return &LeaderInfo{Value: st.Value, Token: st.Token, Owner: st.Owner, ExpiresAt: parseTime(st.ExpiresAt), InSession: st.InSession}, nil
}

func (e *Election) status(ctx context.Context) (*streams.StatusResponse, error) {
	var resp streams.StatusResponse
	err := e.c.retry(ctx, func() error {
		return e.c.call(ctx, streams.OpStatus, &streams.StatusRequest{Resource: e.name}, &resp, 0)
	})
	if err != nil {
		return nil, err
	}
	return &resp, nil
}

// LeaderChange is a change of an election's leader, as Observe sees it.
type LeaderChange struct {
	// Leader is false when the election has no leader: the one of Token
	// ended (Token 0: none was seen).
	Leader bool
	// Token is the leader's fencing token (or the ended leader's).
	Token uint64
	// Value is the leader's value; "" without a leader.
	Value string
	// Event is what changed: streams.EventElected (a new leader),
	// streams.EventProclaimed (the leader's new value) or
	// streams.EventEnded (no leader now).
	Event string
	// Revision is the bucket revision of the write that made the change,
	// when an event told it; 0 when a status read found it.
	Revision uint64
	// Resync is true when a status read found the change rather than an
	// event (Observe's first change, and after events were missed): what
	// happened in between was not seen.
	Resync bool
}

// Observe follows the election's leader: the channel first gets the
// current state (a status read: the leader, or no leader), then every
// change as it happens, in order, until ctx ends or the connection is
// closed; then it is closed, and its goroutine has ended or is about to.
// It never goes back: a change older than one delivered is dropped, and an
// event whose order against a status read cannot be told (a read gives no
// revision for the leader's value) waits for the next read to decide.
//
// The changes come from the service's events (plain NATS subscription to
// streams.EventSubject(prefix, name): the connection's user must be
// allowed to subscribe to it), ordered by their bucket revision; older
// and repeated events are dropped. Events are at most once: one lost (a
// reconnect, a slow consumer, a service instance that died between its
// write and its publish) is made up for by a status read, which Observe
// does every few seconds and at once after a sign of a gap (a reconnect,
// messages dropped, an event about a leader it never saw); such a change
// has Resync set, and what happened in between is not seen. So the
// channel converges on the leader; it is not a log of every leadership.
//
// The channel is never blocked by a slow reader for long: up to 1024
// changes wait for the reader, beyond that the oldest are dropped. Read
// it promptly. Observe is for display and for following a leader's value
// (its address); whether a leader's writes are accepted is decided by
// fencing with its token, never by what an observer saw.
func (e *Election) Observe(ctx context.Context) <-chan LeaderChange {
	out := make(chan LeaderChange)
	msgs := make(chan *nats.Msg, observeBuffer)
	sub, err := e.c.nc.ChanSubscribe(streams.EventSubject(e.c.opts.prefix, e.name), msgs)
	if err != nil {
		close(out)
		return out
	}
	o := &observer{e: e, sub: sub, msgs: msgs, out: out}
	go o.run(ctx)
	return out
}

// Observe's timings.
const (
	observeBuffer = 1024
	// observeResync is how often Observe reads the status when nothing
	// suggests a gap.
	observeResync = 5 * time.Second
	// observeCheck is how often it looks for signs of a gap that come
	// with no event: a reconnect, messages dropped.
	observeCheck = 500 * time.Millisecond
	// observeSoon is how soon it reads again after a read that events
	// overtook, or after a sign of a gap.
	observeSoon = 100 * time.Millisecond
)

// observer is one Observe: the state it delivered last, and the changes
// the reader has not taken yet.
type observer struct {
	e    *Election
	sub  *nats.Subscription
	msgs chan *nats.Msg
	out  chan LeaderChange

	held  bool
	token uint64
	value string
	rev   uint64 // revision of the last change applied
	// revKnown is false while the state comes from a status read, which
	// tells the leader's token but not the revision of its value: an event
	// about the same leader with another value may then be older or newer
	// than it. Such an event waits in pending until a status read decides.
	revKnown bool
	pending  *LeaderChange

	queue []LeaderChange
}

func (o *observer) run(ctx context.Context) {
	defer close(o.out)
	defer func() { _ = o.sub.Unsubscribe() }()
	// The subscription must reach the server before the first status
	// read, or a change between the two could be missed until the next.
	_ = o.e.c.nc.FlushWithContext(ctx)
	reconnects, dropped := o.e.c.nc.Stats().Reconnects, 0
	var resyncIn time.Duration
	for {
		var ok bool
		if resyncIn, ok = o.resync(ctx, true); ok {
			break
		}
		if o.e.c.nc.IsClosed() {
			return // no read can succeed any more
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	resync := time.NewTimer(resyncIn)
	defer resync.Stop()
	check := time.NewTicker(observeCheck)
	defer check.Stop()
	for {
		var send chan LeaderChange
		var next LeaderChange
		if len(o.queue) > 0 {
			send, next = o.out, o.queue[0]
		}
		select {
		case <-ctx.Done():
			return
		case send <- next:
			o.queue = o.queue[1:]
		case m := <-o.msgs:
			if o.event(m) {
				resync.Reset(observeSoon)
			}
		case <-check.C:
			if o.e.c.nc.IsClosed() {
				return
			}
			r := o.e.c.nc.Stats().Reconnects
			d, _ := o.sub.Dropped()
			if r != reconnects || d != dropped {
				reconnects, dropped = r, d
				resync.Reset(observeSoon)
			}
		case <-resync.C:
			in, ok := o.resync(ctx, false)
			if ctx.Err() != nil {
				return
			}
			if !ok {
				in = time.Second // no answer: try again
			}
			resync.Reset(in)
		}
	}
}

// resync applies the events that have arrived, reads the status and
// applies what it finds (see apply), and returns when to read again; false
// when the read failed. The first read (first) is delivered whatever it
// finds.
func (o *observer) resync(ctx context.Context, first bool) (time.Duration, bool) {
	for !first && len(o.msgs) > 0 {
		o.event(<-o.msgs)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*o.e.c.opts.requestTimeout)
	st, err := o.e.status(rctx)
	cancel()
	if err != nil {
		return 0, false
	}
	// Events that arrived during the read may be older or newer than
	// what it found: a difference it cannot order is read again soon.
	return o.apply(st, first, len(o.msgs) > 0), true
}

// apply applies a status read st, and returns when to read again.
// overtaken says that events arrived during the read.
func (o *observer) apply(st *streams.StatusResponse, first, overtaken bool) time.Duration {
	if first {
		o.held, o.token, o.value, o.revKnown, o.pending = st.Held, st.Token, st.Value, false, nil
		if st.Held {
			o.rev = st.Token // the grant's revision: the value's is unknown
			o.deliver(LeaderChange{Leader: true, Token: st.Token, Value: st.Value, Event: streams.EventElected, Resync: true})
		} else {
			o.token = 0
			o.deliver(LeaderChange{Event: streams.EventEnded, Resync: true})
		}
		if overtaken {
			return observeSoon
		}
		return observeResync
	}
	switch {
	case st.Held && st.Token > o.token:
		// A leader newer than any seen: certain, whatever overtook it.
		o.held, o.token, o.value, o.rev, o.revKnown, o.pending = true, st.Token, st.Value, max(o.rev, st.Token), false, nil
		o.deliver(LeaderChange{Leader: true, Token: st.Token, Value: st.Value, Event: streams.EventElected, Resync: true})
	case st.Held && st.Token == o.token && o.held && st.Value != o.value:
		if overtaken {
			return observeSoon
		}
		o.value = st.Value
		if p := o.pending; p != nil && p.Token == st.Token && p.Value == st.Value {
			// The read confirms the event that waited: it is the
			// current value, and its revision orders what follows.
			o.rev, o.revKnown = max(o.rev, p.Revision), true
			o.deliver(*p)
		} else {
			o.deliver(LeaderChange{Leader: true, Token: st.Token, Value: st.Value, Event: streams.EventProclaimed, Resync: true})
		}
		o.pending = nil
	case !st.Held && o.held:
		if overtaken {
			return observeSoon
		}
		o.held, o.value, o.pending = false, "", nil
		o.deliver(LeaderChange{Token: o.token, Event: streams.EventEnded, Resync: true})
	default:
		if !overtaken {
			// The read found the value already delivered: an event that
			// waited with another value was older.
			o.pending = nil
		}
	}
	return observeResync
}

// event applies one event, and reports whether it suggests that events
// were missed (a leader it never saw).
func (o *observer) event(m *nats.Msg) (gap bool) {
	var ev streams.ElectionEvent
	if json.Unmarshal(m.Data, &ev) != nil || ev.Resource != o.e.name || ev.Token == 0 || ev.Revision < o.rev {
		return false // not an event of this election, or older than the state
	}
	switch ev.Event {
	case streams.EventElected, streams.EventProclaimed:
		if ev.Token < o.token || (ev.Token == o.token && !o.held) {
			return false // an earlier leader's, or one that has ended
		}
		elected := !o.held || ev.Token != o.token
		if !elected && !o.revKnown {
			// The value came from a status read, whose revision is
			// unknown: this event may be older than it. A repeat of it
			// changes nothing; another value waits for a read to decide.
			if ev.Value != o.value && (o.pending == nil || ev.Revision > o.pending.Revision) {
				o.pending = &LeaderChange{Leader: true, Token: ev.Token, Value: ev.Value, Event: streams.EventProclaimed, Revision: ev.Revision}
				return true
			}
			return false
		}
		o.rev, o.revKnown, o.pending = ev.Revision, true, nil
		if !elected && ev.Value == o.value {
			return false // a repeat
		}
		o.held, o.token, o.value = true, ev.Token, ev.Value
		kind := streams.EventProclaimed
		if elected {
			kind = streams.EventElected
		}
		o.deliver(LeaderChange{Leader: true, Token: ev.Token, Value: ev.Value, Event: kind, Revision: ev.Revision})
		// A proclaim of a leader whose election was not seen: missed.
		return elected && ev.Event == streams.EventProclaimed
	case streams.EventEnded:
		if ev.Token < o.token || (ev.Token == o.token && !o.held) {
			return false
		}
		gap = ev.Token != o.token // the end of a leader never seen
		was := o.held
		o.held, o.token, o.value, o.rev, o.revKnown, o.pending = false, ev.Token, "", ev.Revision, true, nil
		if was {
			o.deliver(LeaderChange{Token: ev.Token, Event: streams.EventEnded, Revision: ev.Revision})
		}
		return gap
	}
	return false
}

// deliver queues a change for the reader, dropping the oldest beyond
// observeBuffer.
func (o *observer) deliver(ch LeaderChange) {
	if len(o.queue) >= observeBuffer {
		o.queue = o.queue[1:]
	}
	o.queue = append(o.queue, ch)
}
