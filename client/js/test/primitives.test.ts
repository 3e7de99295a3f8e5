// Lock sets, sessions, semaphores and elections against a real lockd --dev,
// and the promise about observing an election (P9).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  Jetlock,
  LeaseLostError,
  LockedError,
  ReleasedError,
  SessionClosedError,
  InvalidRequestError,
  type LeaderChange,
  type Lease,
} from "../src/index.js";
import { Cluster, eventually, unique } from "./cluster.js";

let cluster: Cluster;
let jl: Jetlock;
let other: Jetlock;
let operator: Jetlock;

before(async () => {
  cluster = await Cluster.start();
  jl = await Jetlock.connect({ servers: cluster.servers });
  other = await Jetlock.connect({ servers: cluster.servers });
  operator = await Jetlock.connect({ servers: cluster.servers, user: "operator", pass: "operator" });
});

after(async () => {
  for (const c of [jl, other, operator]) await c?.close().catch(() => undefined);
  await cluster?.stop();
});

describe("lock sets", () => {
  it("acquireAll grants all or nothing, with a token per resource", async () => {
    const [a, b, c] = [unique("set"), unique("set"), unique("set")];
    const set = await jl.acquireAll([b, a], { ttlMs: 5000 });
    assert.deepEqual(set.resources, [a, b].sort());
    // A set has no single token: the compiler refuses one where a fenced token is needed.
    // @ts-expect-error SetLease has no token
    assert.equal(set.token, undefined);
    assert.equal("fenceKey" in set, false);
    assert.deepEqual(set.fenced(a), { fenceKey: a, token: set.tokenOf(a) });
    assert.ok(set.tokenOf(a)! > 0 && set.tokenOf(b)! > 0);
    assert.equal(set.tokenOf(c), undefined);
    // A set overlapping a held one gets nothing at all.
    await assert.rejects(other.tryAcquireAll([b, c]), (err: unknown) => {
      assert.ok(err instanceof LockedError);
      assert.deepEqual(err.holders.map((h) => h.resource), [b]);
      assert.equal(err.holders[0]!.token, set.tokenOf(b));
      return true;
    });
    assert.equal((await jl.status(c)).held, false, "half a set is never granted");
    // A waiting set is granted whole when the holder releases.
    const waiting = other.acquireAll([c, b], { waitMs: 60_000 });
    await eventually("the set queued", async () => (await jl.status(b)).waiters === 1);
    assert.equal(await set.release(), true);
    const next = await waiting;
    assert.ok(next.tokenOf(b)! > set.tokenOf(b)!);
    assert.equal((await jl.status(c)).token, next.tokenOf(c));
    await next.release();
  });

  it("a set is lost whole when one of its resources is revoked", async () => {
    const [a, b] = [unique("set-revoke"), unique("set-revoke")];
    const set = await jl.acquireAll([a, b], { ttlMs: 3000 });
    await operator.revoke(a, "ts test: set");
    await eventually("the set's signal aborted", () => set.signal.aborted);
    assert.ok(set.signal.reason instanceof LeaseLostError);
    await set.release();
  });

  it("a bad set is refused before anything is sent", async () => {
    const a = unique("set-bad");
    await assert.rejects(jl.acquireAll([a]), InvalidRequestError);
    await assert.rejects(jl.acquireAll([a, a]), InvalidRequestError);
    await assert.rejects(jl.acquireAll([a, "bad name"]), InvalidRequestError);
    assert.equal((await jl.status(a)).held, false);
  });
});

describe("sessions", () => {
  it("leases in a session live with one keepalive and end when it closes", async () => {
    const [a, b] = [unique("sess"), unique("sess")];
    const s = await jl.session({ ttlMs: 3000, owner: "ts-session" });
    const la = await s.acquire(a, { owner: "in-session" });
    const set = await s.acquireAll([b, unique("sess")]);
    const st = await jl.status(a);
    assert.equal(st.inSession, true);
    assert.equal(st.sessionOwner, "ts-session");
    const before = s.expiresAt.getTime();
    await s.renewed(); // keepalives run by themselves
    assert.ok(s.expiresAt.getTime() > before);
    assert.equal(la.signal.aborted, false);
    // The lease's deadline is the session's (or earlier). Each getter reads
    // the wall clock (whole ms) and the monotonic clock at its own instant:
    // the two can differ by the rounding of one millisecond.
    assert.ok(la.expiresAt.getTime() <= s.expiresAt.getTime() + 1);
    await assert.rejects(s.acquire(unique("sess"), { ttlMs: 1000 } as never), InvalidRequestError);
    // Releasing one lease leaves the session and the others.
    assert.equal(await set.release(), true);
    assert.equal(la.signal.aborted, false);
    assert.equal(await s.close(), true);
    assert.ok(s.signal.reason instanceof SessionClosedError);
    assert.ok(la.signal.reason instanceof ReleasedError);
    assert.equal((await jl.status(a)).held, false);
    await assert.rejects(s.acquire(unique("sess")), SessionClosedError);
  });

  it("a session's waiter is granted in the session, and its wait ends with the session", async () => {
    const r = unique("sess-wait");
    const holder = await other.acquire(r);
    await using s = await jl.session({ ttlMs: 5000 });
    const waiting = s.acquire(r, { waitMs: 60_000 });
    await eventually("queued", async () => (await jl.status(r)).waiters === 1);
    await holder.release();
    const lease = await waiting;
    assert.equal((await jl.status(r)).inSession, true);
    const h2 = await other.tryAcquire(unique("sess-wait")); // unrelated
    await h2.release();
    const blocker = await other.acquire(unique("sess-wait"));
    const w2 = s.acquire(blocker.resource, { waitMs: 60_000 });
    await eventually("queued", async () => (await jl.status(blocker.resource)).waiters === 1);
    const refused = assert.rejects(w2, SessionClosedError);
    await s.close();
    await refused;
    assert.ok(lease.signal.aborted);
    await eventually("the wait ended with the session", async () => (await jl.status(blocker.resource)).waiters === 0);
    await blocker.release();
  });
});

describe("semaphores", () => {
  it("permits are never over the limit, and a release hands one to the next waiter", async () => {
    const name = unique("sem");
    const sem = jl.semaphore(name, 2);
    const p1 = await sem.acquire({ owner: "p1" });
    const p2 = await other.semaphore(name, 2).acquire({ owner: "p2" });
    assert.deepEqual([p1.permit, p2.permit].sort(), [1, 2]);
    assert.equal(p1.fenceKey, `${name}#${p1.permit}`);
    await assert.rejects(sem.tryAcquire(), (err: unknown) => err instanceof LockedError && err.limit === 2);
    await assert.rejects(jl.semaphore(name, 3).tryAcquire(), InvalidRequestError);
    // Many waiters, never more than two holders at once.
    let holding = 0;
    let most = 0;
    const work = async (c: Jetlock, i: number) => {
      const p = await c.semaphore(name, 2).acquire({ waitMs: 60_000, owner: `w${i}` });
      holding++;
      most = Math.max(most, holding);
      const st = await sem.status();
      assert.ok(st.held <= 2);
      await new Promise((r) => setTimeout(r, 20));
      holding--;
      await p.release();
    };
    const all = [0, 1, 2, 3, 4].map((i) => work(i % 2 ? jl : other, i));
    await eventually("waiters queued", async () => (await sem.status()).waiters >= 1);
    await p1.release();
    await p2.release();
    await Promise.all(all);
    assert.ok(most <= 2 && most >= 1, `at most 2 holders at once (saw ${most})`);
    const st = await sem.status();
    assert.equal(st.held, 0);
  });

  it("a permit's tokens rise per permit", async () => {
    const name = unique("sem-token");
    const sem = jl.semaphore(name, 1);
    const a = await sem.acquire();
    await a.release();
    const b = await sem.acquire();
    assert.equal(b.permit, 1);
    assert.ok(b.token > a.token);
    await b.release();
  });
});

describe("elections", () => {
  it("campaign, proclaim, leader and resign hand the election to the next candidate", async () => {
    const name = unique("elect");
    const e1 = jl.election(name, { ttlMs: 5000 });
    const e2 = other.election(name, { ttlMs: 5000 });
    assert.equal(await e1.leader(), null);
    const l1 = await e1.campaign("node-1:7000");
    assert.equal((await e2.leader())?.value, "node-1:7000");
    const second = e2.campaign("node-2:7000");
    await eventually("candidate 2 queued", async () => (await jl.status(name)).waiters === 1);
    await l1.proclaim("node-1:7001");
    const info = await e2.leader();
    assert.equal(info?.value, "node-1:7001");
    assert.equal(info?.token, l1.token, "proclaim keeps the token");
    assert.equal(await e1.resign(), true);
    const l2 = await second;
    assert.ok(l2.token > l1.token);
    assert.equal((await e1.leader())?.value, "node-2:7000");
    await assert.rejects(e1.proclaim("x"), LeaseLostError);
    await l2.resign();
    assert.equal(await e1.leader(), null);
  });

  it("P9: observe delivers leaders in revision order, never goes back, and ends with its signal", async () => {
    const name = unique("observe");
    const ac = new AbortController();
    const seen: LeaderChange[] = [];
    const watcher = (async () => {
      for await (const ch of other.election(name).observe({ signal: ac.signal })) seen.push(ch);
    })();
    await eventually("the first state", () => seen.length === 1);
    assert.deepEqual(seen[0], { leader: false, token: 0, event: "ended", resync: true });
    const tokens: number[] = [];
    for (let i = 0; i < 3; i++) {
      const l = await jl.election(name, { ttlMs: 5000 }).campaign(`v${i}`);
      await l.proclaim(`v${i}-b`);
      tokens.push(l.token);
      await l.resign();
    }
    await eventually("every change", () => seen.filter((c) => c.event === "ended").length >= 4);
    ac.abort();
    await watcher; // the iterator ends with the signal
    const leaders = seen.filter((c) => c.leader);
    for (let i = 1; i < seen.length; i++) {
      if (seen[i]!.revision !== undefined && seen[i - 1]!.revision !== undefined) {
        assert.ok(seen[i]!.revision! > seen[i - 1]!.revision!, "revision order");
      }
      assert.ok(seen[i]!.token >= seen[i - 1]!.token, "never an older leader");
    }
    assert.deepEqual(
      leaders.map((c) => `${c.event} ${c.value}`),
      ["elected v0", "proclaimed v0-b", "elected v1", "proclaimed v1-b", "elected v2", "proclaimed v2-b"],
    );
    assert.deepEqual([...new Set(leaders.map((c) => c.token))], tokens);
  });

  it("P9: observe ends when the connection closes", async () => {
    const name = unique("observe-close");
    const own = await Jetlock.connect({ servers: cluster.servers });
    const seen: LeaderChange[] = [];
    const watcher = (async () => {
      for await (const ch of own.election(name).observe()) seen.push(ch);
    })();
    await eventually("the first state", () => seen.length === 1);
    await own.close();
    await watcher;
  });

  it("a leadership held in a session ends with the session", async () => {
    const name = unique("elect-session");
    const s = await jl.session({ ttlMs: 3000 });
    const ld = await s.election(name).campaign("in-session");
    assert.equal((await jl.election(name).leader())?.inSession, true);
    await ld.proclaim("still-in-session");
    assert.equal((await jl.election(name).leader())?.value, "still-in-session");
    await s.close();
    assert.ok(ld.signal.aborted);
    assert.equal(await jl.election(name).leader(), null);
  });
});

describe("revoke", () => {
  it("a caller's revoke is forbidden and changes nothing; list shows the held leases", async () => {
    const r = unique("list");
    const lease: Lease = await jl.acquire(r, { owner: "lister" });
    await assert.rejects(jl.revoke(r, "not an operator"), (err: unknown) => (err as { code?: string }).code === "forbidden");
    assert.equal((await jl.status(r)).token, lease.token);
    const listed = [];
    for await (const st of jl.list(r)) listed.push(st);
    assert.equal(listed.length, 1);
    assert.equal(listed[0]!.resource, r);
    assert.equal(listed[0]!.owner, "lister");
    await lease.release();
  });
});
