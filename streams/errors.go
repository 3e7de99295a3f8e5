package streams

import "github.com/nats-io/nats.go/micro"

// Error codes of the wire contract (the "code" field of an error reply).
const (
	CodeInvalidRequest = "invalid_request"
	CodeLocked         = "locked"
	CodeLeaseLost      = "lease_lost"
	CodeTooManyWaiters = "too_many_waiters"
	// CodeForbidden answers an admin request whose sender the NATS server
	// did not vouch for as one of the service's operators.
	CodeForbidden   = "forbidden"
	CodeUnavailable = "unavailable"
	CodeInternal    = "internal"
)

// Header names of the micro error convention, as nats.go's micro package
// names them.
const (
	HeaderErrorCode = micro.ErrorCodeHeader
	HeaderError     = micro.ErrorHeader
)

// StatusCode returns the numeric header code of an error code: 400, 403,
// 409, 410, 429, 503, or 500 for anything unknown.
func StatusCode(code string) int {
	switch code {
	case CodeInvalidRequest:
		return 400
	case CodeLocked:
		return 409
	case CodeLeaseLost:
		return 410
	case CodeTooManyWaiters:
		return 429
	case CodeForbidden:
		return 403
	case CodeUnavailable:
		return 503
	default:
		return 500
	}
}

// CodeForStatus is the inverse of StatusCode; unknown numbers map to
// CodeInternal.
func CodeForStatus(status int) string {
	switch status {
	case 400:
		return CodeInvalidRequest
	case 409:
		return CodeLocked
	case 410:
		return CodeLeaseLost
	case 429:
		return CodeTooManyWaiters
	case 403:
		return CodeForbidden
	case 503:
		return CodeUnavailable
	default:
		return CodeInternal
	}
}
