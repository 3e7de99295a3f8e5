// The whole cluster stopped and started again under held leases and a
// waiter: the loss signal fires before the lease's deadline (P3), a lease
// rides out an outage shorter than its deadline (P7), and a wait rides
// out the restart (P8).
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Jetlock, LeaseLostError, type Lease } from "../src/index.js";
import { Cluster, eventually, unique } from "./cluster.js";

let cluster: Cluster;
let jl: Jetlock;
let other: Jetlock;

const reconnect = { maxReconnectAttempts: -1, reconnectTimeWait: 100 };

before(async () => {
  cluster = await Cluster.start();
  jl = await Jetlock.connect({ servers: cluster.servers, ...reconnect });
  other = await Jetlock.connect({ servers: cluster.servers, ...reconnect });
});

after(async () => {
  for (const c of [jl, other]) await c?.close().catch(() => undefined);
  await cluster?.stop();
});

describe("outage", () => {
  const r = { short: unique("short"), long: unique("long"), queue: unique("queue") };
  let short: Lease;
  let long: Lease;
  let holder: Lease;
  let waiter: Promise<Lease>;

  it("P3: when the cluster is stopped, the signal aborts before the lease's deadline", async () => {
    short = await jl.acquire(r.short, { ttlMs: 3000 });
    long = await jl.acquire(r.long, { ttlMs: 30_000 });
    holder = await jl.acquire(r.queue, { ttlMs: 30_000 });
    waiter = other.acquire(r.queue, { waitMs: 120_000, owner: "p8-waiter" });
    waiter.catch(() => undefined);
    await eventually("the waiter queued", async () => (await jl.status(r.queue)).waiters === 1);
    await short.renewed();
    let abortedAt = 0;
    short.signal.addEventListener("abort", () => (abortedAt = Date.now()));
    const serviceExpiry = short.serviceExpiresAt.getTime(); // from the last renewal the service confirmed
    await cluster.kill();
    await eventually("the short lease's signal aborted", () => abortedAt > 0);
    assert.ok(short.signal.reason instanceof LeaseLostError);
    assert.ok(abortedAt < serviceExpiry, `aborted ${serviceExpiry - abortedAt} ms before the service's expiry`);
  });

  it("P7: an outage that ends before the client's deadline does not end the lease", async () => {
    assert.equal(long.signal.aborted, false, "the outage has lasted less than the long lease's deadline");
    await cluster.restart();
    await long.renewed(); // renewals retried fast through the outage, and one went through
    assert.equal(long.signal.aborted, false);
    const st = await jl.status(r.long);
    assert.equal(st.token, long.token);
    assert.equal(await long.release(), true);
  });

  it("P8: a wait rides out the service's restart until its own deadline", async () => {
    assert.equal(holder.signal.aborted, false);
    await holder.release();
    const lease = await waiter;
    assert.ok(lease.token > holder.token);
    assert.equal((await jl.status(r.queue)).owner, "p8-waiter");
    await lease.release();
  });
});
