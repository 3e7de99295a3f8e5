package fence_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jetlock/jetlock/client/fence"
)

// A holder paused past its TTL comes back with an old token after a newer
// holder has written: its write is rejected.
func ExampleMemory() {
	ctx := context.Background()
	guard := fence.NewMemory()

	fmt.Println("A writes with token 7:", guard.Check(ctx, "lock:backup:user123", 7))
	// A pauses (GC, VM freeze); its lease expires and B acquires token 9.
	fmt.Println("B writes with token 9:", guard.Check(ctx, "lock:backup:user123", 9))
	fmt.Println("B writes again with 9:", guard.Check(ctx, "lock:backup:user123", 9))
	// A resumes and still believes it holds the lock.
	err := guard.Check(ctx, "lock:backup:user123", 7)
	fmt.Println("A writes with token 7:", errors.Is(err, fence.ErrStaleToken))
	fmt.Println(err)
	fmt.Println("rejected:", guard.Rejected())
	// Output:
	// A writes with token 7: <nil>
	// B writes with token 9: <nil>
	// B writes again with 9: <nil>
	// A writes with token 7: true
	// fence: stale token 7 for resource "lock:backup:user123": token 9 already accepted
	// rejected: 1
}

// Do makes the check and the write one step: no newer token can be
// accepted while the write runs.
func ExampleMemory_Do() {
	ctx := context.Background()
	guard := fence.NewMemory()
	balance := map[string]int{}

	deposit := func(token uint64, amount int) error {
		return guard.Do(ctx, "accounts/42", token, func() error {
			balance["accounts/42"] += amount
			return nil
		})
	}
	fmt.Println(deposit(3, 100))
	fmt.Println(deposit(5, 50))
	fmt.Println(deposit(3, 1000)) // the old holder, too late
	fmt.Println(balance["accounts/42"])
	// Output:
	// <nil>
	// <nil>
	// fence: stale token 3 for resource "accounts/42": token 5 already accepted
	// 150
}
