// Bad input and the contract's errors (P10), on a lockd --dev with small
// caps: one waiter per resource, and one acquire a second per owner.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  Jetlock,
  InvalidRequestError,
  JetlockError,
  TooManyWaitersError,
  UnavailableError,
} from "../src/index.js";
import { Cluster, eventually, unique } from "./cluster.js";

let cluster: Cluster;
let jl: Jetlock;

before(async () => {
  cluster = await Cluster.start(["--max-waiters-per-resource", "1", "--owner-rate", "1"]);
  jl = await Jetlock.connect({ servers: cluster.servers });
});

after(async () => {
  await jl?.close().catch(() => undefined);
  await cluster?.stop();
});

function invalid(err: unknown): boolean {
  return err instanceof InvalidRequestError && err.code === "invalid_request";
}

describe("P10: errors are typed with the contract's codes", () => {
  it("P10: bad input is refused with invalid_request before anything is sent", async () => {
    const r = unique("bad");
    const calls: [string, () => Promise<unknown>][] = [
      ["empty resource", () => jl.acquire("")],
      ["a space", () => jl.acquire("a b")],
      ["leading dot", () => jl.tryAcquire(".x")],
      ["201 bytes", () => jl.tryAcquire("x".repeat(201))],
      ["long owner", () => jl.tryAcquire(r, { owner: "o".repeat(129) })],
      ["control character", () => jl.tryAcquire(r, { requestId: "a\nb" })],
      ["fractional ttl", () => jl.tryAcquire(r, { ttlMs: 1500.5 })],
      ["negative wait", () => jl.acquire(r, { waitMs: -1 })],
      ["limit 0", () => Promise.resolve().then(() => jl.semaphore(r, 0))],
      ["limit 1001", () => Promise.resolve().then(() => jl.semaphore(r, 1001))],
      ["empty value", () => jl.election(r).campaign("")],
      ["long value", () => jl.election(r).campaign("v".repeat(1025))],
      ["set of one", () => jl.acquireAll([r])],
      ["set of 65", () => jl.acquireAll(Array.from({ length: 65 }, (_, i) => `${r}-${i}`))],
      ["revoke without reason", () => jl.revoke(r, "")],
    ];
    for (const [what, call] of calls) {
      await assert.rejects(call(), invalid, what);
    }
    const st = await jl.status(r);
    assert.equal(st.held, false);
    assert.equal(st.waiters, 0);
  });

  it("P10: what only the service can judge is refused by it with invalid_request, and nothing changes", async () => {
    const r = unique("bounds");
    for (const opts of [{ ttlMs: 500 }, { ttlMs: 700_000 }, { ttlMs: 5000, maxHoldMs: 100 }]) {
      await assert.rejects(jl.acquire(r, opts), (err: unknown) => invalid(err) && /jetlock: /.test((err as Error).message), JSON.stringify(opts));
    }
    assert.equal((await jl.status(r)).held, false);
  });

  it("P10: too_many_waiters when a waiter cap is reached", async () => {
    const r = unique("cap");
    const holder = await jl.acquire(r, { owner: "cap-holder" });
    const ac = new AbortController();
    const first = jl.acquire(r, { waitMs: 60_000, signal: ac.signal, owner: "cap-1" });
    first.catch(() => undefined);
    await eventually("one waiter", async () => (await jl.status(r)).waiters === 1);
    await new Promise((ok) => setTimeout(ok, 1100)); // keep under the owner rate
    await assert.rejects(jl.acquire(r, { waitMs: 60_000, owner: "cap-2" }), (err: unknown) => err instanceof TooManyWaitersError && err.code === "too_many_waiters");
    ac.abort();
    await holder.release();
  });

  it("P10: unavailable carries retry_after_ms, and the client backs off as it says", async () => {
    const hasty = await Jetlock.connect({ servers: cluster.servers }, { retries: 0 });
    try {
      let refused: UnavailableError | undefined;
      for (let i = 0; i < 20 && !refused; i++) {
        try {
          const l = await hasty.tryAcquire(unique("rate"), { owner: "greedy" });
          await l.release();
        } catch (err) {
          if (!(err instanceof UnavailableError)) throw err;
          refused = err;
        }
      }
      assert.ok(refused, "the owner's rate refused an acquire");
      assert.equal(refused.code, "unavailable");
      assert.ok(refused.retryAfterMs! > 0, "with retry_after_ms");
      assert.ok(refused instanceof JetlockError);
    } finally {
      await hasty.close();
    }
    // With retries, the same owner's acquire waits as told and gets through.
    const lease = await jl.tryAcquire(unique("rate"), { owner: "greedy" });
    assert.ok(lease.token > 0);
    await lease.release();
  });
});
