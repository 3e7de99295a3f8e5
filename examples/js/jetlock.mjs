// jetlock from JavaScript with the TypeScript client (@jetlock/client, in
// client/js): a lease that renews itself, a holder told by the service,
// release, and fenced writes.
//
//   (cd ../../client/js && npm ci)    # its prepare script builds dist/
//   npm ci && node jetlock.mjs nats://127.0.0.1:4222
//
// The fence here (MemoryFence) stands in for your resource (a database
// row, a file, an object store): it keeps the highest token it accepted
// per resource and refuses writes with a smaller one.
import { Jetlock, LockedError, MemoryFence, StaleTokenError } from "@jetlock/client";

const servers = (process.argv[2] ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222").split(",");
const prefix = process.env.JETLOCK_PREFIX ?? "jetlock";
const resource = process.argv[3] ?? "orders/js-1";

async function fencedWrite(fence, token, value) {
  try {
    await fence.do(resource, token, () => value);
    console.log(`write ${JSON.stringify(value)} with token ${token}: accepted`);
    return true;
  } catch (err) {
    if (!(err instanceof StaleTokenError)) throw err;
    console.log(`write ${JSON.stringify(value)} with token ${token}: REFUSED (stale: token ${err.highest} was accepted)`);
    return false;
  }
}

async function main() {
  const jl = await Jetlock.connect({ servers, name: "jetlock-js-example" }, { prefix });
  try {
    await run(jl);
  } finally {
    await jl.close();
  }
}

async function run(jl) {
  const fence = new MemoryFence();
  const data = new Map();

  // The lease renews itself at a third of its TTL until released or lost.
  const first = await jl.tryAcquire(resource, { owner: "js-example", ttlMs: 3000 });
  console.log(`acquired ${first.resource}: token ${first.token}, ttl ${first.ttlMs} ms`);

  try {
    await jl.tryAcquire(resource, { owner: "someone-else" });
    throw new Error("a second acquire of a held resource succeeded");
  } catch (err) {
    if (!(err instanceof LockedError)) throw err;
    console.log(`second acquire: locked by ${err.holder.owner} (token ${err.holder.token})`);
  }

  await first.renewed();
  console.log(`renewed ${first.resource} by itself: token ${first.token}, ttl ${first.ttlMs} ms`);

  if (await fencedWrite(fence, first.token, "written by the first holder")) data.set(resource, "written by the first holder");

  console.log(`released ${first.resource}: ${await first.release()}`);
  console.log(`first lease's signal: ${first.signal.reason.code}`);

  const second = await jl.acquire(resource, { owner: "js-example-2", ttlMs: 10000 });
  console.log(`acquired ${second.resource} again: token ${second.token}`);
  if (await fencedWrite(fence, second.token, "written by the second holder")) data.set(resource, "written by the second holder");

  // The first holder, unaware that it lost the lock (say it was paused),
  // writes late with its old token: the fence refuses it.
  if (await fencedWrite(fence, first.token, "late write by the first holder")) {
    throw new Error("the stale write was accepted");
  }
  console.log(`store holds ${JSON.stringify(data.get(resource))}`);

  const st = await jl.status(resource);
  console.log(`status: held ${st.held} by ${st.owner}, token ${st.token}`);
  await second.release();
  console.log("done");
}

main().catch((err) => {
  console.error(`jetlock-js: ${err.message}`);
  process.exit(1);
});
