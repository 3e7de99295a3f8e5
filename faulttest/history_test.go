package faulttest

import (
	"fmt"
	"sync"
	"time"

	"github.com/jetlock/jetlock/streams"
)

// Kind is the kind of a recorded operation.
type Kind uint8

// Operation kinds: the five requests of the contract on leases, a write
// to the fenced register, a client's own view of how long its lease is
// valid (for leases of the Go client, whose renewals are not recorded),
// the three requests on sessions, and an election event an observer
// received. An acquire made in a session is a KAcquire whose Session is
// set; a request on a lock set has Resources, one on a semaphore a Limit
// or a Permit, a campaign or a proclaim a Value.
const (
	KAcquire Kind = iota + 1
	KRenew
	KRelease
	KCancel
	KStatus
	KWrite
	KHeld
	KFault
	KOpen
	KKeepalive
	KClose
	KEvent
)

func (k Kind) String() string {
	return [...]string{"?", "acquire", "renew", "release", "cancel", "status", "write", "held", "fault",
		"open", "keepalive", "close", "event"}[k]
}

// Result is what the caller learnt of an operation.
type Result uint8

// Results. Unknown is an operation whose outcome the caller cannot know: no
// reply, or "unavailable"/"internal". It may have taken effect at any time
// after its invocation, or never.
const (
	Pending Result = iota
	OK
	Fail
	Unknown
)

func (r Result) String() string { return [...]string{"pending", "ok", "fail", "unknown"}[r] }

// Op is one recorded operation. Times are offsets from the history's start
// on the monotonic clock, shared by every actor in the process.
type Op struct {
	ID        int
	Client    int
	Kind      Kind
	Resource  string
	RequestID string
	// LeaseID is the lease renewed or released, or the lease an acquire
	// was granted.
	LeaseID string
	// TTL is the TTL asked for; on a granted acquire or renewal, the TTL
	// of the reply.
	TTL  time.Duration
	Wait time.Duration

	Invoke, Complete time.Duration
	Result           Result
	// Code is the error code of a failed operation, or why its outcome is
	// unknown.
	Code string
	// Token is the fencing token of a grant, renewal, status or write.
	Token uint64
	// Flag is released (release), cancelled (cancel), held (status) or
	// accepted (write).
	Flag bool
	// Deadline is, for a granted acquire or renewal and for KHeld, the
	// client's deadline: until then no other lease of the resource may be
	// granted. It defaults to Invoke + TTL.
	Deadline time.Duration
	// Retry marks an acquire (or open) whose request id was sent before.
	Retry bool
	// Session is the session id an open was answered with, or the session
	// a keepalive, a close or an acquire in a session names.
	Session string
	// Resources are the resources of a lock set that an acquire, renew,
	// release or cancel names, in the order sent; Members, of a granted
	// or renewed set, each resource and token the reply listed (of a
	// semaphore's status, each permit held, as "<sem>#<k>" and token).
	Resources []string
	Members   []streams.SetMember
	// Limit is the number of permits of the semaphore an acquire, cancel
	// or status names; Permit the permit a grant was answered with, or
	// that a renewal or release names.
	Limit, Permit int
	// Value is the value of a campaign (an acquire) or a proclaim (a
	// renewal), the value a status or an event showed.
	Value string
	// SetSize is the set_size a status showed.
	SetSize int
	// Event and Revision are an election event's kind and revision.
	Event    string
	Revision uint64
	Note     string
}

// label is the name of o's kind in counts and dumps: an acquire in a
// session is a "session-acquire", of a lock set in a session a
// "session-set-acquire", of a permit in a session a
// "session-permit-acquire".
func (o *Op) label() string {
	switch {
	case o.Kind == KAcquire && o.Session != "" && len(o.Resources) > 0:
		return "session-set-acquire"
	case o.Kind == KAcquire && o.Session != "" && o.Limit > 0:
		return "session-permit-acquire"
	case o.Kind == KAcquire && o.Session != "":
		return "session-acquire"
	case len(o.Resources) > 0:
		return "set-" + o.Kind.String()
	case o.Kind == KStatus && o.Limit > 0:
		return "semaphore-status"
	case o.Limit > 0 || o.Permit > 0:
		return "permit-" + o.Kind.String()
	case o.Kind == KAcquire && o.Value != "":
		return "campaign"
	case o.Kind == KRenew && o.Value != "":
		return "proclaim"
	case o.Kind == KEvent:
		return "event-" + o.Event
	}
	return o.Kind.String()
}

// defaultDeadline sets the client's deadline of an acknowledged grant,
// renewal, open or keepalive that has none: send time plus the TTL
// answered. An acquire in a session has none of its own: its lease is
// valid as long as the session is (see Check).
func defaultDeadline(o *Op) {
	if o.Result != OK || o.Deadline != 0 {
		return
	}
	switch {
	case o.Kind == KAcquire && o.Session == "", o.Kind == KRenew, o.Kind == KOpen, o.Kind == KKeepalive:
		o.Deadline = o.Invoke + o.TTL
	}
}

func (o *Op) String() string {
	s := fmt.Sprintf("#%d c%d %s %s", o.ID, o.Client, o.label(), o.Resource)
	if len(o.Resources) > 0 {
		s += fmt.Sprintf("%v", o.Resources)
	}
	if o.Limit != 0 {
		s += fmt.Sprintf(" limit=%d", o.Limit)
	}
	if o.Permit != 0 {
		s += fmt.Sprintf(" permit=%d", o.Permit)
	}
	if o.Session != "" {
		s += " session=" + short(o.Session)
	}
	if o.RequestID != "" {
		s += " req=" + o.RequestID
	}
	if o.LeaseID != "" {
		s += " lease=" + short(o.LeaseID)
	}
	s += fmt.Sprintf(" [%v, %v] %s", o.Invoke.Round(time.Millisecond), o.Complete.Round(time.Millisecond), o.Result)
	if o.Code != "" {
		s += "(" + o.Code + ")"
	}
	if o.Token != 0 {
		s += fmt.Sprintf(" token=%d", o.Token)
	}
	if len(o.Members) > 0 {
		s += " members="
		for i, m := range o.Members {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprintf("%s:%d", m.Resource, m.Token)
		}
	}
	if o.Revision != 0 {
		s += fmt.Sprintf(" revision=%d", o.Revision)
	}
	if o.Value != "" {
		s += fmt.Sprintf(" value=%q", o.Value)
	}
	if o.SetSize != 0 {
		s += fmt.Sprintf(" set_size=%d", o.SetSize)
	}
	switch o.Kind {
	case KRelease, KCancel, KStatus, KWrite, KClose:
		s += fmt.Sprintf(" flag=%v", o.Flag)
	}
	if o.Deadline != 0 {
		s += fmt.Sprintf(" until=%v", o.Deadline.Round(time.Millisecond))
	}
	if o.Note != "" {
		s += " " + o.Note
	}
	return s
}

func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// History records operations from many goroutines.
type History struct {
	start time.Time

	mu  sync.Mutex
	ops []*Op
}

// NewHistory starts an empty history.
func NewHistory() *History { return &History{start: time.Now()} }

// Now returns the current offset from the history's start.
func (h *History) Now() time.Duration { return time.Since(h.start) }

// At returns the offset of t from the history's start.
func (h *History) At(t time.Time) time.Duration { return t.Sub(h.start) }

// Begin records the invocation of op and returns the recorded operation,
// to be finished with End.
func (h *History) Begin(op Op) *Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ID = len(h.ops)
	op.Invoke = time.Since(h.start)
	op.Result = Pending
	p := &op
	h.ops = append(h.ops, p)
	return p
}

// End records the completion of op with result r; fill, when not nil, sets
// the other result fields.
func (h *History) End(op *Op, r Result, fill func(*Op)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	op.Complete = time.Since(h.start)
	op.Result = r
	if fill != nil {
		fill(op)
	}
	defaultDeadline(op)
}

// Event records a fault (for the post-mortem; checks ignore it).
func (h *History) Event(format string, args ...any) {
	if h == nil {
		return
	}
	op := h.Begin(Op{Client: -1, Kind: KFault, Note: fmt.Sprintf(format, args...)})
	h.End(op, OK, nil)
}

// Count returns how many operations have ended as key, a label and a
// result as Report.Counts names them ("acquire/ok").
func (h *History) Count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, p := range h.ops {
		if p.Result != Pending && p.label()+"/"+p.Result.String() == key {
			n++
		}
	}
	return n
}

// Ops returns a copy of the history. Operations still pending count as
// unknown.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Op, len(h.ops))
	for i, p := range h.ops {
		out[i] = *p
		if out[i].Result == Pending {
			out[i].Result = Unknown
			out[i].Code = "pending"
			out[i].Complete = time.Since(h.start)
		}
	}
	return out
}
