// Locks against a real lockd --dev: grants, waits in FIFO order, the loss
// signal, cancelled waits, fencing, release, and the promises that are
// about one lock (P1–P6).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { connect } from "@nats-io/transport-node";
import {
  Jetlock,
  LeaseLostError,
  LockedError,
  MemoryFence,
  ReleasedError,
  StaleTokenError,
  type Lease,
} from "../src/index.js";
import { Cluster, Path, eventually, unique } from "./cluster.js";

let cluster: Cluster;
let jl: Jetlock;
let other: Jetlock;
let operator: Jetlock;
const open: Jetlock[] = [];

async function client(opts: Parameters<typeof Jetlock.connect>[1] = {}, servers?: string[]): Promise<Jetlock> {
  const c = await Jetlock.connect({ servers: servers ?? cluster.servers, maxReconnectAttempts: -1, reconnectTimeWait: 100 }, opts);
  open.push(c);
  return c;
}

before(async () => {
  cluster = await Cluster.start();
  jl = await client();
  other = await client();
  operator = await Jetlock.connect({ servers: cluster.servers, user: "operator", pass: "operator" });
  open.push(operator);
});

after(async () => {
  for (const c of open) await c.close().catch(() => undefined);
  await cluster?.stop();
});

describe("locks", () => {
  it("acquire grants a lease with a token, renews it at a third of its TTL, and release ends it", async () => {
    const r = unique("grant");
    const lease = await jl.acquire(r, { ttlMs: 3000, owner: "ts-test" });
    assert.ok(lease.token > 0);
    assert.equal(lease.resource, r);
    assert.equal(lease.fenceKey, r);
    assert.equal(lease.signal.aborted, false);
    const st = await jl.status(r);
    assert.equal(st.held, true);
    assert.equal(st.owner, "ts-test");
    assert.equal(st.token, lease.token);
    const before = lease.expiresAt.getTime();
    await lease.renewed(); // the renewal loop runs by itself
    assert.ok(lease.expiresAt.getTime() > before, "a renewal moves the client's deadline");
    assert.equal((await jl.status(r)).token, lease.token, "a renewal keeps the token");
    assert.equal(await lease.release(), true);
    assert.ok(lease.signal.aborted);
    assert.ok(lease.signal.reason instanceof ReleasedError);
    assert.equal((await jl.status(r)).held, false);
  });

  it("tryAcquire of a held resource is a LockedError naming the holder", async () => {
    const r = unique("held");
    await using lease = await jl.acquire(r, { owner: "first" });
    await assert.rejects(other.tryAcquire(r, { owner: "second" }), (err: unknown) => {
      assert.ok(err instanceof LockedError);
      assert.equal(err.code, "locked");
      assert.equal(err.resource, r);
      assert.equal(err.holder?.owner, "first");
      assert.equal(err.holder?.token, lease.token);
      assert.ok(err.holder?.expiresAt instanceof Date);
      return true;
    });
  });

  it("await using releases the lease at scope exit", async () => {
    const r = unique("using");
    let kept: Lease;
    {
      await using lease = await jl.acquire(r);
      kept = lease;
      assert.equal((await jl.status(r)).held, true);
    }
    assert.ok(kept.signal.reason instanceof ReleasedError);
    assert.equal((await jl.status(r)).held, false);
  });

  it("withLock runs fn with the lease and releases it, also when fn throws", async () => {
    const r = unique("withlock");
    const token = await jl.withLock(r, async (lease) => {
      assert.equal((await jl.status(r)).token, lease.token);
      return lease.token;
    });
    assert.ok(token > 0);
    assert.equal((await jl.status(r)).held, false);
    await assert.rejects(
      jl.withLock(r, () => {
        throw new Error("boom");
      }),
      /boom/,
    );
    assert.equal((await jl.status(r)).held, false);
  });

  it("waiters are woken in FIFO order, each with a larger token", async () => {
    const r = unique("fifo");
    const holder = await jl.acquire(r);
    const order: number[] = [];
    const tokens: number[] = [];
    const waits: Promise<void>[] = [];
    for (let i = 0; i < 3; i++) {
      const c = i % 2 === 0 ? jl : other;
      waits.push(
        c.acquire(r, { waitMs: 60_000, owner: `waiter-${i}` }).then(async (l) => {
          order.push(i);
          tokens.push(l.token);
          await l.release();
        }),
      );
      await eventually(`waiter ${i} queued`, async () => (await jl.status(r)).waiters === i + 1);
    }
    await holder.release();
    await Promise.all(waits);
    assert.deepEqual(order, [0, 1, 2]);
    assert.ok(holder.token < tokens[0]! && tokens[0]! < tokens[1]! && tokens[1]! < tokens[2]!);
  });

  it("a grant that came from waiting is renewed at once to the TTL asked for", async () => {
    const r = unique("handover");
    const holder = await jl.acquire(r);
    const waiting = other.acquire(r, { waitMs: 60_000, ttlMs: 20_000 });
    await eventually("the waiter queued", async () => (await jl.status(r)).waiters === 1);
    await holder.release();
    const lease = await waiting;
    assert.equal(lease.ttlMs, 20_000, "the short hand-over TTL was renewed before the caller got the lease");
    await lease.release();
  });

  it("the lease's signal aborts with lease_lost when an operator revokes it", async () => {
    const r = unique("revoke");
    const lease = await jl.acquire(r, { ttlMs: 3000 });
    const rev = await operator.revoke(r, "ts test: revoke");
    assert.equal(rev.revoked, true);
    assert.equal(rev.token, lease.token);
    await eventually("the signal aborted", () => lease.signal.aborted);
    assert.ok(lease.signal.reason instanceof LeaseLostError);
    assert.equal((lease.signal.reason as LeaseLostError).code, "lease_lost");
    assert.equal(await lease.release(), false, "nothing left to release");
  });

  it("a wait given up by its signal is cancelled at the service", async () => {
    const r = unique("abandon");
    const holder = await jl.acquire(r);
    const ac = new AbortController();
    const waiting = other.acquire(r, { waitMs: 60_000, signal: ac.signal });
    await eventually("the waiter queued", async () => (await jl.status(r)).waiters === 1);
    ac.abort(new Error("given up"));
    await assert.rejects(waiting, /given up/);
    await eventually("the wait left the queue", async () => (await jl.status(r)).waiters === 0);
    await holder.release();
    assert.equal((await jl.status(r)).held, false, "nothing was granted to the abandoned wait");
  });

  it("a paused holder is fenced: its signal aborts before the next grant, and the fence refuses its old token", async () => {
    const r = unique("paused");
    const path = await Path.open(cluster.ports[0]!);
    try {
      const paused = await client({}, [path.url]);
      const fence = new MemoryFence();
      const lease = await paused.acquire(r, { ttlMs: 2000 });
      await fence.do(r, lease.token, () => "first write");
      path.pause(); // the holder's host froze: nothing in or out, the connection stays
      const next = await other.acquire(r, { waitMs: 60_000 });
      assert.ok(lease.signal.aborted, "the paused holder's signal aborted before the resource was granted again");
      assert.ok(next.token > lease.token);
      await fence.do(r, next.token, () => "new holder's write");
      await assert.rejects(fence.do(r, lease.token, () => "late write"), StaleTokenError);
      assert.equal(fence.highest(r), next.token);
      assert.equal(fence.rejected, 1);
      path.resume();
      await next.release();
    } finally {
      path.close();
    }
  });
});

describe("promises", () => {
  it("P1: a call returns within its signal; the cancel of its wait runs after it, bounded", async () => {
    const r = unique("p1");
    const holder = await jl.acquire(r);
    const path = await Path.open(cluster.ports[1]!);
    try {
      const waiter = await client({}, [path.url]);
      const ac = new AbortController();
      const waiting = waiter.acquire(r, { waitMs: 60_000, signal: ac.signal });
      await eventually("the waiter queued", async () => (await jl.status(r)).waiters === 1);
      path.pause(); // the cancel cannot get through now
      ac.abort(new Error("deadline"));
      await assert.rejects(waiting, /deadline/);
      assert.equal(waiter.pendingCleanup, 1, "the call returned while its cancel was still under way");
      path.resume();
      await eventually("the cancel went through", async () => waiter.pendingCleanup === 0 && (await jl.status(r)).waiters === 0);
    } finally {
      path.close();
      await holder.release();
    }
    // A timeout signal works the same way.
    const h2 = await jl.acquire(r);
    await assert.rejects(other.acquire(r, { signal: AbortSignal.timeout(300) }), (err: Error) => err.name === "TimeoutError");
    await eventually("the timed-out wait left the queue", async () => (await jl.status(r)).waiters === 0);
    await h2.release();
  });

  it("P2: a lease granted in the moment the caller gave up is released, not returned", async () => {
    const r = unique("p2");
    const holder = await jl.acquire(r);
    const path = await Path.open(cluster.ports[2]!);
    try {
      const waiter = await client({}, [path.url]);
      const ac = new AbortController();
      const waiting = waiter.acquire(r, { waitMs: 60_000, signal: ac.signal, owner: "p2-waiter" });
      await eventually("the waiter queued", async () => (await jl.status(r)).waiters === 1);
      path.pause(); // the grant's reply will be held on the way
      await holder.release();
      await eventually("granted to the waiter at the service", async () => (await jl.status(r)).owner === "p2-waiter");
      ac.abort(new Error("gave up"));
      await assert.rejects(waiting, /gave up/);
      path.resume();
      await eventually("the grant nobody uses was released", async () => !(await jl.status(r)).held);
    } finally {
      path.close();
    }
  });

  it("P3: the client's deadline counts from the send of the request, minus the margin, before the service's", async () => {
    const r = unique("p3");
    const t0 = Date.now();
    const lease = await jl.acquire(r, { ttlMs: 8000 });
    const t1 = Date.now();
    const deadline = lease.expiresAt.getTime();
    // sent in [t0, t1]; deadline = sent + ttl - margin (1 s)
    assert.ok(deadline >= t0 + 7000 - 5 && deadline <= t1 + 7000 + 5, `deadline ${deadline - t0} ms after the send`);
    assert.ok(deadline < lease.serviceExpiresAt.getTime(), "before the service's view of the expiry");
    await lease.release();
  });

  it("P3: the signal uses the earlier of the monotonic and the wall-clock deadline (a suspended host)", async () => {
    const r = unique("p3-suspend");
    let skew = 0;
    const clock = { monotonic: () => performance.now(), wall: () => Date.now() + skew };
    const suspended = await client({ clock });
    const lease = await suspended.acquire(r, { ttlMs: 30_000 });
    assert.equal(lease.signal.aborted, false);
    // The host was suspended for a minute: the wall clock moved on, the monotonic clock (and every timer) did not.
    skew = 60_000;
    await eventually("the expiry timer looked at the wall clock", () => lease.signal.aborted, 10_000);
    assert.ok(lease.signal.reason instanceof LeaseLostError);
    // And reading the signal checks at once, before any timer.
    const again = await suspended.acquire(unique("p3-suspend"), { ttlMs: 30_000 });
    skew += 60_000;
    assert.ok(again.signal.aborted, "a read of the signal checks the clocks first");
    await lease.release();
    await again.release();
  });

  it("P4: giving up a wait never ends another owner's lease that has the same request_id", async () => {
    const r = unique("p4");
    const id = `p4-${process.pid}`;
    const a = await jl.acquire(r, { owner: "owner-a", requestId: id, ttlMs: 3000 });
    const ac = new AbortController();
    let settled = false;
    const b = other.acquire(r, { owner: "owner-b", requestId: id, waitMs: 60_000, signal: ac.signal });
    b.then(
      () => (settled = true),
      () => (settled = true),
    );
    // Whether B queues, waits or is refused, its cancel (owner-b, same request_id) must leave A's lease alone.
    const asked = Date.now();
    await eventually("B asked", async () => settled || (await jl.status(r)).waiters === 1 || Date.now() - asked > 1000);
    ac.abort(new Error("B gives up"));
    await assert.rejects(b);
    await eventually("B's cancel ran", () => other.pendingCleanup === 0);
    const st = await jl.status(r);
    assert.equal(st.held, true);
    assert.equal(st.token, a.token, "A's lease is still the one held");
    await a.renewed(); // and A still renews it
    assert.equal(a.signal.aborted, false);
    assert.equal(await a.release(), true);
  });

  it("P5: a retry with the same request_id returns the same lease, renewed, with the deadline counted from the retry", async () => {
    const r = unique("p5");
    const id = `p5-${process.pid}`;
    const first = await jl.acquire(r, { owner: "p5", requestId: id, ttlMs: 4000 });
    const t0 = Date.now();
    const retried = await jl.acquire(r, { owner: "p5", requestId: id, ttlMs: 9000 });
    const t1 = Date.now();
    assert.equal(retried.token, first.token, "the same lease, never a second one");
    assert.equal(retried.ttlMs, 9000, "renewed with the retry's TTL");
    const d = retried.expiresAt.getTime();
    assert.ok(d >= t0 + 8000 - 5 && d <= t1 + 8000 + 5, "the deadline counts from the retry's send");
    assert.equal((await jl.status(r)).token, first.token);
    await retried.release();
    // Once ended, a retry of the request is lease_lost, never a new lease.
    await assert.rejects(jl.tryAcquire(r, { owner: "p5", requestId: id }), LeaseLostError);
    first.release().catch(() => undefined);
    // Sets too.
    const set = [unique("p5-set"), unique("p5-set")];
    const sid = `p5-set-${process.pid}`;
    const s1 = await jl.acquireAll(set, { requestId: sid, owner: "p5" });
    const s2 = await jl.acquireAll(set, { requestId: sid, owner: "p5" });
    assert.deepEqual([...s2.tokens], [...s1.tokens]);
    await s2.release();
  });

  it("P6: release is idempotent and never ends a lease other than the one it names", async () => {
    const r = unique("p6");
    const lease = await jl.acquire(r, { ttlMs: 5000 });
    assert.equal(await lease.release(), true);
    assert.equal(await lease.release(), false);
    // A lease revoked (so its holder still has time on its own deadline) and then granted to someone else:
    const old = await jl.acquire(r, { ttlMs: 20_000 });
    await operator.revoke(r, "ts test: P6");
    const current = await other.acquire(r, { waitMs: 10_000 });
    assert.equal(await old.release(), false, "the old lease's release ends nothing");
    const st = await jl.status(r);
    assert.equal(st.held, true);
    assert.equal(st.token, current.token, "the new lease is untouched");
    assert.equal(await current.release(), true);
  });
});
