// What a client leaves behind: close() ends what it started (P11), every
// promise settles (P12), observe() leaves nothing when it ends (P13), calls
// are bounded as a whole by default and their failures typed (P14).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect } from "@nats-io/transport-node";
import {
  ClientClosedError,
  Jetlock,
  LeaseLostError,
  ReleasedError,
  SessionClosedError,
  UnavailableError,
  type LeaderChange,
} from "../src/index.js";
import { Cluster, Path, eventually, freePort, unique } from "./cluster.js";

let cluster: Cluster;
let jl: Jetlock;
let operator: Jetlock;

before(async () => {
  cluster = await Cluster.start();
  jl = await Jetlock.connect({ servers: cluster.servers });
  operator = await Jetlock.connect({ servers: cluster.servers, user: "operator", pass: "operator" });
});

after(async () => {
  for (const c of [jl, operator]) await c?.close().catch(() => undefined);
  await cluster?.stop();
});

/** settledWithin resolves with how p settled, or "pending" when it did not within ms. */
async function settledWithin<T>(p: Promise<T>, ms: number): Promise<{ value?: T; error?: unknown } | "pending"> {
  let t: ReturnType<typeof setTimeout> | undefined;
  const timer = new Promise<"pending">((ok) => (t = setTimeout(() => ok("pending"), ms)));
  try {
    return await Promise.race([p.then((value) => ({ value }), (error: unknown) => ({ error })), timer]);
  } finally {
    clearTimeout(t);
  }
}

describe("P11: close() ends what the client started", () => {
  it("P11: a waiting acquire rejects with ClientClosedError within 3 s of close(), and its wait is gone from the service", async () => {
    const r = unique("close-wait");
    const holder = await jl.acquire(r);
    const c = await Jetlock.connect({ servers: cluster.servers });
    const waiting = c.acquire(r, { owner: "closed-waiter" }); // no waitMs, no signal: only close() ends it
    await eventually("the waiter queued", async () => (await jl.status(r)).waiters === 1);
    const closing = c.close();
    const got = await settledWithin(waiting, 3000);
    assert.notEqual(got, "pending", "the wait settled within 3 s of close()");
    assert.ok(got !== "pending" && got.error instanceof ClientClosedError, `rejected with ClientClosedError, got ${String(got !== "pending" && got.error)}`);
    assert.equal((got.error as ClientClosedError).code, "closed");
    await closing;
    assert.equal((await jl.status(r)).waiters, 0, "close() waited for the cancel: the wait is gone from the service");
    await holder.release();
    assert.equal((await jl.status(r)).held, false, "nothing was granted to the closed client");
  });

  it("P11: every call on a closed client rejects at once with ClientClosedError, and close() again is the same", async () => {
    const c = await Jetlock.connect({ servers: cluster.servers });
    await c.close();
    const r = unique("closed");
    const calls: [string, () => Promise<unknown>][] = [
      ["acquire", () => c.acquire(r)],
      ["acquire with a wait", () => c.acquire(r, { waitMs: 60_000 })],
      ["tryAcquire", () => c.tryAcquire(r)],
      ["acquireAll", () => c.acquireAll([r, `${r}-2`])],
      ["status", () => c.status(r)],
      ["session", () => c.session()],
      ["semaphore", () => c.semaphore(r, 2).acquire()],
      ["campaign", () => c.election(r).campaign("v")],
      ["leader", () => c.election(r).leader()],
      ["revoke", () => c.revoke(r, "why")],
    ];
    for (const [what, call] of calls) {
      const got = await settledWithin(call(), 1000);
      assert.ok(got !== "pending" && got.error instanceof ClientClosedError, `${what}: rejected at once with ClientClosedError`);
    }
    await c.close();
  });

  it("P11: close() releases the leases still held and closes the sessions, bounded; another client gets them at once", async () => {
    const [r, rs, rset] = [unique("close-held"), unique("close-sess"), unique("close-set")];
    const c = await Jetlock.connect({ servers: cluster.servers }, { timeoutMs: 3000 });
    const lease = await c.acquire(r, { ttlMs: 60_000 });
    const set = await c.acquireAll([rset, `${rset}-2`], { ttlMs: 60_000 });
    const session = await c.session({ ttlMs: 60_000 });
    const inSession = await session.acquire(rs);
    await c.close();
    assert.ok(lease.signal.reason instanceof ReleasedError);
    assert.ok(set.signal.reason instanceof ReleasedError);
    assert.ok(session.signal.reason instanceof SessionClosedError);
    assert.ok(inSession.signal.reason instanceof ReleasedError);
    for (const res of [r, rs, rset, `${rset}-2`]) {
      const l = await jl.tryAcquire(res); // not after a TTL of 60 s: at once
      await l.release();
    }
  });

  it("P11: on a connection the application owns, close() ends the client's calls and leaves the connection open", async () => {
    const r = unique("close-shared");
    const holder = await jl.acquire(r);
    const nc = await connect({ servers: cluster.servers });
    try {
      const c = new Jetlock(nc);
      const waiting = c.acquire(r);
      waiting.catch(() => undefined); // awaited below, after close()
      await eventually("the waiter queued", async () => (await jl.status(r)).waiters === 1);
      await c.close();
      const got = await settledWithin(waiting, 1000);
      assert.ok(got !== "pending" && got.error instanceof ClientClosedError);
      assert.equal(nc.isClosed(), false, "the application's connection stays open");
      assert.equal((await jl.status(r)).waiters, 0);
      await new Jetlock(nc).status(r); // and works for another client
    } finally {
      await nc.close();
      await holder.release();
    }
  });

  it("P11: after close() nothing keeps Node alive: a program that closes its clients exits by itself", async () => {
    const script = join(dirname(fileURLToPath(import.meta.url)), "exit-after-close.js");
    const child = spawn(process.execPath, [script, cluster.servers.join(",")], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    const exited = new Promise<number | null>((ok) => child.on("exit", (code) => ok(code)));
    // A generous bound: what this guards against is a process that never exits (a renewal loop, a wait that
    // retries forever, a timer), not a slow one.
    const code = await settledWithin(exited, 30_000);
    if (code === "pending") child.kill("SIGKILL");
    assert.notEqual(code, "pending", `the program did not exit after close():\n${out}`);
    assert.equal(code !== "pending" && code.value, 0, out);
    assert.match(out, /^wait: ClientClosedError; lease: ReleasedError; session: SessionClosedError; observed: 1$/m);
  });
});

describe("P12: every promise a client method returns settles", () => {
  it("P12: renewed() rejects with the loss within 2 s of a revoke, taken before or after the loss", async () => {
    const r = unique("renewed-revoke");
    const lease = await jl.acquire(r, { ttlMs: 3000 });
    const before = lease.renewed();
    await operator.revoke(r, "ts test: renewed");
    const got = await settledWithin(before, 2000);
    assert.ok(got !== "pending", "renewed() taken before the loss settled within 2 s of the revoke");
    assert.ok(got.error instanceof LeaseLostError, `rejected with LeaseLostError, got ${String(got.error)}`);
    const later = await settledWithin(lease.renewed(), 100);
    assert.ok(later !== "pending" && later.error instanceof LeaseLostError, "renewed() taken after the loss rejects at once");
  });

  it("P12: renewed() rejects when the lease is released, or when its session ends", async () => {
    const lease = await jl.acquire(unique("renewed-release"), { ttlMs: 30_000 });
    const p = lease.renewed();
    p.catch(() => undefined); // awaited below
    await lease.release();
    const got = await settledWithin(p, 1000);
    assert.ok(got !== "pending" && got.error instanceof ReleasedError);
    const s = await jl.session({ ttlMs: 30_000 });
    const inSession = await s.acquire(unique("renewed-session"));
    const ps = inSession.renewed();
    const pss = s.renewed();
    ps.catch(() => undefined); // awaited below
    pss.catch(() => undefined);
    await s.close();
    for (const [what, q] of [["the lease's", ps], ["the session's", pss]] as const) {
      const g = await settledWithin(q, 1000);
      assert.ok(g !== "pending" && g.error !== undefined, `${what} renewed() rejected when the session closed`);
    }
  });
});

describe("P13: observe() leaves nothing behind when it ends", () => {
  it("P13: 4,000 observe() calls that end leave the heap within 1 MB of where it started", async () => {
    const gc = (globalThis as { gc?: () => void }).gc;
    assert.ok(gc, "run with node --expose-gc (npm test does)");
    const e = jl.election(unique("observe-heap"));
    const once = async () => {
      for await (const ch of e.observe()) {
        assert.equal((ch as LeaderChange).event, "ended");
        break; // ends the observer
      }
    };
    for (let i = 0; i < 200; i++) await once(); // warm up: code, caches, the connection's buffers
    const settle = async () => {
      for (let i = 0; i < 3; i++) {
        await new Promise((ok) => setImmediate(ok));
        gc!();
      }
      return process.memoryUsage().heapUsed;
    };
    const start = await settle();
    for (let i = 0; i < 4000; i++) await once();
    const end = await settle();
    assert.ok(end - start < 1024 * 1024, `the heap grew by ${end - start} bytes over 4,000 observers`);
  });
});

describe("P14: calls are bounded as a whole by default, and their failures typed", () => {
  it("P14: with the cluster out of reach, a call rejects with UnavailableError within its timeout, all attempts included", async () => {
    const path = await Path.open(cluster.ports[0]!);
    try {
      const c = await Jetlock.connect({ servers: [path.url] }, { timeoutMs: 1000 });
      const r = unique("bounded");
      const lease = await c.acquire(r, { ttlMs: 30_000 });
      path.pause(); // frozen: nothing in or out, the connection stays
      for (const [what, call] of [
        ["status", () => c.status(r)],
        ["tryAcquire", () => c.tryAcquire(unique("bounded"))],
      ] as [string, () => Promise<unknown>][]) {
        const t0 = performance.now();
        await assert.rejects(call(), UnavailableError, what);
        const took = performance.now() - t0;
        // Five attempts of a second each would take five seconds: one bound covers them all.
        assert.ok(took < 2500, `${what} took ${Math.round(took)} ms with a timeout of 1000 ms`);
      }
      // await using exits within the timeout too, not after the lease's TTL.
      const t0 = performance.now();
      {
        await using held = lease;
        void held;
      }
      assert.ok(performance.now() - t0 < 2500, "await using returned within the timeout");
      assert.ok(lease.signal.reason instanceof ReleasedError);
      path.resume();
      await c.close();
    } finally {
      path.close();
    }
  });

  it("P14: a connection that cannot be made is an UnavailableError carrying the NATS client's error", async () => {
    const port = await freePort(); // nobody listens there
    await assert.rejects(Jetlock.connect({ servers: `nats://127.0.0.1:${port}`, timeout: 1000 }), (err: unknown) => {
      assert.ok(err instanceof UnavailableError, `got ${String(err)}`);
      assert.equal(err.code, "unavailable");
      assert.ok(err.cause instanceof Error, "the cause is kept");
      return true;
    });
  });
});
