//go:build unix

package doctest_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jetlock/jetlock/internal/doctest"
)

// defaultCommand is the subcommand a program runs when none is named.
var defaultCommand = map[string]string{"lockd": "serve"}

// checkFlags checks every long flag given to lockd, jetlock or bench in
// the documents, in the blocks marked skip too, against the --help of the
// built program and its subcommand (bench's flag package shows -name).
func checkFlags(t *testing.T, tl *tools, blocks []doctest.Block) {
	helps := map[string]string{} // by "program subcommand"
	help := func(args ...string) string {
		key := strings.Join(args, " ")
		if h, ok := helps[key]; ok {
			return h
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(tl.bin, args[0]), append(args[1:], "--help")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s --help: %v\n%s", key, err, out)
		}
		helps[key] = string(out)
		return helps[key]
	}
	checked := 0
	for _, b := range blocks {
		for _, s := range b.Steps {
			checkStepFlags(t, b, s, help, &checked)
		}
	}
	t.Logf("%d flags of lockd, jetlock and bench checked against their --help", checked)
}

func checkStepFlags(t *testing.T, b doctest.Block, s doctest.Step, help func(...string) string, checked *int) {
	for _, inv := range doctest.Invocations(alias(s.Code), "lockd", "jetlock", "bench") {
		cmds := subcommands(help(inv.Name))
		args := []string{inv.Name}
		if i := slices.IndexFunc(inv.Args, func(a string) bool { return slices.Contains(cmds, a) }); i >= 0 {
			args = append(args, inv.Args[i])
		} else if d, ok := defaultCommand[inv.Name]; ok {
			args = append(args, d)
		}
		h := help(args...)
		for _, f := range inv.Flags {
			*checked++
			if !regexp.MustCompile(`(^|[\s,])--?` + regexp.QuoteMeta(f) + `([=\s,]|$)`).MatchString(h) {
				t.Errorf("%s:%d: %s has no flag --%s (see %s --help)", b.File, s.Line+inv.Line-1, strings.Join(args, " "), f, strings.Join(args, " "))
			}
		}
	}
}

// subcommands returns the commands a kong --help lists.
func subcommands(help string) []string {
	_, rest, ok := strings.Cut(help, "\nCommands:\n")
	if !ok {
		return nil
	}
	var cmds []string
	for _, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") {
			cmds = append(cmds, strings.Fields(line)[0])
		} else if line != "" && !strings.HasPrefix(line, " ") {
			break
		}
	}
	return cmds
}

func TestInvocations(t *testing.T) {
	script := strings.Join([]string{
		`lockd --url tls://a:4222 \`,
		`  --nkey /etc/x.nk --metrics=127.0.0.1:9090`,
		`jetlock acquire | renew | release ...   # --not-a-flag`,
		`X=1 jetlock revoke RES --reason "stuck job" && nats req x '{"a":"b|c"}'`,
		`jetlock -s nats://x run --ttl 30s lock:a -- ./backup.sh --dry-run; echo --no`,
		`go test ./... --lockd`,
	}, "\n")
	got := doctest.Invocations(script, "lockd", "jetlock")
	want := []doctest.Invocation{
		{Line: 1, Name: "lockd", Flags: []string{"url", "nkey", "metrics"}, Args: []string{"tls://a:4222", "/etc/x.nk"}},
		{Line: 3, Name: "jetlock", Args: []string{"acquire"}},
		{Line: 4, Name: "jetlock", Args: []string{"revoke", "RES", "stuck job"}, Flags: []string{"reason"}},
		{Line: 5, Name: "jetlock", Args: []string{"nats://x", "run", "30s", "lock:a"}, Flags: []string{"ttl"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Invocations:\n got %+v\nwant %+v", got, want)
	}
}
