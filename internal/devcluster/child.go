package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// ErrExited is returned when a child process exits before it is ready.
var ErrExited = errors.New("exited before it was ready")

// Child is a process started by this one and tied to its lifetime: Stop
// ends it with a termination signal (SIGKILL after a grace period), and on
// Linux it gets SIGKILL should this process die first (see
// child_linux.go). Its stdin stays open until Stop, so a program that
// exits when its stdin closes, as NodeMain does, also goes with this
// process where no parent-death signal exists. The zero value of the
// unexported fields is ready to use; a Child may be started again after it
// exited. Its methods are safe for concurrent use.
type Child struct {
	Name  string   // for errors
	Path  string   // the program; empty means this program
	Args  []string // its arguments
	Env   []string // added to this process's environment
	Log   string   // file that receives its stdout and stderr (appended)
	Stdin []byte   // written to its stdin first

	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
}

// Start starts the process; it does not wait for it to be ready (see
// WaitReady).
func (c *Child) Start() error {
	path := c.Path
	if path == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		path = exe
	}
	logf, err := os.OpenFile(c.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	setProcAttr(cmd)
	stdin, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", c.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	c.mu.Lock()
	c.cmd, c.stdin, c.exited = cmd, stdin, exited
	c.mu.Unlock()
	if _, err := stdin.Write(c.Stdin); err != nil {
		c.Kill()
		return fmt.Errorf("start %s: %w", c.Name, err)
	}
	return nil
}

// WaitReady calls ready every 50ms until it reports true, and returns nil
// then. It returns an error wrapping ErrExited if the process exits first,
// and kills the process if timeout or ctx ends first.
func (c *Child) WaitReady(ctx context.Context, timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-c.Exited():
			return fmt.Errorf("%s %w (see %s)", c.Name, ErrExited, c.Log)
		case <-ctx.Done():
			c.Kill()
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.Kill()
			return fmt.Errorf("%s not ready after %v (see %s)", c.Name, timeout, c.Log)
		}
	}
	return nil
}

// Exited returns a channel that is closed when the process has exited (at
// once when it was never started).
func (c *Child) Exited() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	return c.exited
}

// ExitCode returns the process's exit code once it has exited (-1 when a
// signal ended it), and false while it runs or was never started.
func (c *Child) ExitCode() (int, bool) {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return 0, false
	}
	select {
	case <-exited: // Wait has set ProcessState
		return cmd.ProcessState.ExitCode(), true
	default:
		return 0, false
	}
}

// PID returns the process id while the process runs, else 0.
func (c *Child) PID() int {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return 0
	}
	select {
	case <-exited:
		return 0
	default:
		return cmd.Process.Pid
	}
}

// Kill kills the process at once (no shutdown, no flush) and waits until
// it is gone.
func (c *Child) Kill() {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Signal sends sig to the process while it runs, and waits until it has
// exited, at most grace; then it kills it. It reports whether the process
// exited on its own.
func (c *Child) Signal(sig os.Signal, grace time.Duration) bool {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return true
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return true
	case <-time.After(grace):
		c.Kill()
		return false
	}
}

// Stop asks the process to shut down (a termination signal, and its stdin
// closed) and kills it if it has not gone within grace.
func (c *Child) Stop(grace time.Duration) {
	c.mu.Lock()
	cmd, stdin, exited := c.cmd, c.stdin, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = terminate(cmd.Process)
	_ = stdin.Close()
	select {
	case <-exited:
	case <-time.After(grace):
		c.Kill()
	}
}
