package raftwal

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetlock/jetlock/internal/devcluster"
	"github.com/jetlock/jetlock/streams"
)

// record builds a file store record holding a raft append at index idx.
func record(idx uint64, flags uint64) []byte {
	le := binary.LittleEndian
	msg := make([]byte, aeIndexOff+8+2)
	le.PutUint64(msg[aeIndexOff:], idx-1)
	rl := recHdrSize + len(msg) + checksumSize
	b := le.AppendUint32(nil, uint32(rl))
	b = le.AppendUint64(b, idx|flags)
	b = le.AppendUint64(b, 0)
	b = le.AppendUint16(b, 0)
	b = append(b, msg...)
	return append(b, make([]byte, checksumSize)...)
}

// Parse counts whole records only, takes no tombstone for an append, and
// stops at anything that is not a record.
func TestParse(t *testing.T) {
	var buf []byte
	for i := uint64(1); i <= 5; i++ {
		buf = append(buf, record(i, 0)...)
	}
	whole := len(buf)
	buf = append(buf, record(9, tbit)...)
	withTomb := len(buf)
	if last, n := Parse(buf); last != 5 || n != withTomb {
		t.Fatalf("Parse = %d, %d; want 5, %d", last, n, withTomb)
	}
	torn := append(append([]byte{}, buf...), record(6, 0)[:30]...)
	if last, n := Parse(torn); last != 5 || n != withTomb {
		t.Fatalf("a torn record: Parse = %d, %d; want 5, %d", last, n, withTomb)
	}
	bad := record(7, 0) // its previous index does not match its sequence
	binary.LittleEndian.PutUint64(bad[recHdrSize+aeIndexOff:], 3)
	if last, _ := Parse(append(buf[:whole:whole], bad...)); last != 5 {
		t.Fatalf("a record that is no append at its index counted: %d", last)
	}
}

// The log's last index read from disk is the index nats-server's Raftz
// reports for the stream's group, on the leader and on a follower, with
// single writes and atomic batches (one append each).
func TestLastIsRaftzIndex(t *testing.T) {
	base := t.TempDir()
	c, err := devcluster.Start(devcluster.Options{Dir: base})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	nc, err := nats.Connect(c.URLs(), c.ConnectOptions(devcluster.Admin)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := streams.BucketConfig{Bucket: "walt"}.StreamConfig(1)
	st, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pfx := streams.SubjectPrefix("walt")
	for i := range 200 {
		if _, err := js.Publish(ctx, pfx+"k"+strconv.Itoa(i%20), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 { // atomic batches of two
		id := fmt.Sprintf("b%d", i)
		m1 := nats.NewMsg(pfx + "a")
		m1.Header.Set("Nats-Batch-Id", id)
		m1.Header.Set("Nats-Batch-Sequence", "1")
		m2 := nats.NewMsg(pfx + "confirm")
		m2.Header.Set("Nats-Batch-Id", id)
		m2.Header.Set("Nats-Batch-Sequence", "2")
		m2.Header.Set("Nats-Batch-Commit", "1")
		if err := nc.PublishMsg(m1); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.RequestMsg(m2, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	group := info.Cluster.RaftGroup
	if info.State.LastSeq != 300 || group == "" {
		t.Fatalf("stream state %+v, group %q", info.State, group)
	}
	for i := range devcluster.Size {
		var want uint64
		deadline := time.Now().Add(10 * time.Second)
		for { // a follower appends a moment after the leader
			rz := c.Server(i).Raftz(&server.RaftzOptions{AccountFilter: devcluster.Account, GroupFilter: group})
			for _, groups := range *rz {
				want = groups[group].PIndex
			}
			if want >= 250 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		dir, err := Dir(filepath.Join(base, fmt.Sprintf("n%d", i+1)), group)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Open(dir).Last()
		// 200 single writes and 50 batches of two: 250 appends, not 300.
		if err != nil || got != want || want < 250 || want >= 300 {
			t.Errorf("node %d: log's last index %d (%v), Raftz's pindex %d (300 messages, 250 commits)", i, got, err, want)
		}
	}
}
