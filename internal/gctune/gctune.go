// Package gctune sets the garbage collector's target of the jetlock
// service's processes: lockd, and the bench's service process, so that
// the bench measures what lockd runs.
package gctune

import "runtime/debug"

// Percent is the garbage collector's target set when the environment sets
// no GOGC. Most of the service's heap lives long: the leases and what the
// retry window remembers of every release. With Go's default of 100 the
// heap grows to twice that before each collection; 50 trades a few percent
// of CPU per operation for about a quarter less memory (docs/capacity.md
// has the measurements). GOGC in the environment, which the Go runtime
// reads itself, always wins; GOMEMLIMIT applies as well.
const Percent = 50

// Apply sets Percent unless lookup (os.LookupEnv) finds GOGC, and reports
// whether it did.
func Apply(lookup func(string) (string, bool)) bool {
	if _, set := lookup("GOGC"); set {
		return false
	}
	debug.SetGCPercent(Percent)
	return true
}
