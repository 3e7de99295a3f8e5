// jetlock from JavaScript: acquire, renew, release and fenced writes with
// the official `nats` package and plain request-reply, following the wire
// contract (docs/protocol.md) — no jetlock library needed.
//
//   npm ci && node jetlock.mjs nats://127.0.0.1:4222
//
// The fenced store here is a stand-in for your resource (a database row, a
// file, an object store): it keeps the highest token it accepted per
// resource and refuses writes with a smaller one.
import { connect, JSONCodec } from "nats";
import { randomUUID } from "node:crypto";

const servers = process.argv[2] ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const prefix = process.env.JETLOCK_PREFIX ?? "jetlock";
const resource = process.argv[3] ?? "orders/js-1";
const jc = JSONCodec();

// JetlockError carries the contract's error code ("locked", "lease_lost",
// "invalid_request", "too_many_waiters", "unavailable", "internal").
class JetlockError extends Error {
  constructor(code, message, holder) {
    super(`${code}: ${message}`);
    this.code = code;
    this.holder = holder;
  }
}

// call sends one request to the service and returns the decoded reply, or
// throws a JetlockError for an error reply (micro's Nats-Service-Error-Code
// header and a {"error":{...}} body).
async function call(nc, op, body, timeout = 5000) {
  let msg;
  try {
    msg = await nc.request(`${prefix}.v1.${op}`, jc.encode(body), { timeout });
  } catch (err) {
    // No reply: the outcome is unknown; retry with the same ids.
    throw new JetlockError("unavailable", err.message);
  }
  const reply = jc.decode(msg.data);
  if (msg.headers?.get("Nats-Service-Error-Code")) {
    const e = reply.error ?? {};
    throw new JetlockError(e.code ?? "internal", e.message ?? msg.headers.get("Nats-Service-Error"), e.holder);
  }
  return reply;
}

// acquire tries once (no wait_ms) with a request_id chosen once per
// logical acquire: a retry after "unavailable" must reuse it.
async function acquire(nc, owner, ttlMs) {
  const requestId = randomUUID();
  for (let attempt = 0; ; attempt++) {
    try {
      return await call(nc, "acquire", { resource, request_id: requestId, owner, ttl_ms: ttlMs });
    } catch (err) {
      if (err.code !== "unavailable" || attempt >= 3) throw err;
    }
  }
}

// A fenced store: highest accepted token per resource, checked in the same
// step as the write.
class FencedStore {
  #highest = new Map();
  #data = new Map();
  write(res, token, value) {
    const highest = this.#highest.get(res) ?? 0;
    if (token < highest) {
      return { ok: false, highest };
    }
    this.#highest.set(res, token);
    this.#data.set(res, value);
    return { ok: true, highest: token };
  }
  read(res) {
    return this.#data.get(res);
  }
}

function fencedWrite(store, token, value) {
  const r = store.write(resource, token, value);
  if (r.ok) {
    console.log(`write ${JSON.stringify(value)} with token ${token}: accepted`);
  } else {
    console.log(`write ${JSON.stringify(value)} with token ${token}: REFUSED (stale: token ${r.highest} was accepted)`);
  }
  return r.ok;
}

async function main() {
  const nc = await connect({ servers, name: "jetlock-js-example" });
  const store = new FencedStore();
  try {
    const first = await acquire(nc, "js-example", 10000);
    // Keep first.lease_id secret: it alone renews and releases the lease.
    console.log(`acquired ${first.resource}: token ${first.token}, ttl ${first.ttl_ms} ms`);

    try {
      await acquire(nc, "someone-else", 10000);
      throw new Error("a second acquire of a held resource succeeded");
    } catch (err) {
      if (err.code !== "locked") throw err;
      console.log(`second acquire: locked by ${err.holder.owner} (token ${err.holder.token})`);
    }

    // A holder renews well before its TTL ends (a third of it is usual).
    const renewed = await call(nc, "renew", { resource, lease_id: first.lease_id, ttl_ms: 15000 });
    console.log(`renewed ${renewed.resource}: token ${renewed.token}, ttl ${renewed.ttl_ms} ms`);

    fencedWrite(store, first.token, "written by the first holder");

    const rel = await call(nc, "release", { resource, lease_id: first.lease_id });
    console.log(`released ${rel.resource}: ${rel.released}`);

    const second = await acquire(nc, "js-example-2", 10000);
    console.log(`acquired ${second.resource} again: token ${second.token}`);
    fencedWrite(store, second.token, "written by the second holder");

    // The first holder, unaware that it lost the lock (say it was paused),
    // writes late with its old token: the store refuses it.
    if (fencedWrite(store, first.token, "late write by the first holder")) {
      throw new Error("the stale write was accepted");
    }
    console.log(`store holds ${JSON.stringify(store.read(resource))}`);

    // The first lease is gone: renewing it is lease_lost.
    try {
      await call(nc, "renew", { resource, lease_id: first.lease_id });
      throw new Error("renewing a released lease succeeded");
    } catch (err) {
      if (err.code !== "lease_lost") throw err;
      console.log(`renew of the first lease: ${err.code}`);
    }

    const st = await call(nc, "status", { resource });
    console.log(`status: held ${st.held} by ${st.owner}, token ${st.token}`);
    await call(nc, "release", { resource, lease_id: second.lease_id });
    console.log("done");
  } finally {
    await nc.close();
  }
}

main().catch((err) => {
  console.error(`jetlock-js: ${err.message}`);
  process.exit(1);
});
