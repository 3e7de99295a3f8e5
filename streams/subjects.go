package streams

// ServiceName is the micro service name jetlock registers under. It is fixed,
// so `nats micro ls|info|stats jetlock` always finds the service.
const ServiceName = "jetlock"

// DefaultPrefix is the default subject prefix of the request subjects.
const DefaultPrefix = "jetlock"

// QueueGroup is the queue group every service instance listens in, so that
// any number of instances share the load.
const QueueGroup = "jetlock"

// APIVersion is the version token of the request subjects.
const APIVersion = "v1"

// Operation names: what follows the version token of each request subject.
const (
	OpAcquire = "acquire"
	OpRenew   = "renew"
	OpRelease = "release"
	OpCancel  = "cancel"
	OpStatus  = "status"
	OpList    = "list"
	// OpRevoke lies under "admin.", so that permissions can keep it to
	// operators.
	OpRevoke = "admin.revoke"
)

// Operations lists every operation of the contract in a fixed order.
var Operations = []string{OpAcquire, OpRenew, OpRelease, OpCancel, OpStatus, OpList, OpRevoke,
	OpSessionOpen, OpSessionKeepalive, OpSessionClose}

// Subject returns the request subject of op under prefix, for example
// Subject("jetlock", OpAcquire) == "jetlock.v1.acquire".
func Subject(prefix, op string) string {
	return prefix + "." + APIVersion + "." + op
}

// Inbox prefixes of the service's two connections (see service.New). A
// deployment's permissions let each of the service's users subscribe only
// under its own prefix, and no other user under either, so that nobody
// else sees the replies they receive: a read of the bucket carries lease
// ids.
const (
	ServiceInboxPrefix = "_INBOX_jetlock_service"
	StoreInboxPrefix   = "_INBOX_jetlock_store"
)
