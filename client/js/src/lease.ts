// A granted lease: of one resource, of a lock set, of a permit, of a
// leadership, or in a session. It renews itself (a session's lease lives
// with its session) and tells its holder when it is lost.
import type { GrantReply, Jetlock } from "./client.js";
import { InternalError, JetlockError, LeaseLostError, ReleasedError, SessionClosedError, UnavailableError } from "./errors.js";
import { Life, stamp, timeoutSignal, type Stamp } from "./life.js";
import type { Session } from "./session.js";

/** Internal: what a grant gives a lease. */
export interface LeaseInit {
  jl: Jetlock;
  resource?: string;
  set?: string[];
  tokens: Map<string, number>;
  permit?: number;
  value?: string;
  leaseId: string;
  ttlWant?: number;
  maxHoldMs?: number;
  session?: Session;
  sent: Stamp;
  reply: GrantReply;
  life: Life;
}

function parseMs(s: string | undefined): number | undefined {
  if (!s) return undefined;
  const t = Date.parse(s);
  return Number.isNaN(t) ? undefined : t;
}

/**
 * A Lease is a granted lock. It renews itself at a third of its TTL until release() or loss.
 *
 * `signal` aborts, with the reason, when the client can no longer prove that it holds the lease: a renewal was
 * refused (revoked, expired, taken over), renewals failed until the client's deadline (which falls before the
 * service's), the hold cap was reached, or the lease was released. It can abort at any moment: pass `token`
 * with every write to the protected resource and let the resource refuse smaller tokens (see MemoryFence).
 * That, not the signal, stops a holder that was paused past its TTL.
 *
 * `await using lease = await jl.acquire(...)` releases it at scope exit.
 */
export class Lease {
  /** The resource the lease is on; "" for a lock set (see resources). For a permit, the semaphore's name. */
  readonly resource: string;
  /** The resources the lease holds, sorted: the set's members, or the one resource. */
  readonly resources: readonly string[];
  /** The fencing token of each resource: strictly larger than every earlier grant's. Unchanged by renewals. */
  readonly tokens: ReadonlyMap<string, number>;
  /** For a permit of a semaphore, its number (1 to the limit); otherwise undefined. */
  readonly permit?: number;
  readonly #jl: Jetlock;
  readonly #id: string;
  readonly #isSet: boolean;
  readonly #want?: number;
  readonly #life: Life;
  readonly #session?: Session;
  #unwatch?: () => void;
  #value?: string;
  #reply: GrantReply;
  #releasing?: Promise<boolean>;
  #released = false;

  constructor(init: LeaseInit) {
    this.#jl = init.jl;
    this.#id = init.leaseId;
    this.#isSet = !!init.set;
    this.resource = init.set ? "" : init.resource!;
    this.resources = Object.freeze(init.set ? [...init.set] : [init.resource!]);
    this.tokens = init.tokens;
    this.permit = init.permit;
    this.#value = init.value;
    this.#want = init.ttlWant;
    this.#life = init.life;
    this.#session = init.session;
    this.#reply = init.reply;
    const r = init.reply;
    const until = parseMs(r.hold_until);
    const exp = parseMs(r.expires_at);
    if (init.session) {
      // A session's grant carries the session's ttl_ms and expires_at: what is left of the hold cap is at least
      // hold_until minus that expires_at (both the service's clock). The session's life is the rest.
      let hold = until !== undefined && exp !== undefined ? Math.max(0, until - exp) : undefined;
      if (init.maxHoldMs !== undefined && (hold === undefined || init.maxHoldMs < hold)) hold = init.maxHoldMs;
      if (hold !== undefined) this.#life.setHold(init.sent, hold);
    } else {
      // The hold left when the service answered: hold_until minus expires_at plus ttl_ms, all the service's.
      if (until !== undefined && exp !== undefined) this.#life.setHold(init.sent, until - exp + r.ttl_ms);
      this.#life.setDeadline(init.sent, r.ttl_ms);
    }
  }

  /** Internal: hands the lease to its caller. A grant that came from waiting is renewed at once first. */
  async start(waited: boolean, signal?: AbortSignal): Promise<void> {
    const life = this.#life;
    const session = this.#session;
    if (session) {
      const follow = () => life.markLost(sessionLeaseReason(session.rawSignal.reason));
      session.rawSignal.addEventListener("abort", follow, { once: true });
      this.#unwatch = () => session.rawSignal.removeEventListener("abort", follow);
      if (session.rawSignal.aborted || session.signal.aborted) {
        follow();
        session.throwIfEnded();
      }
      life.arm();
      return;
    }
    if (waited) {
      // The deadline counts from the send of the acquire, before the wait, and the grant's TTL is the short
      // hand-over TTL: renew before the holder gets it.
      const sent = stamp(this.#jl.clock);
      try {
        const r = await this.#jl.retry(() => this.#sendRenew(signal), signal);
        life.setDeadline(sent, r.ttl_ms);
        this.#reply = r;
      } catch (err) {
        life.markLost(err instanceof Error ? err : new LeaseLostError(String(err)));
        throw err;
      }
    }
    if (life.check()) throw life.rawSignal.reason;
    life.arm();
    life.keep(async (sent, s) => {
      const r = await this.#sendRenew(s);
      life.setDeadline(sent, r.ttl_ms);
      this.#reply = r;
    });
  }

  async #sendRenew(signal?: AbortSignal, value?: string): Promise<GrantReply> {
    const body: Record<string, unknown> = {};
    if (this.#isSet) body.resources = this.resources;
    else body.resource = this.resource;
    body.lease_id = this.#id;
    if (this.#want !== undefined && !this.#session) body.ttl_ms = this.#want;
    if (this.permit !== undefined) body.permit = this.permit;
    if (value !== undefined) body.value = value;
    const r = await this.#jl.call<GrantReply>("renew", body, { signal, about: this.resource });
    if (!(r.ttl_ms > 0)) throw new InternalError("jetlock: internal service error: renew: bad reply (ttl_ms)");
    if (this.#isSet) {
      for (const m of r.resources ?? []) {
        if (this.tokens.get(m.resource) !== m.token) {
          throw new InternalError(`jetlock: internal service error: lock set: renewal's reply gives ${m.resource} token ${m.token}`);
        }
      }
    } else if (r.token !== this.token) {
      throw new InternalError(`jetlock: internal service error: renew: reply has token ${r.token}, the lease ${this.token}`);
    }
    return r;
  }

  /** The fencing token of the lease's resource; 0 for a lock set, whose resources each have one (tokenOf). */
  get token(): number {
    return this.#isSet ? 0 : this.tokens.get(this.resource)!;
  }

  /** tokenOf returns the token of resource, or undefined when the lease does not hold it. */
  tokenOf(resource: string): number | undefined {
    return this.tokens.get(resource);
  }

  /**
   * The name a fence keeps this lease's token under: the resource, or "NAME#k" for permit k of semaphore NAME
   * (each permit's tokens rise on their own), or "" for a lock set (fence each resource with tokenOf).
   */
  get fenceKey(): string {
    if (this.#isSet) return "";
    return this.permit !== undefined ? `${this.resource}#${this.permit}` : this.resource;
  }

  /** The lease's value (an election's leader value), if it has one. */
  get value(): string | undefined {
    return this.#value;
  }

  /**
   * Aborts when the lease is lost, with the reason: a LeaseLostError, a ReleasedError after release(). Reading it
   * first checks the clocks, so a holder that wakes from a pause past its deadline finds it aborted.
   */
  get signal(): AbortSignal {
    if (this.#session) this.#session.signal; // looks at the session's clocks, which may end the lease
    return this.#life.signal;
  }

  /**
   * The client's own deadline: the send time of the last successful acquire or renewal, plus the TTL, minus the
   * safety margin (for a lease of a session, the session's deadline, or the hold cap if earlier). The signal
   * aborts then at the latest.
   */
  get expiresAt(): Date {
    const own = this.#life.remaining();
    const left = this.#session ? Math.min(own, this.#session.remaining()) : own;
    return new Date(this.#jl.clock.wall() + left);
  }

  /** The service's view of the lease's expiry, from its last reply; for display only, never to time work by. */
  get serviceExpiresAt(): Date {
    return new Date(this.#reply.expires_at);
  }

  /** The TTL the service last granted, in ms. */
  get ttlMs(): number {
    return this.#reply.ttl_ms;
  }

  /** renewed resolves when the deadline next moves (a renewal, or for a lease of a session a keepalive, succeeded). */
  renewed(): Promise<void> {
    return this.#session ? this.#session.renewed() : this.#life.renewed();
  }

  /**
   * release stops renewing and releases the lease. The signal aborts (with a ReleasedError) before the request is
   * sent, whatever its outcome. It resolves true when this call ended the lease at the service, false when there
   * was nothing left to end (already released, expired, revoked: released is idempotent and never ends another
   * lease). It retries within its signal but never past the lease's deadline: from then on the lease is not this
   * client's to release, and the service expires it by itself. A release not confirmed by then rejects with
   * UnavailableError. A lease whose session has ended sends nothing.
   */
  release(opts: { signal?: AbortSignal } = {}): Promise<boolean> {
    if (this.#released) return Promise.resolve(false);
    if (this.#releasing) return this.#releasing;
    const p = this.#release(opts.signal).then(
      (v) => {
        this.#released = true;
        return v;
      },
      (err) => {
        this.#releasing = undefined; // a release not confirmed may be tried again
        throw err;
      },
    );
    this.#releasing = p;
    return p;
  }

  async #release(signal?: AbortSignal): Promise<boolean> {
    const life = this.#life;
    life.stopper.abort();
    await life.done;
    // Signal the end first, clean up second: a release that fails must not leave the holder believing it holds.
    life.markLost(new ReleasedError());
    if (this.#session) {
      this.#unwatch?.();
      if (this.#session.rawSignal.aborted || this.#session.signal.aborted) return false;
    }
    const left = this.#session ? this.#session.remaining() : this.#ownRemaining();
    if (!(left > 0)) return false;
    const deadline = timeoutSignal(left);
    const bound = signal ? AbortSignal.any([signal, deadline]) : deadline;
    const body: Record<string, unknown> = {};
    if (this.#isSet) body.resources = this.resources;
    else body.resource = this.resource;
    body.lease_id = this.#id;
    if (this.permit !== undefined) body.permit = this.permit;
    try {
      const r = await this.#jl.retry(() => this.#jl.call<{ released: boolean }>("release", body, { signal: bound, about: this.resource }), bound);
      return !!r.released;
    } catch (err) {
      if (deadline.aborted && !signal?.aborted) {
        throw new UnavailableError("jetlock: service unavailable: release not confirmed before the lease's deadline; the service expires it", undefined, { cause: err });
      }
      throw err;
    }
  }

  /** The time left until the lease's own deadline, ignoring that it is marked lost by release. */
  #ownRemaining(): number {
    return this.#life.remaining();
  }

  /** Releases the lease at scope exit (`await using`); a release that cannot be confirmed is left to expire. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.release();
    } catch (err) {
      if (!(err instanceof JetlockError)) throw err;
    }
  }

  /** Internal (Leadership.proclaim): a renewal that sets the value. */
  async proclaimValue(value: string, signal?: AbortSignal): Promise<void> {
    const life = this.#life;
    if (this.signal.aborted) {
      throw new LeaseLostError(`jetlock: lease lost: proclaim: ${(life.rawSignal.reason as Error)?.message}`);
    }
    const sent = stamp(this.#jl.clock);
    let r: GrantReply;
    try {
      r = await this.#jl.retry(() => this.#sendRenew(signal, value), signal);
    } catch (err) {
      if (err instanceof LeaseLostError) life.markLost(new LeaseLostError(`jetlock: lease lost: proclaim refused: ${err.message}`, { cause: err }));
      throw err;
    }
    if (!this.#session) life.setDeadline(sent, r.ttl_ms);
    this.#reply = r;
    this.#value = value;
  }
}

/** The reason of a session's lease when the session ended with reason. */
function sessionLeaseReason(reason: unknown): Error {
  if (reason instanceof SessionClosedError) return new ReleasedError("jetlock: lease released with its session");
  return reason instanceof Error ? reason : new LeaseLostError("jetlock: lease lost: session lost");
}
