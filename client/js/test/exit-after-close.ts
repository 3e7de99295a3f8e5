// A program that starts everything a client can have running (a held
// lease renewing itself, a waiting acquire, a session, an observer), closes
// its clients, and then just returns: Node must exit by itself, since close()
// leaves nothing pending. Run by close.test.ts with the servers as argv[2].
import { Jetlock } from "../src/index.js";

const servers = process.argv[2]!.split(",");
const a = await Jetlock.connect({ servers });
const b = await Jetlock.connect({ servers });
const r = `ts/exit/${process.pid}`;
const lease = await a.acquire(r, { ttlMs: 30_000 });
const waiting = b.acquire(r, { ttlMs: 30_000 });
const settled = waiting.then(
  () => "granted",
  (err: Error) => err.name,
);
await new Promise((ok) => setTimeout(ok, 300)); // let the wait reach the service
const session = await b.session({ ttlMs: 30_000 });
await session.acquire(`${r}/s`);
const seen: string[] = [];
let first!: () => void;
const gotFirst = new Promise<void>((ok) => (first = ok));
const observing = (async () => {
  for await (const ch of b.election(`${r}/e`).observe()) {
    seen.push(ch.event);
    first();
  }
})();
await gotFirst;
await b.close();
await a.close();
await observing;
console.log(`wait: ${await settled}; lease: ${(lease.signal.reason as Error).name}; session: ${(session.signal.reason as Error).name}; observed: ${seen.length}`);
