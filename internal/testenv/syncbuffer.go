package testenv

import (
	"bytes"
	"sync"
)

// SyncBuffer is a buffer that a process (or a goroutine) writes while a
// test reads it: a bytes.Buffer safe for one writer and many readers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
