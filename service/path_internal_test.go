package service

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// maxAcquirePathFiles bounds the files of service/ that one uncontended
// acquire runs code in, from its request to its commit (see
// TestAcquirePath): at most eight, and kept from growing.
const maxAcquirePathFiles = 8

// TestAcquirePath measures the path of one acquire through the package:
// it builds the package with every function and function literal
// recording its entry and return (a build overlay: the files on disk are
// not touched), runs one uncontended acquire on a real cluster with the
// recording on, and reports the files the request's goroutines ran code
// in, in the order they did, and how often they came back to a file they
// had left. The first acquires of an instance, which set up what later
// ones reuse, run before the recording.
//
// It builds the package and its tests again, instrumented, so it takes a
// minute or two; -short leaves it out.
func TestAcquirePath(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package again (-short)")
	}
	dir := t.TempDir()
	overlay, err := pathOverlay(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "events.json")
	args := []string{"test", "-overlay", overlay, "-run", "^TestAcquirePathInner$", "-count=1"}
	if raceOn {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Env = append(os.Environ(), "JETLOCK_PATH_OUT="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the instrumented run: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var events []pathEvent
	if err := json.Unmarshal(data, &events); err != nil {
		t.Fatal(err)
	}
	p := pathOf(events)
	if len(p.files) == 0 {
		t.Fatal("the recording holds no step of the acquire")
	}
	for g, seq := range p.byGoroutine {
		t.Logf("goroutine %d: %s", g, strings.Join(seq, " > "))
	}
	t.Logf("an acquire runs code in %d files of service/ to its commit (%s); in %d to its reply (%s), coming back %d times to a file it had left",
		len(p.toCommit), strings.Join(p.toCommit, ", "), len(p.files), strings.Join(p.files, ", "), p.returns)
	if len(p.toCommit) > maxAcquirePathFiles {
		t.Errorf("an acquire's path to its commit runs through %d files, more than %d", len(p.toCommit), maxAcquirePathFiles)
	}
}

// pathEvent is one entry into (or return from) function Func of File on
// goroutine G, as the instrumented build records it.
type pathEvent struct {
	G     uint64 `json:"g"`
	File  string `json:"file"`
	Func  string `json:"func"`
	Enter bool   `json:"enter"`
}

// acquirePath is what a recording says: the files in the order first
// entered, each goroutine's sequence of files (the file of its innermost
// recorded frame, as it changes, with the function entered), and the
// number of changes to a file the goroutine had been in before.
// fileOf is the file of a step of a goroutine's sequence ("file" on a
// return to it, "file function" on an entry).
func fileOf(step string) string { f, _, _ := strings.Cut(step, " "); return f }

type acquirePath struct {
	files []string
	// toCommit are the files entered before the commit: up to the first
	// entry into one of the store's writes (storeWrite).
	toCommit    []string
	byGoroutine map[uint64][]string
	returns     int
}

// pathOf reads a recording: per goroutine, a stack of the files of the
// frames entered while recording (a return from a frame entered before
// the recording began is ignored). The request's goroutines are those
// that ran code of request.go, where every request is decoded and
// served: the connection's handler and the worker that served it; the
// watcher and the acknowledgement reader, which serve every request
// together, are not counted.
func pathOf(events []pathEvent) acquirePath {
	p := acquirePath{byGoroutine: map[uint64][]string{}}
	stacks := map[uint64][]string{}
	committed := false
	mine := map[uint64]bool{}
	for _, e := range events {
		mine[e.G] = mine[e.G] || e.File == "request.go"
	}
	for _, e := range events {
		if !mine[e.G] {
			continue
		}
		st := stacks[e.G]
		if e.Enter {
			st = append(st, e.File)
		} else if len(st) > 0 && st[len(st)-1] == e.File {
			st = st[:len(st)-1]
		} else {
			continue
		}
		stacks[e.G] = st
		if len(st) == 0 {
			continue
		}
		writes := e.Enter && e.File == "store.go" && storeWrite(e.Func)
		cur, seq := st[len(st)-1], p.byGoroutine[e.G]
		if len(seq) > 0 && fileOf(seq[len(seq)-1]) == cur {
			committed = committed || writes
			continue
		}
		if slices.ContainsFunc(seq, func(s string) bool { return fileOf(s) == cur }) {
			p.returns++
		}
		step := cur
		if e.Enter {
			step += " " + e.Func
		}
		p.byGoroutine[e.G] = append(seq, step)
		if !slices.Contains(p.files, cur) {
			p.files = append(p.files, cur)
		}
		if !committed && !slices.Contains(p.toCommit, cur) {
			p.toCommit = append(p.toCommit, cur)
		}
		committed = committed || writes
	}
	return p
}

// storeWrite reports whether fn, a function of store.go as the recording
// names it, is one of the store's writes: where a decision is committed.
// store.go also holds the records' format (entry, requestHash, newLease),
// which a request uses long before.
func storeWrite(fn string) bool {
	switch fn {
	case "(store).commitWrites", "(store).put", "(store).del", "(store).batch", "(store).publish",
		"(store).handOver", "(store).tombstone", "(store).prove":
		return true
	}
	return false
}

// pathOverlay writes, under dir, the package's files with every function
// body recording its file on entry and return, the recorder and the inner
// test, and returns the overlay file that puts them in place.
func pathOverlay(dir string) (string, error) {
	here, err := os.Getwd()
	if err != nil {
		return "", err
	}
	names, err := filepath.Glob("*.go")
	if err != nil {
		return "", err
	}
	replace := map[string]string{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := instrument(name)
		if err != nil {
			return "", err
		}
		if replace[filepath.Join(here, name)], err = writeIn(dir, name, src); err != nil {
			return "", err
		}
	}
	for name, src := range map[string]string{"zz_pathtrace.go": pathRecorder, "zz_pathtrace_inner_test.go": pathInnerTest} {
		if replace[filepath.Join(here, name)], err = writeIn(dir, name, []byte(src)); err != nil {
			return "", err
		}
	}
	data, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", err
	}
	return writeIn(dir, "overlay.json", data)
}

func writeIn(dir, name string, data []byte) (string, error) {
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, data, 0o644)
}

// instrument returns file name with `defer pathEnter("name", "function")()`
// first in every function and function literal.
func instrument(name string) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	stmt := func(fn string) ast.Stmt {
		return &ast.DeferStmt{Call: &ast.CallExpr{Fun: &ast.CallExpr{Fun: ast.NewIdent("pathEnter"),
			Args: []ast.Expr{&ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(name)},
				&ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(fn)}}}}}
	}
	var outer string // the function declaration a literal is in
	ast.Inspect(f, func(n ast.Node) bool {
		switch fn := n.(type) {
		case *ast.FuncDecl:
			if outer = funcName(fn); fn.Body != nil {
				fn.Body.List = append([]ast.Stmt{stmt(outer)}, fn.Body.List...)
			}
		case *ast.FuncLit:
			fn.Body.List = append([]ast.Stmt{stmt(outer + ".func")}, fn.Body.List...)
		}
		return true
	})
	var b bytes.Buffer
	if err := format.Node(&b, fset, f); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return b.Bytes(), nil
}

// pathRecorder is the instrumented build's recorder: while on, every
// entry and return, with its goroutine.
const pathRecorder = `package service

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

var (
	pathOn     atomic.Bool
	pathMu     sync.Mutex
	pathEvents []pathTraceEvent
)

// pathTraceEvent is pathEvent (the field names match its JSON names).
type pathTraceEvent struct {
	G     uint64
	File  string
	Func  string
	Enter bool
}

func pathNop() {}

func pathGoroutine() uint64 {
	var b [64]byte
	f := bytes.Fields(b[:runtime.Stack(b[:], false)])
	id, _ := strconv.ParseUint(string(f[1]), 10, 64)
	return id
}

func pathRecord(g uint64, file, fn string, enter bool) {
	pathMu.Lock()
	pathEvents = append(pathEvents, pathTraceEvent{G: g, File: file, Func: fn, Enter: enter})
	pathMu.Unlock()
}

func pathEnter(file, fn string) func() {
	if !pathOn.Load() {
		return pathNop
	}
	g := pathGoroutine()
	pathRecord(g, file, fn, true)
	return func() { pathRecord(g, file, fn, false) }
}
`

// pathInnerTest runs in the instrumented build: a service on a fresh
// cluster, a few acquires unrecorded, then one recorded.
const pathInnerTest = `package service

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jetlock/jetlock/streams"
)

func TestAcquirePathInner(t *testing.T) {
	out := os.Getenv("JETLOCK_PATH_OUT")
	if out == "" {
		t.Fatal("JETLOCK_PATH_OUT names the recording's file")
	}
	s, req := runInternal(t, DefaultConfig())
	acquire := func(resource string) {
		m := req(streams.OpAcquire, streams.AcquireRequest{Resource: resource, RequestID: resource + "-1", TTLms: 30_000})
		if code := m.Header.Get("Nats-Service-Error-Code"); code != "" {
			t.Fatalf("acquire %s: %s %s", resource, code, m.Data)
		}
	}
	for i := range 5 {
		acquire(fmt.Sprintf("warm-%d", i))
	}
	// A lone instance, as the dev cluster runs one: it stops following
	// the bucket once no other instance was heard since it started.
	for start := time.Now(); s.Following(); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the instance still follows the bucket")
		}
	}
	pathOn.Store(true)
	acquire("traced")
	pathOn.Store(false)
	pathMu.Lock()
	data, err := json.Marshal(pathEvents)
	pathMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
`
