package doctest

import (
	"fmt"
	"regexp"
	"strings"
)

// Vars are the values captured by <name> placeholders of a block's
// expected output, by name.
type Vars map[string]string

// Pattern is one expected output line, compiled.
type Pattern struct {
	text  string
	re    *regexp.Regexp
	names []string // of the capture groups, in order
}

// placeholderRE finds the variable parts of an expected line: "…", a
// <name>, an RFC 3339 time.
var placeholderRE = regexp.MustCompile(`…|<([A-Za-z_][A-Za-z0-9_]*)>|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)`)

// valueRE is what an unbound <name> matches: a value without spaces,
// quotes, commas or brackets (an id, a token, a subject).
const valueRE = `[^\s"',{}\[\]]+`

// timeRE is what an RFC 3339 time in an expected line matches.
const timeRE = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)`

// Compile compiles an expected output line. The pattern matches an output
// line that contains it, where
//   - "…" stands for any text, possibly empty;
//   - <name> (letters, digits, "_") stands for a value without spaces,
//     quotes, commas or brackets and captures it: the block's later
//     commands have it in place of <name>, and a later <name> in the
//     expected output must be the same value (a name already in vars is
//     that value);
//   - an RFC 3339 time (2026-11-29T21:20:32.846Z) stands for any;
//   - every other character stands for itself.
func Compile(expected string, vars Vars) (*Pattern, error) {
	p := &Pattern{text: expected}
	var sb strings.Builder
	last := 0
	for _, m := range placeholderRE.FindAllStringSubmatchIndex(expected, -1) {
		sb.WriteString(regexp.QuoteMeta(expected[last:m[0]]))
		last = m[1]
		switch tok := expected[m[0]:m[1]]; {
		case tok == "…":
			sb.WriteString(`.*?`)
		case m[2] >= 0:
			name := expected[m[2]:m[3]]
			if v, ok := vars[name]; ok {
				sb.WriteString(regexp.QuoteMeta(v))
				continue
			}
			sb.WriteString("(" + valueRE + ")")
			p.names = append(p.names, name)
		default:
			sb.WriteString(timeRE)
		}
	}
	sb.WriteString(regexp.QuoteMeta(expected[last:]))
	re, err := regexp.Compile(sb.String())
	if err != nil {
		return nil, fmt.Errorf("expected line %q: %w", expected, err)
	}
	p.re = re
	return p, nil
}

// match reports whether line matches, and what it captured.
func (p *Pattern) match(line string) (Vars, bool) {
	m := p.re.FindStringSubmatch(line)
	if m == nil {
		return nil, false
	}
	got := Vars{}
	for i, name := range p.names {
		if v, ok := got[name]; ok && v != m[i+1] {
			return nil, false // one name, two values
		}
		got[name] = m[i+1]
	}
	return got, true
}

// Check checks output against the expected lines of a step: each must
// match a line of output, in order, below the line the one before it
// matched; output may have other lines too. The values captured are added
// to vars.
func Check(output string, expect []string, vars Vars) error {
	lines := strings.Split(output, "\n")
	at := 0
	for _, e := range expect {
		p, err := Compile(e, vars)
		if err != nil {
			return err
		}
		found := false
		for ; at < len(lines) && !found; at++ {
			if got, ok := p.match(lines[at]); ok {
				for k, v := range got {
					vars[k] = v
				}
				found = true
			}
		}
		if !found {
			return fmt.Errorf("no output line matches %q (in order, after the lines before)", e)
		}
	}
	return nil
}

// Substitute replaces every <name> of code whose name vars holds with its
// value; other text, unknown names included, is left as it is.
func Substitute(code string, vars Vars) string {
	if len(vars) == 0 {
		return code
	}
	return placeholderRE.ReplaceAllStringFunc(code, func(tok string) string {
		if strings.HasPrefix(tok, "<") {
			if v, ok := vars[tok[1:len(tok)-1]]; ok {
				return v
			}
		}
		return tok
	})
}
