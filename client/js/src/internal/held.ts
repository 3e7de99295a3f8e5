// What keeps a granted lease, which the package does not export: of one
// resource, of a lock set, of a permit, of a leadership, or in a session.
// It renews itself (a session's lease lives with its session), tells its
// holder when it is lost, and releases. The public lease classes
// (lease.ts, semaphore.ts, election.ts) are views of one.
import { InternalError, LeaseLostError, ReleasedError, SessionClosedError, UnavailableError } from "../errors.js";
import { stamp, timeoutSignal, type Life, type Stamp } from "./life.js";
import type { Core, Kept, SessionRef } from "./core.js";

/** What one acquire asks for. */
export interface AcquireSpec {
  resource?: string;
  set?: string[];
  limit?: number;
  value?: string;
  session?: SessionRef;
  requestId: string;
  owner: string;
  ttlMs?: number;
  maxHoldMs?: number;
  signal?: AbortSignal;
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

/** What a grant gives a lease. */
export interface Grant {
  core: Core;
  spec: AcquireSpec;
  tokens: Map<string, number>;
  permit?: number;
  leaseId: string;
  sent: Stamp;
  reply: GrantReply;
  life: Life;
}

function parseMs(s: string | undefined): number | undefined {
  if (!s) return undefined;
  const t = Date.parse(s);
  return Number.isNaN(t) ? undefined : t;
}

export class Held implements Kept {
  readonly core: Core;
  /** The resource ("" for a set), the resources (sorted), the tokens, the permit. */
  readonly resource: string;
  readonly resources: readonly string[];
  readonly tokens: ReadonlyMap<string, number>;
  readonly permit?: number;
  readonly isSet: boolean;
  readonly #id: string;
  readonly #want?: number;
  readonly life: Life;
  readonly session?: SessionRef;
  #unwatch?: () => void;
  #forget?: () => void;
  value?: string;
  #reply: GrantReply;
  #releasing?: Promise<boolean>;
  #released = false;

  constructor(g: Grant) {
    this.core = g.core;
    this.#id = g.leaseId;
    this.isSet = !!g.spec.set;
    this.resource = g.spec.set ? "" : g.spec.resource!;
    this.resources = Object.freeze(g.spec.set ? [...g.spec.set] : [g.spec.resource!]);
    this.tokens = g.tokens;
    this.permit = g.permit;
    this.value = g.spec.value;
    this.#want = g.spec.ttlMs;
    this.life = g.life;
    this.session = g.spec.session;
    this.#reply = g.reply;
    const r = g.reply;
    const until = parseMs(r.hold_until);
    const exp = parseMs(r.expires_at);
    if (this.session) {
      // A session's grant carries the session's ttl_ms and expires_at: what is left of the hold cap is at least
      // hold_until minus that expires_at (both the service's clock). The session's life is the rest.
      let hold = until !== undefined && exp !== undefined ? Math.max(0, until - exp) : undefined;
      if (g.spec.maxHoldMs !== undefined && (hold === undefined || g.spec.maxHoldMs < hold)) hold = g.spec.maxHoldMs;
      if (hold !== undefined) this.life.setHold(g.sent, hold);
    } else {
      // The hold left when the service answered: hold_until minus expires_at plus ttl_ms, all the service's.
      if (until !== undefined && exp !== undefined) this.life.setHold(g.sent, until - exp + r.ttl_ms);
      this.life.setDeadline(g.sent, r.ttl_ms);
    }
  }

  /** The token of a lease of one resource (0 for a set). */
  get token(): number {
    return this.isSet ? 0 : this.tokens.get(this.resource)!;
  }

  /** start hands the lease to its caller. A grant that came from waiting is renewed at once first. */
  async start(waited: boolean, signal?: AbortSignal): Promise<void> {
    const life = this.life;
    const session = this.session;
    if (session) {
      const follow = () => life.markLost(sessionLeaseReason(session.life.rawSignal.reason));
      session.life.rawSignal.addEventListener("abort", follow, { once: true });
      this.#unwatch = () => session.life.rawSignal.removeEventListener("abort", follow);
      life.rawSignal.addEventListener("abort", () => this.#unwatch?.(), { once: true });
      if (session.life.rawSignal.aborted || session.signal.aborted) {
        follow();
        session.throwIfEnded();
      }
      life.arm();
      return;
    }
    if (waited) {
      // The deadline counts from the send of the acquire, before the wait, and the grant's TTL is the short
      // hand-over TTL: renew before the holder gets it.
      const sent = stamp(this.core.clock);
      try {
        const r = await this.core.retry(() => this.#sendRenew(signal), signal);
        life.setDeadline(sent, r.ttl_ms);
        this.#reply = r;
      } catch (err) {
        life.markLost(err instanceof Error ? err : new LeaseLostError(String(err)));
        throw err;
      }
    }
    if (life.check()) throw life.rawSignal.reason;
    life.arm();
    this.#forget = this.core.keep(this);
    life.rawSignal.addEventListener("abort", () => this.#forget?.(), { once: true });
    life.keep(async (sent, s) => {
      const r = await this.#sendRenew(s, undefined, true);
      life.setDeadline(sent, r.ttl_ms);
      this.#reply = r;
    });
  }

  async #sendRenew(signal?: AbortSignal, value?: string, background = false): Promise<GrantReply> {
    const body: Record<string, unknown> = {};
    if (this.isSet) body.resources = this.resources;
    else body.resource = this.resource;
    body.lease_id = this.#id;
    if (this.#want !== undefined && !this.session) body.ttl_ms = this.#want;
    if (this.permit !== undefined) body.permit = this.permit;
    if (value !== undefined) body.value = value;
    const r = await this.core.call<GrantReply>("renew", body, { signal, about: this.resource, background });
    if (!(r.ttl_ms > 0)) throw new InternalError("jetlock: internal service error: renew: bad reply (ttl_ms)");
    if (this.isSet) {
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

  /** The signal, after a look at the clocks (the session's too). */
  get signal(): AbortSignal {
    if (this.session) this.session.signal; // looks at the session's clocks, which may end the lease
    return this.life.signal;
  }

  get expiresAt(): Date {
    const own = this.life.remaining();
    const left = this.session ? Math.min(own, this.session.remaining()) : own;
    return new Date(this.core.clock.wall() + left);
  }

  get serviceExpiresAt(): Date {
    return new Date(this.#reply.expires_at);
  }

  get ttlMs(): number {
    return this.#reply.ttl_ms;
  }

  /** renewed resolves when the deadline next moves, and rejects with the reason once the lease is lost. */
  renewed(): Promise<void> {
    if (!this.session) return this.life.renewed();
    if (this.life.rawSignal.aborted) return Promise.reject(this.life.rawSignal.reason);
    return new Promise((resolve, reject) => {
      const lost = () => reject(this.life.rawSignal.reason);
      this.life.rawSignal.addEventListener("abort", lost, { once: true });
      this.session!.renewed().then(
        () => {
          this.life.rawSignal.removeEventListener("abort", lost);
          resolve();
        },
        (err) => {
          this.life.rawSignal.removeEventListener("abort", lost);
          reject(this.life.rawSignal.aborted ? this.life.rawSignal.reason : err);
        },
      );
    });
  }

  /** end releases the lease when its client closes. */
  end(bound: AbortSignal): Promise<unknown> {
    return this.release(bound, new ReleasedError("jetlock: lease released: the client was closed"));
  }

  release(signal?: AbortSignal, reason?: ReleasedError): Promise<boolean> {
    if (this.#released) return Promise.resolve(false);
    if (this.#releasing) return this.#releasing;
    const p = this.#release(signal, reason).then(
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

  async #release(signal?: AbortSignal, reason?: ReleasedError): Promise<boolean> {
    const life = this.life;
    life.stopper.abort();
    await life.done;
    // Signal the end first, clean up second: a release that fails must not leave the holder believing it holds.
    life.markLost(reason ?? new ReleasedError());
    this.#forget?.();
    if (this.session) {
      this.#unwatch?.();
      if (this.session.life.rawSignal.aborted || this.session.signal.aborted) return false;
    }
    const left = this.session ? this.session.remaining() : life.remaining();
    if (!(left > 0)) return false;
    // Bounded by the client's timeout, and never past the lease's deadline: from then on the lease is not this
    // client's to release, and the service expires it by itself.
    const deadline = timeoutSignal(Math.min(left, this.core.timeoutMs));
    const bound = signal ? AbortSignal.any([signal, deadline]) : deadline;
    const body: Record<string, unknown> = {};
    if (this.isSet) body.resources = this.resources;
    else body.resource = this.resource;
    body.lease_id = this.#id;
    if (this.permit !== undefined) body.permit = this.permit;
    try {
      const r = await this.core.retry(
        () => this.core.call<{ released: boolean }>("release", body, { signal: bound, about: this.resource, cleanup: true }),
        bound,
      );
      return !!r.released;
    } catch (err) {
      if (deadline.aborted && !signal?.aborted) {
        throw new UnavailableError("jetlock: service unavailable: release not confirmed in time; the service expires the lease after its TTL", undefined, { cause: err });
      }
      throw err;
    }
  }

  /** proclaim renews the lease with a new value (an election's leader value). */
  async proclaim(value: string, signal?: AbortSignal): Promise<void> {
    const life = this.life;
    if (this.signal.aborted) {
      throw new LeaseLostError(`jetlock: lease lost: proclaim: ${(life.rawSignal.reason as Error)?.message}`);
    }
    this.core.throwIfClosed();
    const b = this.core.bound("proclaim", signal);
    const sent = stamp(this.core.clock);
    let r: GrantReply;
    try {
      r = await this.core.retry(() => this.#sendRenew(b.signal, value), b.signal);
    } catch (err) {
      if (err instanceof LeaseLostError) life.markLost(new LeaseLostError(`jetlock: lease lost: proclaim refused: ${err.message}`, { cause: err }));
      throw err;
    } finally {
      b.done();
    }
    if (!this.session) life.setDeadline(sent, r.ttl_ms);
    this.#reply = r;
    this.value = value;
  }
}

/** The reason of a session's lease when the session ended with reason. */
function sessionLeaseReason(reason: unknown): Error {
  if (reason instanceof SessionClosedError) return new ReleasedError("jetlock: lease released with its session");
  return reason instanceof Error ? reason : new LeaseLostError("jetlock: lease lost: session lost");
}
