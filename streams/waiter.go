package streams

import "strconv"

// Waiter is a waiter record as the bucket holds it, at key
// WaitKey(resource, request hash): a waiting acquire's place in the
// resource's queue. Its fields have names of their own rather than the
// lease record's: the ticket orders the queue, the liveness window is how
// long the record lasts unrefreshed, and what the acquire asked for lets
// whoever ends the lease before it grant it in the same write.
//
// The service keeps a waiter in memory as a Record (WaiterOf and
// Waiter.Record convert): Token is the ticket, TTLms the liveness window,
// GrantedAt when it queued and RenewedAt when it was last refreshed.
type Waiter struct {
	Owner     string `json:"owner,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	RequestID string `json:"request_id"`
	// Ticket is 0 in the write that queued the waiter, meaning "the
	// revision of this write"; every refresh copies that revision in.
	Ticket      uint64 `json:"ticket"`
	QueuedAt    string `json:"queued_at"`
	LivenessMs  int64  `json:"liveness_ms"`
	RefreshedAt string `json:"refreshed_at"`
	ExpiresAt   string `json:"expires_at"`
	Wake        string `json:"wake"`
	LeaseTTLms  int64  `json:"lease_ttl_ms,omitzero"`
	MaxHoldMs   int64  `json:"max_hold_ms,omitzero"`
	// Session is the key hash of the session whose wait this is.
	Session string `json:"session,omitempty"`
	// Set and SetSize are the lock set the wait is for (see Record).
	Set     string `json:"set,omitempty"`
	SetSize int    `json:"set_size,omitzero"`
	// Limit and Value are what the waiting acquire asked for (a semaphore,
	// an election's value).
	Limit int    `json:"limit,omitzero"`
	Value string `json:"value,omitempty"`
}

// WaiterOf returns the bucket form of r, a waiter held as a Record.
func WaiterOf(r *Record) *Waiter {
	return &Waiter{Owner: r.Owner, Tenant: r.Tenant, RequestID: r.RequestID, Ticket: r.Token, QueuedAt: r.GrantedAt,
		LivenessMs: r.TTLms, RefreshedAt: r.RenewedAt, ExpiresAt: r.ExpiresAt, Wake: r.Wake,
		LeaseTTLms: r.LeaseTTLms, MaxHoldMs: r.MaxHoldMs, Session: r.Session, Set: r.Set, SetSize: r.SetSize,
		Limit: r.Limit, Value: r.Value}
}

// Record returns w as the service holds a waiter in memory.
func (w *Waiter) Record() *Record {
	return &Record{Owner: w.Owner, Tenant: w.Tenant, RequestID: w.RequestID, Token: w.Ticket, GrantedAt: w.QueuedAt,
		TTLms: w.LivenessMs, RenewedAt: w.RefreshedAt, ExpiresAt: w.ExpiresAt, Wake: w.Wake,
		LeaseTTLms: w.LeaseTTLms, MaxHoldMs: w.MaxHoldMs, Session: w.Session, Set: w.Set, SetSize: w.SetSize,
		Limit: w.Limit, Value: w.Value}
}

// AppendJSON appends w encoded as JSON to b.
func (w *Waiter) AppendJSON(b []byte) []byte {
	if w == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	if w.Owner != "" {
		b = append(appendField(b, `"owner":`, w.Owner), ',')
	}
	if w.Tenant != "" {
		b = append(appendField(b, `"tenant":`, w.Tenant), ',')
	}
	b = appendField(b, `"request_id":`, w.RequestID)
	b = strconv.AppendUint(append(b, `,"ticket":`...), w.Ticket, 10)
	b = appendField(b, `,"queued_at":`, w.QueuedAt)
	b = strconv.AppendInt(append(b, `,"liveness_ms":`...), w.LivenessMs, 10)
	b = appendField(b, `,"refreshed_at":`, w.RefreshedAt)
	b = appendField(b, `,"expires_at":`, w.ExpiresAt)
	b = appendField(b, `,"wake":`, w.Wake)
	if w.LeaseTTLms != 0 {
		b = strconv.AppendInt(append(b, `,"lease_ttl_ms":`...), w.LeaseTTLms, 10)
	}
	if w.MaxHoldMs != 0 {
		b = strconv.AppendInt(append(b, `,"max_hold_ms":`...), w.MaxHoldMs, 10)
	}
	if w.Session != "" {
		b = appendField(b, `,"session":`, w.Session)
	}
	if w.Set != "" {
		b = appendField(b, `,"set":`, w.Set)
		b = strconv.AppendInt(append(b, `,"set_size":`...), int64(w.SetSize), 10)
	}
	if w.Limit != 0 {
		b = strconv.AppendInt(append(b, `,"limit":`...), int64(w.Limit), 10)
	}
	if w.Value != "" {
		b = appendField(b, `,"value":`, w.Value)
	}
	return append(b, '}')
}
