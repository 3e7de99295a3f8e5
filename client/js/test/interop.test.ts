// The Go and TypeScript clients on one cluster: a lock held from Go blocks
// TypeScript and the reverse, a TypeScript waiter is woken by a Go
// release, and one election has candidates in both.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Jetlock, LockedError, type LeaderChange } from "../src/index.js";
import { Cluster, GoHelper, eventually, unique } from "./cluster.js";

let cluster: Cluster;
let jl: Jetlock;
let go: GoHelper;

before(async () => {
  cluster = await Cluster.start();
  jl = await Jetlock.connect({ servers: cluster.servers });
  go = new GoHelper(cluster.servers);
});

after(async () => {
  await go?.close();
  await jl?.close().catch(() => undefined);
  await cluster?.stop();
});

describe("interop with the Go client", () => {
  it("a lock held from Go blocks TypeScript", async () => {
    const r = unique("go-holds");
    const answer = await go.send("acquire", r, "10000", "0", "go-holder");
    const m = /^granted (\d+)$/.exec(answer);
    assert.ok(m, answer);
    await assert.rejects(jl.tryAcquire(r), (err: unknown) => {
      assert.ok(err instanceof LockedError);
      assert.equal(err.holder?.owner, "go-holder");
      assert.equal(err.holder?.token, Number(m[1]));
      return true;
    });
    assert.equal(await go.send("release", r), "released");
  });

  it("a lock held from TypeScript blocks Go", async () => {
    const r = unique("ts-holds");
    const lease = await jl.acquire(r, { owner: "ts-holder" });
    assert.equal(await go.send("acquire", r, "10000", "0", "go-try"), `locked ts-holder ${lease.token}`);
    await lease.release();
  });

  it("a TypeScript waiter is woken by a Go release", async () => {
    const r = unique("go-release");
    const granted = /^granted (\d+)$/.exec(await go.send("acquire", r, "10000", "0", "go-holder"));
    assert.ok(granted);
    const waiting = jl.acquire(r, { waitMs: 60_000 });
    await eventually("the TypeScript waiter queued", async () => (await jl.status(r)).waiters === 1);
    assert.equal(await go.send("release", r), "released");
    const lease = await waiting;
    assert.ok(lease.token > Number(granted[1]));
    await lease.release();
  });

  it("one election has candidates in both, elected in the order they queued", async () => {
    const name = unique("mixed-election");
    const ac = new AbortController();
    const seen: LeaderChange[] = [];
    const watcher = (async () => {
      for await (const ch of jl.election(name).observe({ signal: ac.signal })) seen.push(ch);
    })();
    const ts = jl.election(name, { ttlMs: 10_000 });
    const first = await ts.campaign("ts-candidate");
    const goElected = go.send("campaign", name, "go-candidate");
    await eventually("the Go candidate queued", async () => (await jl.status(name)).waiters === 1);
    await first.resign();
    const m = /^elected (\d+)$/.exec(await goElected);
    assert.ok(m);
    assert.ok(Number(m[1]) > first.token);
    assert.equal((await ts.leader())?.value, "go-candidate");
    const again = ts.campaign("ts-again");
    await eventually("the TypeScript candidate queued", async () => (await jl.status(name)).waiters === 1);
    assert.equal(await go.send("resign", name), "resigned");
    const second = await again;
    assert.ok(second.token > Number(m[1]));
    await eventually("the observer saw three leaders", () => seen.filter((c) => c.event === "elected").length >= 3);
    ac.abort();
    await watcher;
    assert.deepEqual(
      seen.filter((c) => c.event === "elected").map((c) => c.value),
      ["ts-candidate", "go-candidate", "ts-again"],
    );
    await second.resign();
  });
});
