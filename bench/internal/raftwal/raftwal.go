// Package raftwal reads how far a NATS raft group's log has come from its
// write-ahead log on disk: the index of the last entry a node appended.
// The bench counts replicated commits with it: every append of the
// stream's raft group is one round of replication, however many messages
// it carries (an atomic batch is one; so are proposals that arrived
// together and went out in one append).
//
// The nodes the bench starts serve no monitoring port and their system
// account has no user, so nats-server's Raftz (whose "pindex" and
// "committed" are the same index) is out of the bench's reach; their
// files are not. nats-server keeps a group's log at
// <store>/jetstream/<system account>/_js_/<group>/msgs/<n>.blk as a file
// store of its own, each append one record whose sequence is the append's
// raft index (raft.storeToWAL checks that they agree). The record format
// is the file store's on-disk format, which servers keep readable across
// versions:
//
//	total_len(4) seq(8) ts(8) subj_len(2) subj [hdr_len(4) hdr] msg hash(8)
//
// with the high bit of total_len set when there are headers, and the
// high bits of seq marking erased (1<<63) and tombstone (1<<62) records.
// The msg of a raft append starts with the leader's id (8 bytes), the
// term, the commit, the previous term and the previous index (8 bytes
// each): a record is taken as an append only when its sequence is that
// previous index plus one, so a torn or misread record is never counted.
package raftwal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Record layout of the file store (filestore.go: msgHdrSize, hbit, ebit,
// tbit, checksum) and of a raft append (raft.go: appendEntry.encode).
const (
	recHdrSize   = 22
	checksumSize = 8
	hbit         = 1 << 31
	ebit         = 1 << 63
	tbit         = 1 << 62
	aeIndexOff   = 8 + 8 + 8 + 8 // leader id, term, commit, pterm; then pindex
	maxRecord    = 64 << 20      // larger is not a record of this log
)

// ErrNoEntry means the log holds no append yet (or, just after a
// compaction, none in its newest block): ask again a moment later.
var ErrNoEntry = errors.New("raftwal: no entry in the log")

// Dir returns the directory of group's log under a node's JetStream store
// directory (the node's directory, holding "jetstream").
func Dir(nodeDir, group string) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(nodeDir, "jetstream", "*", "_js_", group, "msgs"))
	if err != nil {
		return "", err
	}
	if len(dirs) != 1 {
		return "", fmt.Errorf("raftwal: %d logs of group %s under %s", len(dirs), group, nodeDir)
	}
	return dirs[0], nil
}

// Log reads one group's log on one node. It remembers how far it read the
// newest block, so that each reading parses only what was appended since.
// It is not safe for concurrent use.
type Log struct {
	dir  string
	path string      // the block read last
	info os.FileInfo // its identity (a compaction writes a new file)
	off  int64       // end of the last whole record read in it
	last uint64      // the last append index found in it
}

// Open returns the log in dir (see Dir).
func Open(dir string) *Log { return &Log{dir: dir} }

// Last returns the index of the last entry the node appended to the log.
func (l *Log) Last() (uint64, error) {
	blocks, err := l.blocks()
	if err != nil {
		return 0, err
	}
	if len(blocks) == 0 {
		return 0, ErrNoEntry
	}
	if last, err := l.newest(blocks[0]); err != nil || last > 0 {
		return last, err
	}
	// The newest block holds no append (it was just started, or a
	// compaction left it empty): the ones before it may.
	for _, b := range blocks[1:min(len(blocks), 3)] {
		if last, _, err := scan(b, 0); err != nil || last > 0 {
			return last, err
		}
	}
	return 0, ErrNoEntry
}

// newest reads what was appended to block path since the last reading.
func (l *Log) newest(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if path != l.path || !os.SameFile(fi, l.info) || fi.Size() < l.off {
		l.path, l.off, l.last = path, 0, 0
	}
	l.info = fi
	last, off, err := scan(path, l.off)
	if err != nil {
		return 0, err
	}
	l.off = off
	l.last = max(l.last, last)
	return l.last, nil
}

// blocks lists the log's block files, newest first.
func (l *Log) blocks() ([]string, error) {
	ents, err := os.ReadDir(l.dir)
	if err != nil {
		return nil, err
	}
	type block struct {
		n    uint64
		path string
	}
	var bs []block
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".blk")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(name, 10, 64); err == nil {
			bs = append(bs, block{n, filepath.Join(l.dir, e.Name())})
		}
	}
	slices.SortFunc(bs, func(a, b block) int { return -cmpUint(a.n, b.n) })
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.path
	}
	return out, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// scan reads the records of block path from offset off and returns the
// highest append index among them and the offset after the last whole
// record. A record still being written (shorter than its length says)
// ends the scan; so does anything that is not a record of this log.
func scan(path string, off int64) (last uint64, end int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, off, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, off, err
	}
	buf, err := io.ReadAll(f)
	if err != nil {
		return 0, off, err
	}
	last, n := Parse(buf)
	return last, off + int64(n), nil
}

// Parse walks the file store records in buf and returns the highest raft
// append index among them and the length of the whole records read.
func Parse(buf []byte) (last uint64, n int) {
	le := binary.LittleEndian
	for len(buf)-n >= recHdrSize {
		rec := buf[n:]
		rl := int(le.Uint32(rec) &^ hbit)
		if rl < recHdrSize+checksumSize || rl > maxRecord {
			break // not a record: stop rather than guess
		}
		if rl > len(rec) {
			break // still being written
		}
		raw := le.Uint64(rec[4:])
		seq := raw &^ (ebit | tbit)
		if raw&tbit == 0 {
			if idx, ok := appendIndex(rec[:rl]); ok && idx == seq {
				last = max(last, seq)
			}
		}
		n += rl
	}
	return last, n
}

// appendIndex returns the index a record holding a raft append stands
// at: its previous index plus one.
func appendIndex(rec []byte) (uint64, bool) {
	le := binary.LittleEndian
	slen := int(le.Uint16(rec[20:]))
	body := rec[recHdrSize : len(rec)-checksumSize]
	if slen > len(body) {
		return 0, false
	}
	body = body[slen:]
	if le.Uint32(rec)&hbit != 0 {
		if len(body) < 4 {
			return 0, false
		}
		hl := int(le.Uint32(body))
		if 4+hl > len(body) {
			return 0, false
		}
		body = body[4+hl:]
	}
	if len(body) < aeIndexOff+8 {
		return 0, false
	}
	return le.Uint64(body[aeIndexOff:]) + 1, true
}
