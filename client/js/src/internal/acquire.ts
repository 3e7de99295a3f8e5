// The acquire every primitive is made of (a lock, a lock set, a permit, a
// campaign, a session's lease), which the package does not export: input
// checked before anything is sent, a wait that may be several requests
// with one request_id, and the cancel of a wait that was given up.
import { ClientClosedError, InternalError, InvalidRequestError, LockedError, UnavailableError } from "../errors.js";
import type { AcquireOptions } from "../types.js";
import { Life, stamp, timeoutSignal, type Stamp } from "./life.js";
import { aborted, newRequestId, type Core, type SessionRef } from "./core.js";
import { Held, type AcquireSpec, type GrantReply } from "./held.js";
import { checkMs, checkText, maxOwnerLen, maxRequestIdLen, maxWaitChunkMs } from "./validate.js";

/** @internal readAcquire checks the options every acquire shares. */
export function readAcquire(opts: AcquireOptions, session?: SessionRef): Omit<AcquireSpec, "resource" | "set" | "limit" | "value"> {
  if (session && opts.ttlMs !== undefined) {
    throw new InvalidRequestError("jetlock: invalid request: ttlMs with a session: a session's lease lives as long as its session");
  }
  return {
    requestId: checkText("request_id", opts.requestId, maxRequestIdLen, false) || newRequestId(),
    owner: checkText("owner", opts.owner, maxOwnerLen, false),
    ttlMs: checkMs("ttl_ms", opts.ttlMs),
    maxHoldMs: checkMs("max_hold_ms", opts.maxHoldMs),
    signal: opts.signal,
    session,
  };
}

/**
 * @internal
 * acquire runs one acquire: read checks the input (an error there is thrown before anything is sent); wait is 0
 * for one attempt, a bound in ms, or null for no bound but the signal. The whole call is bounded by the wait plus
 * the client's timeout. make turns the kept grant into what the caller gets.
 */
export async function acquire<T>(core: Core, read: () => AcquireSpec, wait: number | null, make: (held: Held) => T): Promise<T> {
  const spec = read();
  if (wait !== null && wait !== 0) checkMs("waitMs", wait);
  core.throwIfClosed();
  if (spec.session) spec.session.throwIfEnded();
  const given = spec.session ? AbortSignal.any([spec.signal, spec.session.life.rawSignal].filter((s): s is AbortSignal => !!s)) : spec.signal;
  if (given?.aborted) throw aborted(given);
  const b = core.bound(spec.set ? "acquire of a lock set" : `acquire ${spec.resource}`, given, wait === null ? Infinity : wait);
  const signal = b.signal;
  const until = wait === null ? undefined : core.clock.monotonic() + wait;
  try {
    for (let round = 0; ; round++) {
      const chunk = until === undefined ? maxWaitChunkMs : Math.max(0, Math.min(maxWaitChunkMs, Math.round(until - core.clock.monotonic())));
      try {
        return make(await once(core, spec, chunk, signal, until));
      } catch (err) {
        if (!(err instanceof LockedError) || chunk < maxWaitChunkMs) throw err;
        // The service's wait ended with no bound of ours reached: ask again, same request_id.
      }
    }
  } catch (err) {
    if (spec.session && !spec.signal?.aborted) spec.session.throwIfEnded();
    throw err;
  } finally {
    b.done();
  }
}

/** once sends one logical acquire (waiting up to chunk ms), retrying an unknown outcome with the same request_id. */
async function once(core: Core, spec: AcquireSpec, chunk: number, signal: AbortSignal, until: number | undefined): Promise<Held> {
  const body: Record<string, unknown> = {};
  if (spec.set) body.resources = spec.set;
  else body.resource = spec.resource;
  body.request_id = spec.requestId;
  if (spec.owner) body.owner = spec.owner;
  if (spec.ttlMs !== undefined) body.ttl_ms = spec.ttlMs;
  if (chunk > 0) body.wait_ms = chunk;
  if (spec.maxHoldMs !== undefined) body.max_hold_ms = spec.maxHoldMs;
  if (spec.limit !== undefined) body.limit = spec.limit;
  if (spec.value !== undefined) body.value = spec.value;
  if (spec.session) body.session_id = spec.session.id;
  let sent: Stamp = stamp(core.clock);
  let reply: GrantReply;
  try {
    // A wait rides out an unavailable service until its own end; one attempt retries a few times.
    const waitUntil = chunk > 0 ? (until ?? Infinity) : undefined;
    reply = await core.retry(
      () => {
        sent = stamp(core.clock);
        if (chunk > 0 && until !== undefined) {
          // A retry asks for what is left of the wait, so the wait never outlasts its bound.
          body.wait_ms = Math.max(0, Math.min(chunk, Math.round(until - sent.mono)));
          if (body.wait_ms === 0) delete body.wait_ms;
        }
        return core.call<GrantReply>("acquire", body, { extraMs: chunk, signal, about: spec.resource ?? spec.set?.[0] });
      },
      signal,
      waitUntil,
    );
  } catch (err) {
    if (err instanceof UnavailableError || err instanceof ClientClosedError || signal.aborted) abandon(core, spec);
    if (err instanceof LockedError) throw aboutLocked(err, spec);
    throw err;
  }
  let held: Held;
  try {
    held = newHeld(core, spec, reply, sent);
  } catch (err) {
    abandon(core, spec); // a grant the client cannot use: give it back
    throw err;
  }
  if (signal.aborted || core.closed) {
    // Granted in the moment the caller gave up, or the client closed: nothing is left held.
    core.background(held.release());
    throw signal.aborted ? aborted(signal) : new ClientClosedError();
  }
  try {
    await held.start(chunk > 0, signal);
  } catch (err) {
    // Granted, but not provably held any more (or given up): give it back.
    core.background(held.release());
    throw err;
  }
  return held;
}

function aboutLocked(err: LockedError, spec: AcquireSpec): LockedError {
  if (spec.limit !== undefined) {
    return new LockedError(`jetlock: semaphore ${spec.resource} has no free permit (limit ${spec.limit})`, spec.resource!, [], spec.limit);
  }
  if (spec.set) {
    const names = err.holders.map((h) => `${h.resource}${h.owner ? ` by ${JSON.stringify(h.owner)}` : ""} (token ${h.token})`);
    return new LockedError(`jetlock: lock set of ${spec.set.length} resources is locked: ${names.join(", ") || "holders not named by the service"}`, err.resource, err.holders);
  }
  return err;
}

function newHeld(core: Core, spec: AcquireSpec, r: GrantReply, sent: Stamp): Held {
  if (typeof r.lease_id !== "string" || r.lease_id === "" || !(r.ttl_ms > 0)) {
    throw new InternalError("jetlock: internal service error: acquire: bad reply (no lease_id or ttl_ms)");
  }
  let tokens: Map<string, number>;
  if (spec.set) {
    tokens = new Map((r.resources ?? []).map((m) => [m.resource, m.token]));
    if (tokens.size !== spec.set.length || spec.set.some((n) => !(tokens.get(n)! > 0))) {
      throw new InternalError("jetlock: internal service error: lock set: bad reply: the tokens do not name the set");
    }
  } else {
    if (!(typeof r.token === "number" && r.token > 0)) throw new InternalError("jetlock: internal service error: acquire: bad reply (no token)");
    tokens = new Map([[spec.resource!, r.token]]);
  }
  if (spec.limit !== undefined && !(Number.isSafeInteger(r.permit) && r.permit! >= 1 && r.permit! <= spec.limit)) {
    throw new InternalError(`jetlock: internal service error: semaphore ${spec.resource}: bad reply: permit ${r.permit} of ${spec.limit}`);
  }
  return new Held({
    core,
    spec,
    tokens,
    permit: spec.limit !== undefined ? r.permit : undefined,
    leaseId: r.lease_id,
    sent,
    reply: r,
    life: new Life(spec.session ? "keepalive" : "renewal", core.safetyMarginMs, core.clock),
  });
}

/**
 * @internal
 * abandon cancels an acquire whose caller gave up or whose outcome stayed unknown, so that a grant nobody will use
 * is released and a wait leaves the queue. It runs in the background, bounded by twice the client's timeout: the
 * call that gave up does not wait for it, close() does.
 */
export function abandon(core: Core, spec: AcquireSpec): void {
  const body: Record<string, unknown> = {};
  if (spec.set) body.resources = spec.set;
  else body.resource = spec.resource;
  body.request_id = spec.requestId;
  if (spec.owner) body.owner = spec.owner;
  if (spec.limit !== undefined) body.limit = spec.limit;
  const bound = timeoutSignal(core.timeoutMs * 2);
  core.background(core.retry(() => core.call("cancel", body, { signal: bound, cleanup: true }), bound));
}
