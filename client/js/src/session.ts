// Sessions: many leases kept alive by one keepalive, and lost together.
import { acquire, readAcquire } from "./internal/acquire.js";
import type { AcquireOptions } from "./types.js";
import { newRequestId, type Core, type Kept, type SessionRef } from "./internal/core.js";
import { Election, type ElectionOptions } from "./election.js";
import { InternalError, InvalidRequestError, LeaseLostError, SessionClosedError, UnavailableError } from "./errors.js";
import { Lease, SetLease } from "./lease.js";
import { Life, stamp, timeoutSignal, type Stamp } from "./internal/life.js";
import { Semaphore } from "./semaphore.js";
import { checkLimit, checkMs, checkResource, checkSet, checkText, maxOwnerLen, maxRequestIdLen } from "./internal/validate.js";

/** Options of a session. */
export interface SessionOptions {
  /** How long the service keeps the session, and its leases, without a keepalive (ms). Default: the service's, 30000. */
  ttlMs?: number;
  /** Free text naming the session's holder, shown next to its leases to your tenant and operators. */
  owner?: string;
  /** The id of the open: an open retried with it finds the same session while it lives. Default: random. */
  requestId?: string;
  /** Gives up the open. */
  signal?: AbortSignal;
}

interface SessionReply {
  session_id: string;
  ttl_ms: number;
  expires_at: string;
}

/** @internal What keeps a session alive, and what its leases follow. */
export class Keeper implements SessionRef, Kept {
  readonly core: Core;
  readonly id: string;
  readonly life: Life;
  #forget?: () => void;
  #closing?: Promise<boolean>;
  #closed = false;

  constructor(core: Core, id: string, life: Life) {
    this.core = core;
    this.id = id;
    this.life = life;
  }

  get signal(): AbortSignal {
    return this.life.signal;
  }

  remaining(): number {
    return this.life.remaining();
  }

  renewed(): Promise<void> {
    return this.life.renewed();
  }

  throwIfEnded(): void {
    if (!this.life.check()) return;
    const reason = this.life.rawSignal.reason;
    if (reason instanceof SessionClosedError) throw reason;
    throw new LeaseLostError(`jetlock: lease lost: session lost: ${(reason as Error)?.message}`, { cause: reason });
  }

  start(): void {
    const life = this.life;
    life.arm();
    this.#forget = this.core.keep(this);
    life.rawSignal.addEventListener("abort", () => this.#forget?.(), { once: true });
    life.keep(async (sent, signal) => {
      const k = await this.core.call<{ ttl_ms: number }>("session.keepalive", { session_id: this.id }, { signal, background: true });
      if (!(k.ttl_ms > 0)) throw new InternalError("jetlock: internal service error: session.keepalive: bad reply");
      life.setDeadline(sent, k.ttl_ms);
    });
  }

  end(bound: AbortSignal): Promise<unknown> {
    return this.close(bound);
  }

  close(signal?: AbortSignal): Promise<boolean> {
    if (this.#closed) return Promise.resolve(false);
    if (this.#closing) return this.#closing;
    const p = this.#close(signal).then(
      (v) => {
        this.#closed = true;
        return v;
      },
      (err) => {
        this.#closing = undefined;
        throw err;
      },
    );
    this.#closing = p;
    return p;
  }

  async #close(signal?: AbortSignal): Promise<boolean> {
    const life = this.life;
    life.stopper.abort();
    await life.done;
    life.markLost(new SessionClosedError());
    this.#forget?.();
    const left = life.remaining();
    if (!(left > 0)) return false;
    const deadline = timeoutSignal(Math.min(left, this.core.timeoutMs));
    const bound = signal ? AbortSignal.any([signal, deadline]) : deadline;
    try {
      const r = await this.core.retry(() => this.core.call<{ closed: boolean }>("session.close", { session_id: this.id }, { signal: bound, cleanup: true }), bound);
      return !!r.closed;
    } catch (err) {
      if (deadline.aborted && !signal?.aborted) {
        throw new UnavailableError("jetlock: service unavailable: session close not confirmed in time; the service ends the session after its TTL", undefined, { cause: err });
      }
      throw err;
    }
  }
}

/** @internal openSession opens a session (Jetlock.session). */
export async function openSession(core: Core, opts: SessionOptions): Promise<Session> {
  const body: Record<string, unknown> = {
    request_id: checkText("request_id", opts.requestId, maxRequestIdLen, false) || newRequestId(),
  };
  const owner = checkText("owner", opts.owner, maxOwnerLen, false);
  if (owner) body.owner = owner;
  const ttl = checkMs("ttl_ms", opts.ttlMs);
  if (ttl !== undefined) body.ttl_ms = ttl;
  core.throwIfClosed();
  let sent: Stamp = stamp(core.clock);
  const b = core.bound("session.open", opts.signal);
  let r: SessionReply;
  try {
    r = await core.retry(() => {
      sent = stamp(core.clock);
      return core.call<SessionReply>("session.open", body, { signal: b.signal });
    }, b.signal);
  } finally {
    b.done();
  }
  if (!/^[0-9a-f]{72}$/.test(r.session_id ?? "") || !(r.ttl_ms > 0)) {
    throw new InternalError("jetlock: internal service error: session.open: bad reply");
  }
  const life = new Life("keepalive", core.safetyMarginMs, core.clock);
  life.setDeadline(sent, r.ttl_ms);
  const k = new Keeper(core, r.session_id, life);
  if (life.check() || core.closed) {
    // Open, but past its deadline already (not provably alive), or the client closed meanwhile: end it.
    const reason = life.rawSignal.aborted ? life.rawSignal.reason : core.closed ? new SessionClosedError("jetlock: session closed: the client was closed") : undefined;
    core.background(k.close());
    throw reason;
  }
  k.start();
  return Session.create(core, k, owner);
}

/**
 * A Session keeps every lease acquired through it alive with one keepalive, sent at a third of its TTL. Its
 * leases do not renew themselves: they live as long as the session, and end with it when it is closed or not
 * kept alive. `signal` aborts when the session is lost (a keepalive refused, or none confirmed before the
 * client's deadline) or closed; the signals of its leases abort with it. Close it when done
 * (`await using session = await jl.session()` does); the client's close() closes it too.
 */
export class Session {
  readonly #core: Core;
  readonly #k: Keeper;
  /** The owner the session was opened with. */
  readonly owner: string;

  private constructor(core: Core, k: Keeper, owner: string) {
    this.#core = core;
    this.#k = k;
    this.owner = owner;
  }

  /** @internal */
  static create(core: Core, k: Keeper, owner: string): Session {
    return new Session(core, k, owner);
  }

  /** Aborts when the session is lost (LeaseLostError) or closed (SessionClosedError). Reading it checks the clocks. */
  get signal(): AbortSignal {
    return this.#k.signal;
  }

  /** The client's deadline for the session: the send time of the last confirmed keepalive (or the open), plus the TTL, minus the margin. */
  get expiresAt(): Date {
    return new Date(this.#core.clock.wall() + this.#k.remaining());
  }

  /** The session's TTL as the service last granted it, in ms. */
  get ttlMs(): number {
    return this.#k.life.ttl;
  }

  /** renewed resolves when the deadline next moves (a keepalive succeeded); it rejects with the reason once the session ended. */
  renewed(): Promise<void> {
    return this.#k.renewed();
  }

  /** acquire acquires resource for the session, waiting as Jetlock.acquire does; the wait also ends with the session. */
  acquire(resource: string, opts: Omit<AcquireOptions, "ttlMs"> = {}): Promise<Lease> {
    return acquire(this.#core, () => ({ ...readAcquire(opts, this.#k), resource: checkResource(resource) }), opts.waitMs ?? null, (h) => Lease.create(h));
  }

  /** tryAcquire makes one attempt to acquire resource for the session. */
  tryAcquire(resource: string, opts: Omit<AcquireOptions, "ttlMs" | "waitMs"> = {}): Promise<Lease> {
    return acquire(this.#core, () => ({ ...readAcquire(opts, this.#k), resource: checkResource(resource) }), 0, (h) => Lease.create(h));
  }

  /** acquireAll acquires a lock set for the session, all or none. */
  acquireAll(resources: string[], opts: Omit<AcquireOptions, "ttlMs"> = {}): Promise<SetLease> {
    return acquire(
      this.#core,
      () => ({ ...readAcquire(opts, this.#k), set: checkSet(resources, this.#core.maxSetSize) }),
      opts.waitMs ?? null,
      (h) => SetLease.create(h),
    );
  }

  /** withLock acquires resource in the session, runs fn, and releases the lease when fn returns or throws. */
  async withLock<T>(resource: string, fn: (lease: Lease) => Promise<T> | T, opts: Omit<AcquireOptions, "ttlMs"> = {}): Promise<T> {
    const lease = await this.acquire(resource, opts);
    try {
      return await fn(lease);
    } finally {
      await lease.release().catch(() => undefined);
    }
  }

  /** semaphore returns the semaphore name of limit permits whose permits live in this session. */
  semaphore(name: string, limit: number): Semaphore {
    return Semaphore.create(this.#core, this.#k, checkResource(name, "semaphore"), checkLimit(limit));
  }

  /** election returns the election name whose leaderships live in this session (no ttlMs). */
  election(name: string, opts: Omit<ElectionOptions, "ttlMs"> = {}): Election {
    if ((opts as ElectionOptions).ttlMs !== undefined) {
      throw new InvalidRequestError("jetlock: invalid request: ttlMs with a session: a session's lease lives as long as its session");
    }
    return Election.create(this.#core, this.#k, checkResource(name, "election"), opts);
  }

  /**
   * close ends the session: the service releases its leases and ends its waits. The signal aborts (with a
   * SessionClosedError) before the request is sent. Resolves true when this call ended the session. It tries for
   * the client's timeout at most, and never past the session's deadline; an unconfirmed close rejects with
   * UnavailableError (the service ends the session after its TTL).
   */
  close(): Promise<boolean> {
    return this.#k.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close().catch(() => undefined);
  }
}
