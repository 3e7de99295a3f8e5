package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jetlock/jetlock/client"
	"github.com/jetlock/jetlock/streams"
)

// Lock sets from the shell: run, acquire, renew and release take several
// resources, held as one lease (client.AcquireAll): granted all at once or
// not at all, renewed and released whole, with one fencing token per
// resource.
//
// A command run under a lease finds it in its environment (leaseEnv):
//
//	JETLOCK_LEASE_ID               the lease id (one for the whole set)
//	JETLOCK_RESOURCE_<n>           the n-th resource, n = 1.. in sorted order
//	JETLOCK_TOKEN_<n>              its fencing token
//	JETLOCK_TOKENS                 {"resource":token,...}, every resource's token
//	JETLOCK_RESOURCE, JETLOCK_TOKEN the resource and token of a lease of ONE
//	                               resource; unset for a set, whose tokens are
//	                               per resource (a fence compares the tokens of
//	                               one resource only)
//	JETLOCK_PERMIT                 the permit (1..N) of a semaphore's lease
//	                               (run --limit N); its token rises per permit

// splitRun splits run's arguments after its first resource (first, rest)
// into the resources to lock and the command: the resources are those
// before the first "--", the command what follows it. Without "--" it is
// one resource and the command right after it, as before lock sets.
func splitRun(first string, rest []string) (resources, command []string) {
	if i := slices.Index(rest, "--"); i >= 0 {
		return append([]string{first}, rest[:i]...), rest[i+1:]
	}
	return []string{first}, rest
}

// checkResources validates the resources of a command: each a valid name,
// and, for a lock set, at most streams.DefaultSetSize (the service's
// default cap), none twice, none that looks like a flag (flags go before
// the resources).
func checkResources(resources []string) error {
	for _, r := range resources {
		if len(resources) > 1 && strings.HasPrefix(r, "-") {
			return usagef("%q after the first resource: flags go before the resources (jetlock run [FLAGS] RESOURCE... -- CMD)", r)
		}
		if err := checkResource(r); err != nil {
			return err
		}
	}
	if len(resources) > streams.DefaultSetSize {
		return usagef("%d resources: a lock set has at most %d", len(resources), streams.DefaultSetSize)
	}
	sorted := slices.Sorted(slices.Values(resources))
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return usagef("resource %q named twice", sorted[i])
		}
	}
	return nil
}

// leaseEnv returns base, without the lease variables it inherited (from an
// outer jetlock run, or an eval of acquire --env), plus lease's.
func leaseEnv(base []string, lease *client.Lease) []string {
	env := make([]string, 0, len(base)+8)
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !isLeaseVar(name) {
			env = append(env, kv)
		}
	}
	for _, v := range leaseVars(lease.Resources(), lease.TokenOf, lease.ID()) {
		env = append(env, v.name+"="+v.value)
	}
	if p := lease.Permit(); p > 0 {
		env = append(env, "JETLOCK_PERMIT="+strconv.Itoa(p))
	}
	return env
}

// envVar is a variable of a lease's environment.
type envVar struct{ name, value string }

// leaseVars are the variables that describe a lease on resources (sorted)
// with id: see the top of this file.
func leaseVars(resources []string, tokenOf func(string) (uint64, bool), id string) []envVar {
	var vars []envVar
	tokens := make(map[string]uint64, len(resources))
	if len(resources) == 1 {
		t, _ := tokenOf(resources[0])
		vars = append(vars, envVar{"JETLOCK_RESOURCE", resources[0]}, envVar{"JETLOCK_TOKEN", strconv.FormatUint(t, 10)})
	}
	vars = append(vars, envVar{"JETLOCK_LEASE_ID", id})
	for i, r := range resources {
		t, _ := tokenOf(r)
		tokens[r] = t
		n := strconv.Itoa(i + 1)
		vars = append(vars, envVar{"JETLOCK_RESOURCE_" + n, r}, envVar{"JETLOCK_TOKEN_" + n, strconv.FormatUint(t, 10)})
	}
	b, _ := json.Marshal(tokens) // keys in sorted order
	return append(vars, envVar{"JETLOCK_TOKENS", string(b)})
}

// isLeaseVar reports whether name is one of the variables leaseVars sets
// for some lease.
func isLeaseVar(name string) bool {
	switch name {
	case "JETLOCK_RESOURCE", "JETLOCK_TOKEN", "JETLOCK_LEASE_ID", "JETLOCK_TOKENS", "JETLOCK_PERMIT":
		return true
	}
	for _, p := range []string{"JETLOCK_RESOURCE_", "JETLOCK_TOKEN_"} {
		if n, ok := strings.CutPrefix(name, p); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}

// exportLine is acquire --env's line for eval: the lease's variables and
// JETLOCK_TTL; for a lock set it unsets JETLOCK_RESOURCE and JETLOCK_TOKEN
// first, which a single lease set before would leave behind.
func exportLine(resources []string, tokenOf func(string) (uint64, bool), id, ttl string) string {
	var b strings.Builder
	if len(resources) > 1 {
		b.WriteString("unset JETLOCK_RESOURCE JETLOCK_TOKEN; ")
	}
	b.WriteString("export")
	vars := leaseVars(resources, tokenOf, id)
	// JETLOCK_TTL after the lease id, where it always was.
	at := slices.IndexFunc(vars, func(v envVar) bool { return v.name == "JETLOCK_LEASE_ID" }) + 1
	vars = slices.Insert(vars, at, envVar{"JETLOCK_TTL", ttl})
	for _, v := range vars {
		val := v.value
		if strings.HasPrefix(v.name, "JETLOCK_RESOURCE") || v.name == "JETLOCK_LEASE_ID" || v.name == "JETLOCK_TOKENS" {
			val = shellQuote(val)
		}
		fmt.Fprintf(&b, " %s=%s", v.name, val)
	}
	return b.String()
}

// setTokens writes a set's members as "a=5, b=7".
func setTokens(members []streams.SetMember) string {
	parts := make([]string, len(members))
	for i, m := range members {
		parts[i] = m.Resource + "=" + strconv.FormatUint(m.Token, 10)
	}
	return strings.Join(parts, ", ")
}

// setReply is the wire form of a set's grant: the lease's reply with its
// resources and their tokens.
func setReply(lease *client.Lease) streams.SetLeaseResponse {
	r := lease.Reply()
	out := streams.SetLeaseResponse{LeaseID: r.LeaseID, TTLms: r.TTLms, ExpiresAt: r.ExpiresAt, HoldUntil: r.HoldUntil}
	for _, res := range lease.Resources() {
		t, _ := lease.TokenOf(res)
		out.Resources = append(out.Resources, streams.SetMember{Resource: res, Token: t})
	}
	return out
}

// setGrantView is a set's renew reply without its lease id.
type setGrantView struct {
	TTLms     int64               `json:"ttl_ms"`
	ExpiresAt string              `json:"expires_at"`
	HoldUntil string              `json:"hold_until,omitempty"`
	Resources []streams.SetMember `json:"resources"`
}

// heldText says who holds what in a locked error: for one resource, the
// holder; for a set, every held member.
func heldText(held *client.HeldError) string {
	if held.Limit > 0 {
		return fmt.Sprintf("semaphore %s has no free permit (limit %d)", held.Resource, held.Limit)
	}
	if held.Set == nil {
		return "resource is held by another lease (" + holderText(held.Owner, held.Token) + ")"
	}
	if len(held.Holders) == 0 {
		return fmt.Sprintf("a lock set of %d resources is held by other leases (the service named no holder)", len(held.Set))
	}
	parts := make([]string, 0, len(held.Holders))
	for _, h := range held.Holders {
		parts = append(parts, h.Resource+": "+holderText(h.Owner, h.Token))
	}
	return fmt.Sprintf("%d of the set's %d resources held by other leases (%s)", len(held.Holders), len(held.Set), strings.Join(parts, "; "))
}
