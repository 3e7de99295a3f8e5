package streams

import "strconv"

// Counting semaphores and elections.
//
// A semaphore is a resource with N permits (acquire with "limit":N): each
// permit is a lease of its own, at a key of its own (SemaphoreKey), with
// its own fencing tokens; its waiters share one FIFO queue (the queue of
// PermitQueue(resource)). An election is a lock whose lease carries a
// value (acquire, renew with "value"), whose changes the service publishes
// on EventSubject.

// Bounds of semaphores and values.
const (
	MaxLimit    = 1000
	MaxValueLen = 1024
)

// PermitResource returns the internal resource name of permit k of
// semaphore resource: "resource#k". '#' is not allowed in resource names,
// so no resource a caller names is ever a permit.
func PermitResource(resource string, k int) string { return resource + "#" + strconv.Itoa(k) }

// PermitQueue returns the internal resource name whose queue the waiters
// of semaphore resource share: "resource#".
func PermitQueue(resource string) string { return resource + "#" }

// SplitPermit returns the semaphore and permit of an internal permit
// resource name, and false for any other name.
func SplitPermit(name string) (resource string, k int, ok bool) {
	for i := len(name) - 1; i > 0; i-- {
		if name[i] == '#' {
			k, err := strconv.Atoi(name[i+1:])
			if err != nil || k < 1 || k > MaxLimit {
				return "", 0, false
			}
			return name[:i], k, true
		}
	}
	return "", 0, false
}

// EventSubject returns the subject on which the service publishes the
// changes of the elected lease of resource.
func EventSubject(prefix, resource string) string {
	return prefix + ".events." + EncodeResource(resource)
}

// Election events, in ElectionEvent.Event.
const (
	EventElected    = "elected"
	EventProclaimed = "proclaimed"
	EventEnded      = "ended"
)

// ElectionEvent is published when a lease with a value is granted, its
// value changes, or it ends. Revision is the bucket revision of the write
// that made the change: observers order events by it.
type ElectionEvent struct {
	Resource string `json:"resource"`
	Event    string `json:"event"`
	Token    uint64 `json:"token"`
	Value    string `json:"value,omitempty"`
	Revision uint64 `json:"revision"`
}

// PermitInfo is one held permit in a semaphore's status.
type PermitInfo struct {
	Permit    int    `json:"permit"`
	Owner     string `json:"owner,omitempty"`
	Token     uint64 `json:"token"`
	ExpiresAt string `json:"expires_at"`
}

// SemaphoreStatus answers a status request with a limit.
type SemaphoreStatus struct {
	Resource    string       `json:"resource"`
	Limit       int          `json:"limit"`
	HeldPermits int          `json:"held_permits"`
	Waiters     int          `json:"waiters"`
	Permits     []PermitInfo `json:"permits"`
}

// ValidateValue checks an election value.
func ValidateValue(v string) error { return validateText("value", v, MaxValueLen, false) }

func validateLimit(limit int) error {
	if limit < 0 || limit > MaxLimit {
		return invalidf("limit %d outside [1, %d]", limit, MaxLimit)
	}
	return nil
}

func validatePermit(permit int) error {
	if permit < 0 || permit > MaxLimit {
		return invalidf("permit %d outside [1, %d]", permit, MaxLimit)
	}
	return nil
}
