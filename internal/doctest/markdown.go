package doctest

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Block is one shell example of a markdown file.
type Block struct {
	File string // the name given to Parse
	Line int    // of the opening fence, counted from 1
	Lang string // sh, bash, shell or console

	Skip       string        // why the block is not run; empty: it runs
	ExpectExit int           // the status the block ends with; 0 unless marked
	Env        []string      // NAME=VALUE added to the block's environment
	Setup      []string      // shell run before the block, in its directory
	Files      []string      // repository paths copied into the block's directory first
	Timeout    time.Duration // for setup and block together; 0: the runner's default

	Steps []Step
}

// Step is a run of commands of a block and the output expected of them.
// A block without expected output is a single step.
type Step struct {
	Line   int      // of its first line, counted from 1
	Code   string   // the commands, as a shell script
	Expect []string // expected output lines (see Compile)
}

// Where names the block for messages: file:line.
func (b *Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// Script returns the block's commands as one script, for a syntax check.
func (b *Block) Script() string {
	var sb strings.Builder
	for _, s := range b.Steps {
		sb.WriteString(s.Code)
	}
	return sb.String()
}

// shellLangs are the info strings of the blocks Parse returns.
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// directiveRE matches a doctest directive comment, alone on its line.
var directiveRE = regexp.MustCompile(`^\s*<!--\s*doctest:(.*?)-->\s*$`)

// Parse returns the shell blocks of a markdown document, with the
// directives of the doctest comments above them (see the package comment).
// It returns an error for an unknown or malformed directive, a directive
// that no shell block follows, an unclosed fence, or an indented code
// block (which has no language, so no one could tell whether it is a
// shell example).
func Parse(file string, src []byte) ([]Block, error) {
	lines := strings.Split(strings.ReplaceAll(string(src), "\r\n", "\n"), "\n")
	var (
		blocks  []Block
		pending *Block // directives waiting for their block
		pendAt  int
		para    paragraphs
	)
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if para.indentedCode(line) {
			return nil, fmt.Errorf("%s:%d: indented code block: fence it with a language (```sh, or ```text for what is not a shell example), so that the documentation test sees it", file, i+1)
		}
		if m := directiveRE.FindStringSubmatch(line); m != nil {
			if pending == nil {
				pending, pendAt = &Block{}, i+1
			}
			if err := pending.directives(m[1]); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", file, i+1, err)
			}
			continue
		}
		indent, fence, info, ok := openFence(line)
		if !ok {
			if pending != nil && strings.TrimSpace(line) != "" {
				return nil, fmt.Errorf("%s:%d: doctest directive not directly above a code block", file, pendAt)
			}
			continue
		}
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			if isCloseFence(lines[i], fence) {
				closed = true
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		para.blank = false
		start := i - len(body) // the opening fence, counted from 1
		if !closed {
			return nil, fmt.Errorf("%s:%d: code block not closed", file, start)
		}
		lang := strings.ToLower(strings.Fields(info + " x")[0])
		if !shellLangs[lang] {
			if pending != nil {
				return nil, fmt.Errorf("%s:%d: doctest directive above a %q block, not a shell block", file, pendAt, lang)
			}
			continue
		}
		b := Block{}
		if pending != nil {
			b = *pending
		}
		b.File, b.Line, b.Lang = file, start, lang
		if lang == "console" {
			var err error
			if b.Steps, err = consoleSteps(body, start+1); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", file, start, err)
			}
		} else {
			b.Steps = shellSteps(body, start+1)
		}
		blocks = append(blocks, b)
		pending = nil
	}
	if pending != nil {
		return nil, fmt.Errorf("%s:%d: doctest directive not directly above a code block", file, pendAt)
	}
	return blocks, nil
}

// paragraphs follows the lines outside fenced blocks, to find indented
// code blocks: a line indented by four spaces or more after a blank line,
// outside a list (where such lines continue an item).
type paragraphs struct {
	blank  bool // the line before was blank
	inList bool
}

// listItemRE matches the first line of a list item.
var listItemRE = regexp.MustCompile(`^\s*([-*+]|\d+[.)])(\s|$)`)

// indentedCode reports whether line starts an indented code block.
func (p *paragraphs) indentedCode(line string) bool {
	if strings.TrimSpace(line) == "" {
		p.blank = true
		return false
	}
	rest := strings.TrimLeft(line, " ")
	indent := len(line) - len(rest)
	if strings.HasPrefix(rest, "\t") {
		indent += 4
	}
	code := indent >= 4 && p.blank && !p.inList
	switch {
	case listItemRE.MatchString(line):
		p.inList = true
	case indent == 0:
		p.inList = false
	}
	p.blank = false
	return code
}

// directives applies one comment's directives to b. A setup directive
// takes the rest of the comment, semicolons included.
func (b *Block) directives(text string) error {
	for text = strings.TrimSpace(text); text != ""; {
		name, rest, _ := strings.Cut(text, " ")
		if name == "setup" {
			if strings.TrimSpace(rest) == "" {
				return fmt.Errorf("doctest: setup needs a command")
			}
			b.Setup = append(b.Setup, strings.TrimSpace(rest))
			return nil
		}
		one, after, _ := strings.Cut(text, ";")
		text = strings.TrimSpace(after)
		name, arg, _ := strings.Cut(strings.TrimSpace(one), " ")
		arg = strings.TrimSpace(arg)
		switch name {
		case "skip":
			if arg == "" {
				return fmt.Errorf("doctest: skip needs a reason")
			}
			b.Skip = arg
		case "expect-exit":
			n, err := strconv.Atoi(arg)
			if err != nil || n < 0 || n > 255 {
				return fmt.Errorf("doctest: expect-exit %q: want a status 0-255", arg)
			}
			b.ExpectExit = n
		case "env":
			for _, kv := range strings.Fields(arg) {
				if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
					return fmt.Errorf("doctest: env %q: want NAME=VALUE", kv)
				}
				b.Env = append(b.Env, kv)
			}
			if arg == "" {
				return fmt.Errorf("doctest: env needs NAME=VALUE")
			}
		case "files":
			for _, f := range strings.Fields(arg) {
				if !filepath.IsLocal(f) {
					return fmt.Errorf("doctest: files %q: want a path inside the repository", f)
				}
				b.Files = append(b.Files, filepath.ToSlash(filepath.Clean(f)))
			}
			if arg == "" {
				return fmt.Errorf("doctest: files needs a path")
			}
		case "timeout":
			d, err := time.ParseDuration(arg)
			if err != nil || d <= 0 {
				return fmt.Errorf("doctest: timeout %q: want a positive duration", arg)
			}
			b.Timeout = d
		default:
			return fmt.Errorf("doctest: unknown directive %q (want skip, expect-exit, env, files, setup or timeout)", name)
		}
	}
	return nil
}

// openFence reports whether line opens a fenced code block, and returns
// its indentation, its fence (``` or ~~~, three or more) and info string.
func openFence(line string) (indent, fence, info string, ok bool) {
	rest := strings.TrimLeft(line, " ")
	indent = line[:len(line)-len(rest)]
	for _, c := range []byte{'`', '~'} {
		n := 0
		for n < len(rest) && rest[n] == c {
			n++
		}
		if n >= 3 {
			info = strings.TrimSpace(rest[n:])
			if c == '`' && strings.Contains(info, "`") {
				return "", "", "", false
			}
			return indent, rest[:n], info, true
		}
	}
	return "", "", "", false
}

// isCloseFence reports whether line closes a block opened with fence.
func isCloseFence(line, fence string) bool {
	rest := strings.TrimSpace(line)
	return strings.HasPrefix(rest, fence) && strings.Trim(rest, fence[:1]) == ""
}

// shellSteps splits an sh block into steps: whole-line comments in the
// first column that follow a command are its expected output.
func shellSteps(body []string, first int) []Step {
	var (
		steps   []Step
		cur     = Step{Line: first}
		hasCode bool
		code    strings.Builder
	)
	flush := func(next int) {
		cur.Code = code.String()
		steps = append(steps, cur)
		cur, hasCode = Step{Line: next}, false
		code.Reset()
	}
	for i, line := range body {
		if hasCode && (line == "#" || strings.HasPrefix(line, "# ")) {
			cur.Expect = append(cur.Expect, strings.TrimPrefix(strings.TrimPrefix(line, "#"), " "))
			continue
		}
		if len(cur.Expect) > 0 {
			flush(first + i)
		}
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			hasCode = true
		}
		code.WriteString(line + "\n")
	}
	if code.Len() > 0 || len(cur.Expect) > 0 {
		flush(0)
	}
	return steps
}

// consoleSteps splits a console block into steps: each "$ " line (and
// the lines continuing it after a trailing backslash) is a command, the
// lines after it up to the next command its expected output.
func consoleSteps(body []string, first int) ([]Step, error) {
	var (
		steps []Step
		cont  bool // the line before is a command ending in a backslash
	)
	for i, line := range body {
		isCmd := true
		switch {
		case cont:
			steps[len(steps)-1].Code += line + "\n"
		case line == "$" || strings.HasPrefix(line, "$ "):
			line = strings.TrimPrefix(strings.TrimPrefix(line, "$"), " ")
			steps = append(steps, Step{Line: first + i, Code: line + "\n"})
		case len(steps) == 0:
			if strings.TrimSpace(line) != "" {
				return nil, fmt.Errorf("line %d: console output before the first $ command", first+i)
			}
			isCmd = false
		default:
			steps[len(steps)-1].Expect = append(steps[len(steps)-1].Expect, line)
			isCmd = false
		}
		cont = isCmd && strings.HasSuffix(line, "\\")
	}
	for i := range steps { // a console transcript's trailing blank lines are not output
		e := steps[i].Expect
		for len(e) > 0 && strings.TrimSpace(e[len(e)-1]) == "" {
			e = e[:len(e)-1]
		}
		if len(e) == 0 {
			e = nil
		}
		steps[i].Expect = e
	}
	return steps, nil
}
