package streams

import (
	"bytes"
	"strconv"
)

// A semaphore's permits live at keys of their own ("name#k"), apart from
// the name's lease key. So that a name is one thing at a time in the
// bucket itself, and not only in a service instance's view, every grant
// of a permit writes, in the same atomic batch, the semaphore's name
// record at the name's lease key (LeaseKey(name)):
//
//	{"semaphore_limit":N}
//
// A lock, a lock-set member or an election writes that same key when it
// is granted, by compare-and-set on the revision it read. So a grant of a
// permit and a grant of a lock on one name (or two permits of different
// limits) compare-and-set one key, and only one of them commits. A name
// record is nobody's lease: it stays while the semaphore is used, and a
// grant of another kind or limit (or the service's sweep, once the
// semaphore has been idle for the retry window) deletes it once every
// permit of its limit is proven free (see the service's name rule).

// nameRecordPrefix is how every name record begins.
const nameRecordPrefix = `{"semaphore_limit":`

// AppendNameRecord appends the name record of a semaphore of limit to b.
func AppendNameRecord(b []byte, limit int) []byte {
	b = append(b, nameRecordPrefix...)
	b = strconv.AppendInt(b, int64(limit), 10)
	return append(b, '}')
}

// ParseNameRecord returns the limit of the semaphore whose name record b
// is, or false when b is not exactly a name record with a limit in
// [1, MaxLimit] (as AppendNameRecord writes it).
func ParseNameRecord(b []byte) (int, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(nameRecordPrefix))
	if !ok {
		return 0, false
	}
	digits, ok := bytes.CutSuffix(rest, []byte("}"))
	if !ok || len(digits) == 0 || len(digits) > 4 || digits[0] == '0' {
		return 0, false
	}
	n, err := strconv.Atoi(string(digits))
	if err != nil || n < 1 || n > MaxLimit {
		return 0, false
	}
	return n, true
}
