package load

import (
	"regexp"
	"sort"
	"sync"
)

// The messages of the errors a run was answered, a few of each code, so
// that a report can say why ("unavailable" is answered for an overload, a
// store that did not answer in time, a conflict that outlived its
// retries...). Numbers in a message are masked, so that one cause counts
// once however its figures vary.
var samples = struct {
	sync.Mutex
	by map[string]map[string]int64
}{by: map[string]map[string]int64{}}

// maxSampleKinds bounds the distinct messages kept for one code; later
// kinds are counted under "other".
const maxSampleKinds = 8

var digits = regexp.MustCompile(`[0-9]+(\.[0-9]+)?(ms|s|µs)?`)

// noteError counts msg, an error message answered with code.
func noteError(code, msg string) {
	msg = digits.ReplaceAllString(msg, "N")
	samples.Lock()
	defer samples.Unlock()
	m := samples.by[code]
	if m == nil {
		m = map[string]int64{}
		samples.by[code] = m
	}
	if _, ok := m[msg]; !ok && len(m) >= maxSampleKinds {
		msg = "other"
	}
	m[msg]++
}

// ErrorSample is one kind of error message and how often it was answered.
type ErrorSample struct {
	Message string `json:"message"`
	Count   int64  `json:"count"`
}

// ErrorSamples returns, by code, the kinds of error message answered so
// far, the most frequent first.
func ErrorSamples() map[string][]ErrorSample {
	samples.Lock()
	defer samples.Unlock()
	out := map[string][]ErrorSample{}
	for code, m := range samples.by {
		for msg, n := range m {
			out[code] = append(out[code], ErrorSample{Message: msg, Count: n})
		}
		sort.Slice(out[code], func(i, j int) bool { return out[code][i].Count > out[code][j].Count })
	}
	return out
}
