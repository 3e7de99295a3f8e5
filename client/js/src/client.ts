// The client: the calls a user makes. The transport and the acquire engine
// they share live in core.ts and acquire.ts, which the package does not
// export.
import { connect, type NatsConnection, type NodeConnectionOptions } from "@nats-io/transport-node";
import { acquire, readAcquire } from "./internal/acquire.js";
import { Core, toStatus } from "./internal/core.js";
import type { AcquireOptions, Clock, Status } from "./types.js";
import { Election, type ElectionOptions } from "./election.js";
import { InvalidRequestError, UnavailableError } from "./errors.js";
import { Lease, SetLease } from "./lease.js";
import { systemClock } from "./internal/life.js";
import { Semaphore } from "./semaphore.js";
import { openSession, type Session, type SessionOptions } from "./session.js";
import { checkLimit, checkMs, checkResource, checkSet, checkText, defaultMaxSetSize, maxReasonLen, maxSetSize, minSetSize } from "./internal/validate.js";

/** Options of a client. */
export interface JetlockOptions {
  /** The subject prefix of the service (lockd --prefix). Default "jetlock". */
  prefix?: string;
  /**
   * The longest a call takes, all its attempts included (a request whose outcome is unknown is sent again with
   * the same ids within it): then it rejects with an UnavailableError. A waiting acquire takes its wait plus this;
   * one without waitMs waits until its signal. close() is bounded by it too. Default 5000.
   */
  timeoutMs?: number;
  /**
   * How long before the end of its TTL the client stops trusting a lease: its deadline is the send time of the
   * last successful acquire or renewal plus the TTL minus this margin (at most a quarter of the TTL). Default 1000.
   */
  safetyMarginMs?: number;
  /** How many times a request whose outcome is unknown is retried with the same ids, within timeoutMs. Default 4. */
  retries?: number;
  /** The largest lock set acquireAll accepts before sending anything (2 to 256). Default 64, the service's default cap. */
  maxSetSize?: number;
  /** The clocks the client reads (for tests that simulate a suspended host). Default performance.now() and Date.now(). */
  clock?: Clock;
}

/** The outcome of revoke. */
export interface Revocation {
  resource: string;
  /** false: nobody held it. */
  revoked: boolean;
  /** The token of the lease that ended. */
  token?: number;
}

/** Connections that Jetlock.connect opened, handed to the constructor: the client closes them. */
const opened = new WeakSet<NatsConnection>();

/**
 * Jetlock is a client of the jetlock service. Make one with {@link Jetlock.connect} (it owns its connection) or
 * `new Jetlock(nc)` on a connection the application has (the client never closes it). Close it when done:
 * `await using jl = await Jetlock.connect(...)` does.
 */
export class Jetlock {
  readonly #core: Core;

  constructor(nc: NatsConnection, options: JetlockOptions = {}) {
    const prefix = options.prefix ?? "jetlock";
    if (!/^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$/.test(prefix)) {
      throw new InvalidRequestError(`jetlock: invalid option: prefix ${JSON.stringify(prefix)}`);
    }
    const max = options.maxSetSize ?? defaultMaxSetSize;
    if (!Number.isSafeInteger(max) || max < minSetSize || max > maxSetSize) {
      throw new InvalidRequestError(`jetlock: invalid option: maxSetSize ${max} outside [${minSetSize}, ${maxSetSize}]`);
    }
    const owned = opened.has(nc);
    opened.delete(nc);
    this.#core = new Core(
      nc,
      {
        prefix,
        timeoutMs: checkMs("timeoutMs", options.timeoutMs) ?? 5000,
        safetyMarginMs: checkMs("safetyMarginMs", options.safetyMarginMs, 0) ?? 1000,
        retries: checkMs("retries", options.retries, 0) ?? 4,
        maxSetSize: max,
        clock: options.clock ?? systemClock,
      },
      owned,
    );
  }

  /**
   * connect opens a NATS connection with `options` and returns a client that owns it (close() closes it). A
   * connection that cannot be made rejects with an UnavailableError whose cause is the NATS client's error.
   */
  static async connect(options: NodeConnectionOptions = {}, jetlock: JetlockOptions = {}): Promise<Jetlock> {
    let nc: NatsConnection;
    try {
      nc = await connect(options);
    } catch (err) {
      throw new UnavailableError(`jetlock: service unavailable: cannot connect to NATS: ${(err as Error)?.message ?? err}`, undefined, { cause: err });
    }
    opened.add(nc);
    try {
      return new Jetlock(nc, jetlock);
    } catch (err) {
      opened.delete(nc);
      await nc.close();
      throw err;
    }
  }

  /**
   * close ends what the client started, within its timeout: every call still waiting rejects with a
   * ClientClosedError (a waiting acquire's wait is cancelled at the service), the leases still held are released
   * (their signals abort with a ReleasedError) and the sessions still open are closed, the cleanup still running
   * is waited for; then the connection is closed if the client opened it. Every call after close() rejects at
   * once with a ClientClosedError. Calling it again returns the same promise.
   */
  close(): Promise<void> {
    return this.#core.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /** The number of cleanups still running in the background (cancels of given-up waits, releases of unused grants). */
  get pendingCleanup(): number {
    return this.#core.pendingCleanup;
  }

  /**
   * acquire acquires resource, waiting in its FIFO queue while others hold it, until it is granted, the signal
   * aborts (then the wait is cancelled at the service and the call rejects with the signal's reason), waitMs
   * passes (a LockedError), or the client is closed (a ClientClosedError).
   */
  acquire(resource: string, opts: AcquireOptions = {}): Promise<Lease> {
    return acquire(this.#core, () => ({ ...readAcquire(opts), resource: checkResource(resource) }), opts.waitMs ?? null, (h) => Lease.create(h));
  }

  /** tryAcquire makes one attempt and returns at once: a lease, or a LockedError naming the holder. */
  tryAcquire(resource: string, opts: Omit<AcquireOptions, "waitMs"> = {}): Promise<Lease> {
    return acquire(this.#core, () => ({ ...readAcquire(opts), resource: checkResource(resource) }), 0, (h) => Lease.create(h));
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
   * token per resource (tokenOf, tokens); it is renewed, released and lost whole.
   */
  acquireAll(resources: string[], opts: AcquireOptions = {}): Promise<SetLease> {
    return acquire(
      this.#core,
      () => ({ ...readAcquire(opts), set: checkSet(resources, this.#core.maxSetSize) }),
      opts.waitMs ?? null,
      (h) => SetLease.create(h),
    );
  }

  /** tryAcquireAll makes one attempt at a lock set: the lease, or a LockedError whose holders name every held member. */
  tryAcquireAll(resources: string[], opts: Omit<AcquireOptions, "waitMs"> = {}): Promise<SetLease> {
    return acquire(this.#core, () => ({ ...readAcquire(opts), set: checkSet(resources, this.#core.maxSetSize) }), 0, (h) => SetLease.create(h));
  }

  /** session opens a session: many leases kept alive by one keepalive, lost together. */
  session(opts: SessionOptions = {}): Promise<Session> {
    return openSession(this.#core, opts);
  }

  /** semaphore returns the counting semaphore name of limit permits (1–1000); every user must give the same limit. */
  semaphore(name: string, limit: number): Semaphore {
    return Semaphore.create(this.#core, undefined, checkResource(name, "semaphore"), checkLimit(limit));
  }

  /** election returns the election name; its options apply to every campaign. */
  election(name: string, opts: ElectionOptions = {}): Election {
    return Election.create(this.#core, undefined, checkResource(name, "election"), opts);
  }

  /** status returns the service's view of resource (held: false when nobody holds it). */
  async status(resource: string, opts: { signal?: AbortSignal } = {}): Promise<Status> {
    checkResource(resource);
    return toStatus(await this.#core.request<any>("status", { resource }, { signal: opts.signal, about: resource }));
  }

  /** list yields the held leases whose resource starts with prefix, in resource order, a page at a time (each page one bounded call). */
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
      const r = await this.#core.request<any>("list", body, { signal: opts.signal });
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
    const r = await this.#core.request<any>("admin.revoke", body, { signal: opts.signal, about: resource });
    return { resource: r.resource, revoked: !!r.revoked, token: r.token || undefined };
  }
}
