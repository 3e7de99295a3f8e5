// Sessions: many leases kept alive by one keepalive, and lost together.
import type { AcquireOptions, Jetlock } from "./client.js";
import { InternalError, InvalidRequestError, LeaseLostError, SessionClosedError, UnavailableError } from "./errors.js";
import type { Lease } from "./lease.js";
import { Life, stamp, timeoutSignal, type Stamp } from "./life.js";
import { Semaphore } from "./semaphore.js";
import { Election, type ElectionOptions } from "./election.js";
import { checkLimit, checkMs, checkResource, checkSet, checkText, maxOwnerLen, maxRequestIdLen } from "./validate.js";
import { newRequestId } from "./client.js";

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

/**
 * A Session keeps every lease acquired through it alive with one keepalive, sent at a third of its TTL. Its
 * leases do not renew themselves: they live as long as the session, and end with it when it is closed or not
 * kept alive. `signal` aborts when the session is lost (a keepalive refused, or none confirmed before the
 * client's deadline) or closed; the signals of its leases abort with it. Close it when done
 * (`await using session = await jl.session()` does).
 */
export class Session {
  readonly #jl: Jetlock;
  readonly #id: string;
  /** The owner the session was opened with. */
  readonly owner: string;
  readonly #life: Life;
  #closing?: Promise<boolean>;
  #closed = false;

  private constructor(jl: Jetlock, id: string, owner: string, life: Life) {
    this.#jl = jl;
    this.#id = id;
    this.owner = owner;
    this.#life = life;
  }

  /** Internal: opens a session (Jetlock.session). */
  static async open(jl: Jetlock, opts: SessionOptions): Promise<Session> {
    const body: Record<string, unknown> = {
      request_id: checkText("request_id", opts.requestId, maxRequestIdLen, false) || newRequestId(),
    };
    const owner = checkText("owner", opts.owner, maxOwnerLen, false);
    if (owner) body.owner = owner;
    const ttl = checkMs("ttl_ms", opts.ttlMs);
    if (ttl !== undefined) body.ttl_ms = ttl;
    let sent: Stamp = stamp(jl.clock);
    const r = await jl.retry(() => {
      sent = stamp(jl.clock);
      return jl.call<SessionReply>("session.open", body, { signal: opts.signal });
    }, opts.signal);
    if (!/^[0-9a-f]{72}$/.test(r.session_id ?? "") || !(r.ttl_ms > 0)) {
      throw new InternalError("jetlock: internal service error: session.open: bad reply");
    }
    const life = jl.newLife("keepalive");
    life.setDeadline(sent, r.ttl_ms);
    const s = new Session(jl, r.session_id, owner, life);
    if (life.check()) {
      // Open, but past its deadline already: not provably alive. The service ends it.
      const reason = life.rawSignal.reason;
      jl.background(s.close());
      throw reason;
    }
    life.arm();
    life.keep(async (sent, signal) => {
      const k = await jl.call<{ ttl_ms: number }>("session.keepalive", { session_id: s.#id }, { signal });
      if (!(k.ttl_ms > 0)) throw new InternalError("jetlock: internal service error: session.keepalive: bad reply");
      life.setDeadline(sent, k.ttl_ms);
    });
    return s;
  }

  /** Internal: the session id, which alone keeps the session alive and closes it. Never shown. */
  get id(): string {
    return this.#id;
  }

  /** Aborts when the session is lost (LeaseLostError) or closed (SessionClosedError). Reading it checks the clocks. */
  get signal(): AbortSignal {
    return this.#life.signal;
  }

  /** Internal: the signal without looking at the clocks. */
  get rawSignal(): AbortSignal {
    return this.#life.rawSignal;
  }

  /** The client's deadline for the session: the send time of the last confirmed keepalive (or the open), plus the TTL, minus the margin. */
  get expiresAt(): Date {
    return new Date(this.#jl.clock.wall() + this.#life.remaining());
  }

  /** The session's TTL as the service last granted it, in ms. */
  get ttlMs(): number {
    return this.#life.ttl;
  }

  /** Internal: ms until the deadline. */
  remaining(): number {
    return this.#life.remaining();
  }

  /** renewed resolves when the deadline next moves (a keepalive succeeded). */
  renewed(): Promise<void> {
    return this.#life.renewed();
  }

  /** Internal: throws the error an acquire on an ended session gets. */
  throwIfEnded(): void {
    if (!this.#life.check()) return;
    const reason = this.#life.rawSignal.reason;
    if (reason instanceof SessionClosedError) throw reason;
    throw new LeaseLostError(`jetlock: lease lost: session lost: ${(reason as Error)?.message}`, { cause: reason });
  }

  /** acquire acquires resource for the session, waiting as Jetlock.acquire does; the wait also ends with the session. */
  acquire(resource: string, opts: Omit<AcquireOptions, "ttlMs"> = {}): Promise<Lease> {
    return this.#jl.run(() => ({ ...this.#jl.readAcquire(opts, this), resource: checkResource(resource) }), opts.waitMs ?? null);
  }

  /** tryAcquire makes one attempt to acquire resource for the session. */
  tryAcquire(resource: string, opts: Omit<AcquireOptions, "ttlMs" | "waitMs"> = {}): Promise<Lease> {
    return this.#jl.run(() => ({ ...this.#jl.readAcquire(opts, this), resource: checkResource(resource) }), 0);
  }

  /** acquireAll acquires a lock set for the session, all or none. */
  acquireAll(resources: string[], opts: Omit<AcquireOptions, "ttlMs"> = {}): Promise<Lease> {
    return this.#jl.run(() => ({ ...this.#jl.readAcquire(opts, this), set: checkSet(resources, this.#jl.maxSetSize) }), opts.waitMs ?? null);
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
    return new Semaphore(this.#jl, this, checkResource(name, "semaphore"), checkLimit(limit));
  }

  /** election returns the election name whose leaderships live in this session (no ttlMs). */
  election(name: string, opts: Omit<ElectionOptions, "ttlMs"> = {}): Election {
    if ((opts as ElectionOptions).ttlMs !== undefined) {
      throw new InvalidRequestError("jetlock: invalid request: ttlMs with a session: a session's lease lives as long as its session");
    }
    return new Election(this.#jl, this, checkResource(name, "election"), opts);
  }

  /**
   * close ends the session: the service releases its leases and ends its waits. The signal aborts (with a
   * SessionClosedError) before the request is sent. Resolves true when this call ended the session. It tries for
   * the request timeout at most, and never past the session's deadline; an unconfirmed close rejects with
   * UnavailableError (the service ends the session after its TTL).
   */
  close(): Promise<boolean> {
    if (this.#closed) return Promise.resolve(false);
    if (this.#closing) return this.#closing;
    const p = this.#close().then(
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

  async #close(): Promise<boolean> {
    const life = this.#life;
    life.stopper.abort();
    await life.done;
    life.markLost(new SessionClosedError());
    const left = life.remaining();
    if (!(left > 0)) return false;
    const bound = timeoutSignal(Math.min(left, this.#jl.requestTimeoutMs));
    try {
      const r = await this.#jl.retry(() => this.#jl.call<{ closed: boolean }>("session.close", { session_id: this.#id }, { signal: bound }), bound);
      return !!r.closed;
    } catch (err) {
      if (bound.aborted) {
        throw new UnavailableError("jetlock: service unavailable: session close not confirmed in time; the service ends the session after its TTL", undefined, { cause: err });
      }
      throw err;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close().catch(() => undefined);
  }
}
