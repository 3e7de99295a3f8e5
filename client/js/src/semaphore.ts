// Counting semaphores: at most limit holders at once, each holding one
// permit, a lease with fencing tokens of its own.
import type { AcquireOptions, Jetlock, Status } from "./client.js";
import type { Lease } from "./lease.js";
import type { Session } from "./session.js";

/** A held permit of a semaphore, in its status. */
export interface PermitStatus {
  permit: number;
  /** Shown to the permit's own tenant and to operators only. */
  owner?: string;
  token: number;
  expiresAt?: Date;
}

/** A semaphore's holders and waiters, as the answering instance sees them. */
export interface SemaphoreStatus {
  name: string;
  limit: number;
  held: number;
  waiters: number;
  permits: PermitStatus[];
}

/**
 * Semaphore is the counting semaphore `name` of `limit` permits. Every holder and waiter must give the same limit
 * (another is invalid_request while it has holders or waiters). A permit is a lease: `lease.permit` is its number,
 * `lease.token` its token, and `lease.fenceKey` ("NAME#k") the name to fence its work under, since each permit's
 * tokens rise on their own.
 */
export class Semaphore {
  readonly #jl: Jetlock;
  readonly #session?: Session;
  readonly name: string;
  readonly limit: number;

  constructor(jl: Jetlock, session: Session | undefined, name: string, limit: number) {
    this.#jl = jl;
    this.#session = session;
    this.name = name;
    this.limit = limit;
  }

  /** acquire acquires one permit, waiting in the semaphore's FIFO queue while all are held. */
  acquire(opts: AcquireOptions = {}): Promise<Lease> {
    return this.#jl.run(() => ({ ...this.#jl.readAcquire(opts, this.#session), resource: this.name, limit: this.limit }), opts.waitMs ?? null);
  }

  /** tryAcquire makes one attempt: a permit, or a LockedError (with limit) when none is free. */
  tryAcquire(opts: Omit<AcquireOptions, "waitMs"> = {}): Promise<Lease> {
    return this.#jl.run(() => ({ ...this.#jl.readAcquire(opts, this.#session), resource: this.name, limit: this.limit }), 0);
  }

  /** status reads the held permits and the waiters. A read: never decide from it that a permit is free. */
  async status(opts: { signal?: AbortSignal } = {}): Promise<SemaphoreStatus> {
    const r = await this.#jl.retry(
      () => this.#jl.call<any>("status", { resource: this.name, limit: this.limit }, { signal: opts.signal, about: this.name }),
      opts.signal,
    );
    return {
      name: this.name,
      limit: r.limit,
      held: r.held_permits ?? 0,
      waiters: r.waiters ?? 0,
      permits: (r.permits ?? []).map((p: any) => ({
        permit: p.permit,
        owner: p.owner || undefined,
        token: p.token,
        expiresAt: p.expires_at ? new Date(p.expires_at) : undefined,
      })),
    };
  }
}

export type { Status };
