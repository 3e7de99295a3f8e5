// The client: requests and their retries, and the acquire that every
// primitive (lock, lock set, permit, campaign, session lease) is made of.
import { connect, errors as natsErrors, type NatsConnection, type NodeConnectionOptions } from "@nats-io/transport-node";
import { randomBytes } from "node:crypto";
import {
  ForbiddenError,
  InternalError,
  InvalidRequestError,
  JetlockError,
  LeaseLostError,
  LockedError,
  UnavailableError,
  fromWire,
  type WireError,
} from "./errors.js";
import { Life, jitter, sleep, stamp, systemClock, timeoutSignal, type Clock, type Stamp } from "./life.js";
import { Lease, type LeaseInit } from "./lease.js";
import { Session, type SessionOptions } from "./session.js";
import { Semaphore } from "./semaphore.js";
import { Election, type ElectionOptions } from "./election.js";
import {
  checkLimit,
  checkMs,
  checkResource,
  checkSet,
  checkText,
  defaultMaxSetSize,
  maxOwnerLen,
  maxReasonLen,
  maxRequestIdLen,
  maxSetSize,
  maxValueLen,
  maxWaitChunkMs,
  minSetSize,
} from "./validate.js";

/** Options of a client. */
export interface JetlockOptions {
  /** The subject prefix of the service (lockd --prefix). Default "jetlock". */
  prefix?: string;
  /** How long one request waits for its reply; a waiting acquire waits this much longer than its wait. Default 5000. */
  requestTimeoutMs?: number;
  /**
   * How long before the end of its TTL the client stops trusting a lease: its deadline is the send time of the
   * last successful acquire or renewal plus the TTL minus this margin (at most a quarter of the TTL). Default 1000.
   */
  safetyMarginMs?: number;
  /** How many times a request whose outcome is unknown is retried with the same ids. Default 4. */
  retries?: number;
  /** The largest lock set acquireAll accepts before sending anything (2 to 256). Default 64, the service's default cap. */
  maxSetSize?: number;
  /** The clocks the client reads (for tests that simulate a suspended host). Default performance.now() and Date.now(). */
  clock?: Clock;
}

/** Options of an acquire (acquire, tryAcquire, withLock, acquireAll, a semaphore's acquire). */
export interface AcquireOptions {
  /** The lease's TTL in ms (1000–600000 by default at the service). Default: the service's, 30000. Not with a session. */
  ttlMs?: number;
  /** Free text naming the holder, shown to your own tenant and operators. At most 128 bytes. */
  owner?: string;
  /**
   * The id of this logical acquire, reused on every retry of it. Default: random. Set it to find the same lease
   * again after a restart; never share one id between processes.
   */
  requestId?: string;
  /** The longest this lease may be held, renewals included. Default: the service's cap (24 h). */
  maxHoldMs?: number;
  /** How long to wait in the queue (acquire only). Default: no bound but `signal`. */
  waitMs?: number;
  /** Gives up the call: it rejects with the signal's reason at once, and the wait is cancelled at the service. */
  signal?: AbortSignal;
}

/** A resource's state as the service sees it. A read: never decide from it who holds a lock. */
export interface Status {
  resource: string;
  held: boolean;
  /** Shown to the lease's own tenant and to operators only. */
  owner?: string;
  token: number;
  expiresAt?: Date;
  waiters: number;
  holdUntil?: Date;
  inSession: boolean;
  sessionOwner?: string;
  /** For a member of a lock set, the size of the set. */
  setSize?: number;
  /** An election's leader value. */
  value?: string;
  /** In a list, the permit of a semaphore. */
  permit?: number;
}

/** The outcome of revoke. */
export interface Revocation {
  resource: string;
  /** false: nobody held it. */
  revoked: boolean;
  /** The token of the lease that ended. */
  token?: number;
}

/** Internal: what one acquire asks for. */
export interface AcquireSpec {
  resource?: string;
  set?: string[];
  limit?: number;
  value?: string;
  session?: Session;
  requestId: string;
  owner: string;
  ttlMs?: number;
  maxHoldMs?: number;
  signal?: AbortSignal;
  make?: (init: LeaseInit) => Lease;
}

/** The reply to a grant (one resource, a set, a permit). */
export interface GrantReply {
  resource?: string;
  lease_id: string;
  token?: number;
  ttl_ms: number;
  expires_at: string;
  hold_until?: string;
  permit?: number;
  resources?: { resource: string; token: number }[];
}

export function newRequestId(): string {
  return randomBytes(16).toString("hex");
}

function parseDate(s: string | undefined): Date | undefined {
  if (!s) return undefined;
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? undefined : d;
}

export function toStatus(r: any): Status {
  return {
    resource: r.resource,
    held: !!r.held || r.held === undefined,
    owner: r.owner || undefined,
    token: r.token ?? 0,
    expiresAt: parseDate(r.expires_at),
    waiters: r.waiters ?? 0,
    holdUntil: parseDate(r.hold_until),
    inSession: !!r.in_session,
    sessionOwner: r.session_owner || undefined,
    setSize: r.set_size || undefined,
    value: r.value || undefined,
    permit: r.permit || undefined,
  };
}

function aborted(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/**
 * Jetlock is a client of the jetlock service. Make one with {@link Jetlock.connect} (it owns its connection) or
 * `new Jetlock(nc)` on a connection the application has (the client never closes it).
 */
export class Jetlock {
  /** The NATS connection the client sends its requests on. */
  readonly nc: NatsConnection;
  readonly prefix: string;
  readonly requestTimeoutMs: number;
  readonly safetyMarginMs: number;
  readonly retries: number;
  readonly maxSetSize: number;
  readonly clock: Clock;
  readonly #owned: boolean;
  /** Cleanup running after the call that started it returned (cancels, releases): close() waits for it. */
  readonly #background = new Set<Promise<unknown>>();
  /** Requests waiting for a reply, by subject: a publish the server refuses fails them at once. */
  readonly #pending = new Map<string, Set<(err: Error) => void>>();
  readonly #statusWatch: { stop(): void };
  /** The lives (of leases and sessions) still kept: close() ends them. */
  readonly #lives = new Set<Life>();

  constructor(nc: NatsConnection, options: JetlockOptions = {}, owned = false) {
    this.nc = nc;
    this.#owned = owned;
    this.prefix = options.prefix ?? "jetlock";
    if (!/^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$/.test(this.prefix)) {
      throw new InvalidRequestError(`jetlock: invalid option: prefix ${JSON.stringify(this.prefix)}`);
    }
    this.requestTimeoutMs = checkMs("requestTimeoutMs", options.requestTimeoutMs) ?? 5000;
    this.safetyMarginMs = checkMs("safetyMarginMs", options.safetyMarginMs, 0) ?? 1000;
    this.retries = checkMs("retries", options.retries, 0) ?? 4;
    this.maxSetSize = options.maxSetSize ?? defaultMaxSetSize;
    if (!Number.isSafeInteger(this.maxSetSize) || this.maxSetSize < minSetSize || this.maxSetSize > maxSetSize) {
      throw new InvalidRequestError(`jetlock: invalid option: maxSetSize ${this.maxSetSize} outside [${minSetSize}, ${maxSetSize}]`);
    }
    this.clock = options.clock ?? systemClock;
    this.#statusWatch = this.#watchRefusals();
  }

  /** connect opens a NATS connection with `options` and returns a client that owns it (close() closes it). */
  static async connect(options: NodeConnectionOptions = {}, jetlock: JetlockOptions = {}): Promise<Jetlock> {
    const nc = await connect(options);
    try {
      return new Jetlock(nc, jetlock, true);
    } catch (err) {
      await nc.close();
      throw err;
    }
  }

  /**
   * close waits (bounded by the request timeout) for the cleanup still running (cancels of abandoned waits,
   * releases), stops watching the connection, and closes it if the client opened it. Leases still held are
   * not released: release them first.
   */
  async close(): Promise<void> {
    const pending = [...this.#background];
    if (pending.length > 0) {
      await Promise.race([Promise.allSettled(pending), sleep(this.requestTimeoutMs)]);
    }
    this.#statusWatch.stop();
    const closed = new LeaseLostError("jetlock: lease lost: the client was closed");
    for (const life of [...this.#lives]) life.markLost(closed);
    if (this.#owned && !this.nc.isClosed()) await this.nc.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** background runs cleanup after the call that needs it has returned, bounded in time; close() waits for it. */
  background(p: Promise<unknown>): void {
    const q = p.catch(() => undefined).finally(() => this.#background.delete(q));
    this.#background.add(q);
  }

  /** newLife returns the life of a lease or session of this client; close() ends it. */
  newLife(what: string): Life {
    const life = new Life(what, this.safetyMarginMs, this.clock);
    this.#lives.add(life);
    life.rawSignal.addEventListener("abort", () => this.#lives.delete(life), { once: true });
    return life;
  }

  /** The number of cleanups still running (cancels, releases of abandoned grants). */
  get pendingCleanup(): number {
    return this.#background.size;
  }

  #watchRefusals(): { stop(): void } {
    const it = this.nc.status() as AsyncIterable<{ type: string }> & { stop(): void };
    (async () => {
      for await (const s of it) {
        if (s.type === "disconnect" || s.type === "reconnect") {
          // A reply to a request sent before the connection dropped, or while it was down, may never come (the
          // server that would route it, or the service instance that was serving it, is gone): fail the requests
          // now as unknown outcomes, which their callers send again with the same ids.
          const lost = new UnavailableError("jetlock: service unavailable: the connection to the NATS server dropped");
          for (const waiting of this.#pending.values()) for (const fail of waiting) fail(lost);
          continue;
        }
        if (s.type !== "error") continue;
        const err = (s as { error?: unknown }).error;
        if (err instanceof natsErrors.PermissionViolationError && err.operation === "publish") {
          const waiting = this.#pending.get(err.subject);
          if (!waiting) continue;
          const refused = new ForbiddenError(`jetlock: permission denied: publish to ${JSON.stringify(err.subject)} refused by the NATS server`, { cause: err });
          for (const fail of waiting) fail(refused);
        }
      }
    })().catch(() => undefined);
    return { stop: () => it.stop() };
  }

  /**
   * call sends one request and returns its decoded reply. An error reply becomes the matching typed error; no
   * reply (timeout, no responders, a closed connection) becomes UnavailableError: the outcome is unknown. When
   * signal aborts, call rejects with its reason at once.
   */
  async call<T>(op: string, body: object, opts: { extraMs?: number; signal?: AbortSignal; about?: string } = {}): Promise<T> {
    const subject = `${this.prefix}.v1.${op}`;
    const signal = opts.signal;
    if (signal?.aborted) throw aborted(signal);
    const data = new TextEncoder().encode(JSON.stringify(body));
    let fail!: (err: unknown) => void;
    const failed = new Promise<never>((_, reject) => (fail = reject));
    failed.catch(() => undefined);
    const onAbort = () => fail(aborted(signal!));
    signal?.addEventListener("abort", onAbort, { once: true });
    let set = this.#pending.get(subject);
    if (!set) this.#pending.set(subject, (set = new Set()));
    set.add(fail);
    try {
      let msg;
      try {
        const req = this.nc.request(subject, data, { timeout: this.requestTimeoutMs + (opts.extraMs ?? 0) });
        req.catch(() => undefined);
        msg = await Promise.race([req, failed]);
      } catch (err) {
        if (err instanceof JetlockError || signal?.aborted) throw err;
        for (let e: unknown = err; e instanceof Error; e = e.cause) {
          if (e instanceof natsErrors.PermissionViolationError) {
            throw new ForbiddenError(`jetlock: permission denied: publish to ${JSON.stringify(subject)} refused by the NATS server`, { cause: err });
          }
        }
        throw new UnavailableError(`jetlock: service unavailable: ${op} request: ${(err as Error).message}`, undefined, { cause: err });
      }
      const code = msg.headers?.get("Nats-Service-Error-Code");
      let reply: any;
      try {
        reply = msg.data.length > 0 ? JSON.parse(new TextDecoder().decode(msg.data)) : {};
      } catch {
        if (!code) throw new InternalError(`jetlock: internal service error: ${op}: bad reply`);
      }
      if (code) {
        throw fromWire(code, msg.headers?.get("Nats-Service-Error") ?? "", reply?.error as WireError | undefined, opts.about ?? "");
      }
      return reply as T;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      set.delete(fail);
      if (set.size === 0) this.#pending.delete(subject);
    }
  }

  /**
   * retry runs fn until it throws something other than UnavailableError, at most 1+retries times (or, with
   * untilMs, until that many ms have passed), with jittered backoff, or the service's retry_after_ms when longer.
   */
  async retry<T>(fn: () => Promise<T>, signal?: AbortSignal, untilMono?: number): Promise<T> {
    let backoff = 50;
    for (let attempt = 0; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        if (!(err instanceof UnavailableError)) throw err;
        if (signal?.aborted) throw aborted(signal);
        const now = this.clock.monotonic();
        if (untilMono === undefined ? attempt >= this.retries : now >= untilMono) throw err;
        let pause = Math.max(jitter(backoff), err.retryAfterMs ?? 0);
        if (untilMono !== undefined) pause = Math.min(pause, untilMono - now);
        await sleep(pause, signal);
        if (signal?.aborted) throw aborted(signal);
        backoff = Math.min(backoff * 2, 1000);
      }
    }
  }

  /** readAcquire checks the options every acquire shares. */
  readAcquire(opts: AcquireOptions, session?: Session): Omit<AcquireSpec, "resource" | "set" | "limit" | "value"> {
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
   * acquire acquires resource, waiting in its FIFO queue while others hold it, until it is granted, the signal
   * aborts (then the wait is cancelled at the service and the call rejects with the signal's reason), or
   * waitMs passes (a LockedError).
   */
  acquire(resource: string, opts: AcquireOptions = {}): Promise<Lease> {
    return this.run(() => ({ ...this.readAcquire(opts), resource: checkResource(resource) }), opts.waitMs ?? null);
  }

  /** tryAcquire makes one attempt and returns at once: a lease, or a LockedError naming the holder. */
  tryAcquire(resource: string, opts: Omit<AcquireOptions, "waitMs"> = {}): Promise<Lease> {
    return this.run(() => ({ ...this.readAcquire(opts), resource: checkResource(resource) }), 0);
  }

  /**
   * withLock acquires resource (waiting as acquire does), runs fn with the lease, and releases it when fn
   * returns or throws. fn should stop when lease.signal aborts and fence its writes with lease.token.
   */
  async withLock<T>(resource: string, fn: (lease: Lease) => Promise<T> | T, opts: AcquireOptions = {}): Promise<T> {
    const lease = await this.acquire(resource, opts);
    try {
      return await fn(lease);
    } finally {
      await lease.release().catch(() => undefined);
    }
  }

  /**
   * acquireAll acquires every resource as one lock set, all or none, waiting as acquire does. The lease has a
   * token per resource (lease.tokenOf, lease.tokens); it is renewed, released and lost whole.
   */
  acquireAll(resources: string[], opts: AcquireOptions = {}): Promise<Lease> {
    return this.run(() => ({ ...this.readAcquire(opts), set: checkSet(resources, this.maxSetSize) }), opts.waitMs ?? null);
  }

  /** tryAcquireAll makes one attempt at a lock set: the lease, or a LockedError whose holders name every held member. */
  tryAcquireAll(resources: string[], opts: Omit<AcquireOptions, "waitMs"> = {}): Promise<Lease> {
    return this.run(() => ({ ...this.readAcquire(opts), set: checkSet(resources, this.maxSetSize) }), 0);
  }

  /** session opens a session: many leases kept alive by one keepalive, lost together. */
  session(opts: SessionOptions = {}): Promise<Session> {
    return Session.open(this, opts);
  }

  /** semaphore returns the counting semaphore name of limit permits (1–1000); every user must give the same limit. */
  semaphore(name: string, limit: number): Semaphore {
    return new Semaphore(this, undefined, checkResource(name, "semaphore"), checkLimit(limit));
  }

  /** election returns the election name; its options apply to every campaign. */
  election(name: string, opts: ElectionOptions = {}): Election {
    return new Election(this, undefined, checkResource(name, "election"), opts);
  }

  /** status returns the service's view of resource (held: false when nobody holds it). */
  async status(resource: string, opts: { signal?: AbortSignal } = {}): Promise<Status> {
    checkResource(resource);
    const r = await this.retry(() => this.call<any>("status", { resource }, { signal: opts.signal, about: resource }), opts.signal);
    return toStatus(r);
  }

  /** list yields the held leases whose resource starts with prefix, in resource order, a page at a time. */
  async *list(prefix = "", opts: { pageSize?: number; signal?: AbortSignal } = {}): AsyncGenerator<Status> {
    const limit = opts.pageSize ?? 100;
    if (!Number.isSafeInteger(limit) || limit < 1 || limit > 1000) {
      throw new InvalidRequestError(`jetlock: invalid request: pageSize ${limit} outside [1, 1000]`);
    }
    let after = "";
    for (let page = 0; page < 1_000_000; page++) {
      const body: Record<string, unknown> = { limit };
      if (prefix) body.prefix = prefix;
      if (after) body.after = after;
      const r = await this.retry(() => this.call<any>("list", body, { signal: opts.signal }), opts.signal);
      for (const l of r.leases ?? []) yield toStatus({ ...l, held: true });
      if (!r.next) return;
      after = r.next;
    }
  }

  /**
   * revoke ends the current lease of resource (or of one permit of a semaphore), whoever holds it. Operators
   * only: anyone else gets a ForbiddenError. reason (1–256 bytes) goes to the audit log.
   */
  async revoke(resource: string, reason: string, opts: { permit?: number; signal?: AbortSignal } = {}): Promise<Revocation> {
    checkResource(resource);
    checkText("reason", reason, maxReasonLen, true);
    const body: Record<string, unknown> = { resource, reason };
    if (opts.permit !== undefined) body.permit = checkLimit(opts.permit);
    const r = await this.retry(() => this.call<any>("admin.revoke", body, { signal: opts.signal, about: resource }), opts.signal);
    return { resource: r.resource, revoked: !!r.revoked, token: r.token || undefined };
  }

  // ---- the acquire every primitive is made of ----

  /**
   * run is an acquire: read checks the input (an error there is thrown before anything is sent); wait is 0
   * for one attempt, a bound in ms, or null for no bound but the signal. A long wait is several waiting
   * requests with the same request_id.
   */
  async run(read: () => AcquireSpec, wait: number | null): Promise<Lease> {
    const spec = read();
    if (wait !== null && wait !== 0) checkMs("waitMs", wait);
    const signal = spec.session ? AbortSignal.any([spec.signal, spec.session.rawSignal].filter((s): s is AbortSignal => !!s)) : spec.signal;
    if (spec.session) spec.session.throwIfEnded();
    if (signal?.aborted) throw aborted(signal);
    const until = wait === null ? undefined : this.clock.monotonic() + wait;
    try {
      for (let round = 0; ; round++) {
        const chunk = until === undefined ? maxWaitChunkMs : Math.max(0, Math.min(maxWaitChunkMs, Math.round(until - this.clock.monotonic())));
        try {
          return await this.#once(spec, chunk, signal, until);
        } catch (err) {
          if (!(err instanceof LockedError) || chunk < maxWaitChunkMs) throw err;
          // The service's wait ended with no bound of ours reached: ask again, same request_id.
        }
      }
    } catch (err) {
      if (spec.session && !spec.signal?.aborted) spec.session.throwIfEnded();
      throw err;
    }
  }

  /** #once sends one logical acquire (waiting up to chunk ms), retrying an unknown outcome with the same request_id. */
  async #once(spec: AcquireSpec, chunk: number, signal: AbortSignal | undefined, until: number | undefined): Promise<Lease> {
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
    let sent: Stamp = stamp(this.clock);
    let reply: GrantReply;
    try {
      // A wait rides out an unavailable service until its own end; one attempt retries a few times.
      const waitUntil = chunk > 0 ? (until ?? Infinity) : undefined;
      reply = await this.retry(
        () => {
          sent = stamp(this.clock);
          if (chunk > 0 && until !== undefined) {
            // A retry asks for what is left of the wait, so the wait never outlasts its bound.
            body.wait_ms = Math.max(0, Math.min(chunk, Math.round(until - sent.mono)));
            if (body.wait_ms === 0) delete body.wait_ms;
          }
          return this.call<GrantReply>("acquire", body, { extraMs: chunk, signal, about: spec.resource ?? spec.set?.[0] });
        },
        signal,
        waitUntil,
      );
    } catch (err) {
      if (err instanceof UnavailableError || signal?.aborted) this.abandon(spec);
      if (err instanceof LockedError) throw this.#aboutLocked(err, spec);
      throw err;
    }
    let lease: Lease;
    try {
      lease = this.#newLease(spec, reply, sent);
    } catch (err) {
      this.abandon(spec); // a grant the client cannot use: give it back
      throw err;
    }
    if (signal?.aborted) {
      // Granted in the moment the caller gave up: nothing is left held.
      this.background(lease.release());
      throw aborted(signal);
    }
    try {
      await lease.start(chunk > 0, signal);
    } catch (err) {
      // Granted, but not provably held any more (or given up): give it back.
      this.background(lease.release());
      throw err;
    }
    return lease;
  }

  #aboutLocked(err: LockedError, spec: AcquireSpec): LockedError {
    if (spec.limit !== undefined) {
      return new LockedError(`jetlock: semaphore ${spec.resource} has no free permit (limit ${spec.limit})`, spec.resource!, [], spec.limit);
    }
    if (spec.set) {
      const names = err.holders.map((h) => `${h.resource}${h.owner ? ` by ${JSON.stringify(h.owner)}` : ""} (token ${h.token})`);
      return new LockedError(`jetlock: lock set of ${spec.set.length} resources is locked: ${names.join(", ") || "holders not named by the service"}`, err.resource, err.holders);
    }
    return err;
  }

  #newLease(spec: AcquireSpec, r: GrantReply, sent: Stamp): Lease {
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
    const init: LeaseInit = {
      jl: this,
      resource: spec.resource,
      set: spec.set,
      tokens,
      permit: spec.limit !== undefined ? r.permit : undefined,
      value: spec.value,
      leaseId: r.lease_id,
      ttlWant: spec.ttlMs,
      maxHoldMs: spec.maxHoldMs,
      session: spec.session,
      sent,
      reply: r,
      life: this.newLife(spec.session ? "keepalive" : "renewal"),
    };
    return spec.make ? spec.make(init) : new Lease(init);
  }

  /**
   * abandon cancels an acquire whose caller gave up or whose outcome stayed unknown, so that a grant nobody
   * will use is released and a wait leaves the queue. It runs in the background, bounded by the request timeout
   * and the retries: the call that gave up does not wait for it.
   */
  abandon(spec: AcquireSpec): void {
    const body: Record<string, unknown> = {};
    if (spec.set) body.resources = spec.set;
    else body.resource = spec.resource;
    body.request_id = spec.requestId;
    if (spec.owner) body.owner = spec.owner;
    if (spec.limit !== undefined) body.limit = spec.limit;
    const bound = timeoutSignal(this.requestTimeoutMs * 2);
    this.background(this.retry(() => this.call("cancel", body, { signal: bound }), bound));
  }

  /** checkValue checks a candidate's value: 1–1024 bytes of text without control characters. */
  static checkValue(value: string): string {
    return checkText("value", value, maxValueLen, true);
  }
}
