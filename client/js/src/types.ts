// The public types that the client's internals also use. Users import
// them from the package's index.

/** The clocks the client reads; the default is performance.now() and Date.now(). Tests may replace it. */
export interface Clock {
  /** A monotonic clock, in milliseconds. */
  monotonic(): number;
  /** The wall clock, in milliseconds since the epoch. */
  wall(): number;
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
