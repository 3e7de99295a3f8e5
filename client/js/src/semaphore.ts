// Counting semaphores: at most limit holders at once, each holding one
// permit, a lease with fencing tokens of its own.
import { acquire, readAcquire } from "./internal/acquire.js";
import type { AcquireOptions } from "./types.js";
import type { Core, SessionRef } from "./internal/core.js";
import type { Held } from "./internal/held.js";
import { BaseLease } from "./lease.js";
import type { Fenced } from "./fence.js";

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
 * A Permit is one held permit of a semaphore: a lease whose tokens rise per permit, not across permits. Fence its
 * work under fenceKey ("NAME#k"), never under the semaphore's name.
 */
export class Permit extends BaseLease implements Fenced {
  /** The semaphore's name. */
  readonly semaphore: string;
  /** The permit's number, 1 to the limit. */
  readonly permit: number;
  /** The permit's fencing token: strictly larger than every earlier grant's of this permit. */
  readonly token: number;

  private constructor(held: Held) {
    super(held);
    this.semaphore = held.resource;
    this.permit = held.permit!;
    this.token = held.token;
  }

  /** @internal */
  static create(held: Held): Permit {
    return new Permit(held);
  }

  /** The name a fence keeps this permit's token under: "NAME#k" for permit k of semaphore NAME. */
  get fenceKey(): string {
    return `${this.semaphore}#${this.permit}`;
  }
}

/**
 * Semaphore is the counting semaphore `name` of `limit` permits. Every holder and waiter must give the same limit
 * (another is invalid_request while it has holders or waiters).
 */
export class Semaphore {
  readonly #core: Core;
  readonly #session?: SessionRef;
  readonly name: string;
  readonly limit: number;

  private constructor(core: Core, session: SessionRef | undefined, name: string, limit: number) {
    this.#core = core;
    this.#session = session;
    this.name = name;
    this.limit = limit;
  }

  /** @internal */
  static create(core: Core, session: SessionRef | undefined, name: string, limit: number): Semaphore {
    return new Semaphore(core, session, name, limit);
  }

  /** acquire acquires one permit, waiting in the semaphore's FIFO queue while all are held (options as Jetlock.acquire). */
  acquire(opts: AcquireOptions = {}): Promise<Permit> {
    return acquire(this.#core, () => ({ ...readAcquire(opts, this.#session), resource: this.name, limit: this.limit }), opts.waitMs ?? null, (h) => Permit.create(h));
  }

  /** tryAcquire makes one attempt: a permit, or a LockedError (with limit) when none is free. */
  tryAcquire(opts: Omit<AcquireOptions, "waitMs"> = {}): Promise<Permit> {
    return acquire(this.#core, () => ({ ...readAcquire(opts, this.#session), resource: this.name, limit: this.limit }), 0, (h) => Permit.create(h));
  }

  /** status reads the held permits and the waiters. A read: never decide from it that a permit is free. */
  async status(opts: { signal?: AbortSignal } = {}): Promise<SemaphoreStatus> {
    const r = await this.#core.request<any>("status", { resource: this.name, limit: this.limit }, { signal: opts.signal, about: this.name });
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
