// The leases a caller holds: a lock's (Lease) and a lock set's (SetLease),
// on the base every kind shares (a permit, semaphore.ts; a leadership,
// election.ts). Each is a view of what keeps it (held.ts).
import { JetlockError } from "./errors.js";
import type { Fenced } from "./fence.js";
import type { Held } from "./internal/held.js";

/**
 * BaseLease is what every kind of lease shares: it renews itself (or lives with its session) until release() or
 * loss, and tells its holder when it is lost.
 *
 * `signal` aborts, with the reason, when the client can no longer prove that it holds the lease: a renewal was
 * refused (revoked, expired, taken over), renewals failed until the client's deadline (which falls before the
 * service's), the hold cap was reached, the lease was released, or its client was closed. It can abort at any
 * moment: pass the fencing token with every write to the protected resource and let the resource refuse smaller
 * tokens (see MemoryFence). That, not the signal, stops a holder that was paused past its TTL.
 *
 * `await using lease = await jl.acquire(...)` releases it at scope exit, bounded by the client's timeout.
 */
export abstract class BaseLease {
  /** The resources the lease holds, sorted: the set's members, or the one resource. */
  readonly resources: readonly string[];
  readonly #held: Held;

  /** @internal */
  constructor(held: Held) {
    this.#held = held;
    this.resources = held.resources;
  }

  /**
   * Aborts when the lease is lost, with the reason: a LeaseLostError, a ReleasedError after release() or close().
   * Reading it first checks the clocks, so a holder that wakes from a pause past its deadline finds it aborted.
   */
  get signal(): AbortSignal {
    return this.#held.signal;
  }

  /**
   * The client's own deadline: the send time of the last successful acquire or renewal, plus the TTL, minus the
   * safety margin (for a lease of a session, the session's deadline, or the hold cap if earlier). The signal
   * aborts then at the latest.
   */
  get expiresAt(): Date {
    return this.#held.expiresAt;
  }

  /** The service's view of the lease's expiry, from its last reply; for display only, never to time work by. */
  get serviceExpiresAt(): Date {
    return this.#held.serviceExpiresAt;
  }

  /** The TTL the service last granted, in ms. */
  get ttlMs(): number {
    return this.#held.ttlMs;
  }

  /**
   * renewed resolves when the deadline next moves (a renewal, or for a lease of a session a keepalive, succeeded),
   * and rejects with the reason of the loss when the lease is lost first, or was already.
   */
  renewed(): Promise<void> {
    return this.#held.renewed();
  }

  /**
   * release stops renewing and releases the lease. The signal aborts (with a ReleasedError) before the request is
   * sent, whatever its outcome. It resolves true when this call ended the lease at the service, false when there
   * was nothing left to end (already released, expired, revoked: release is idempotent and never ends another
   * lease). It tries for the client's timeout at most, and never past the lease's deadline; a release not
   * confirmed by then rejects with UnavailableError (the service expires the lease after its TTL). A lease whose
   * session has ended sends nothing.
   */
  release(opts: { signal?: AbortSignal } = {}): Promise<boolean> {
    return this.#held.release(opts.signal);
  }

  /** Releases the lease at scope exit (`await using`), bounded as release is; one not confirmed is left to expire. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.release();
    } catch (err) {
      if (!(err instanceof JetlockError)) throw err;
    }
  }
}

/** A Lease is a granted lock of one resource, with its fencing token. */
export class Lease extends BaseLease implements Fenced {
  /** The resource the lease is on. */
  readonly resource: string;
  /** The fencing token: strictly larger than every earlier grant's of the resource. Unchanged by renewals. */
  readonly token: number;

  private constructor(held: Held) {
    super(held);
    this.resource = held.resource;
    this.token = held.token;
  }

  /** @internal */
  static create(held: Held): Lease {
    return new Lease(held);
  }

  /** The name a fence keeps this lease's token under: the resource. */
  get fenceKey(): string {
    return this.resource;
  }
}

/**
 * A SetLease is a granted lock set: every resource at once, renewed, released and lost whole. Each resource has a
 * token of its own (tokenOf): a set has no single token, so fence each resource's work with its own.
 */
export class SetLease extends BaseLease {
  /** The fencing token of each resource: strictly larger than every earlier grant's of it. */
  readonly tokens: ReadonlyMap<string, number>;

  private constructor(held: Held) {
    super(held);
    this.tokens = held.tokens;
  }

  /** @internal */
  static create(held: Held): SetLease {
    return new SetLease(held);
  }

  /** tokenOf returns the token of resource, or undefined when the set does not hold it. */
  tokenOf(resource: string): number | undefined {
    return this.tokens.get(resource);
  }

  /** fenced returns resource's lease as a fence takes it (its name and token); undefined when the set does not hold it. */
  fenced(resource: string): Fenced | undefined {
    const token = this.tokens.get(resource);
    return token === undefined ? undefined : { fenceKey: resource, token };
  }
}
