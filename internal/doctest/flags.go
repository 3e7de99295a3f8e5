package doctest

import (
	"regexp"
	"slices"
	"strings"
)

// assignRE matches an environment assignment before a command.
var assignRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// Invocation is one command of a script that runs a named program.
type Invocation struct {
	Line  int      // of the script, counted from 1
	Name  string   // the program
	Args  []string // the words after it that are not flags, up to "--"
	Flags []string // its long flags, without "--" and "=value"
}

// Invocations returns the commands of script that run one of names, with
// their long flags, so that a test can check them against the program's
// --help, in blocks that cannot run too. It reads words, not shell: a
// command starts a line or follows |, &&, || or ;, a line ending in a
// backslash goes on on the next, a word starting with # ends the line,
// quotes group words, and the words after "--" belong to another command.
func Invocations(script string, names ...string) []Invocation {
	var invs []Invocation
	lines := strings.Split(script, "\n")
	for i := 0; i < len(lines); i++ {
		first, line := i, lines[i]
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + lines[i]
		}
		cur, start := -1, true // cur: the index in invs of the command being read
		for _, w := range words(line) {
			if !w.op && strings.HasPrefix(w.text, "#") {
				break // a comment
			}
			switch {
			case w.op:
				cur, start = -1, true
			case start && assignRE.MatchString(w.text):
				// NAME=value before a command
			case start:
				start = false
				if slices.Contains(names, w.text) {
					invs = append(invs, Invocation{Line: first + 1, Name: w.text})
					cur = len(invs) - 1
				}
			case cur < 0:
			case w.text == "--":
				cur = -1
			case strings.HasPrefix(w.text, "--"):
				name, _, _ := strings.Cut(w.text[2:], "=")
				invs[cur].Flags = append(invs[cur].Flags, name)
			case !strings.HasPrefix(w.text, "-"):
				invs[cur].Args = append(invs[cur].Args, w.text)
			}
		}
	}
	return invs
}

// word is a word of a command line, or an operator between commands.
type word struct {
	text string
	op   bool
}

// words splits a line into words at blanks outside quotes, with |, &&,
// || and ; outside quotes as operators of their own. Quotes are removed.
func words(line string) []word {
	var (
		out   []word
		sb    strings.Builder
		quote rune
		in    bool // a word has started
	)
	flush := func() {
		if in {
			out = append(out, word{text: sb.String()})
			sb.Reset()
			in = false
		}
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				sb.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t':
			flush()
		case r == '|' || r == ';' || (r == '&' && i+1 < len(rs) && rs[i+1] == '&'):
			flush()
			op := string(r)
			if r != ';' && i+1 < len(rs) && rs[i+1] == r {
				op += string(r)
				i++
			}
			out = append(out, word{text: op, op: true})
		default:
			sb.WriteRune(r)
			in = true
		}
	}
	flush()
	return out
}
