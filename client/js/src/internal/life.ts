// How long the client can prove that it holds something the service grants
// for a TTL and that it keeps alive: a lease, or a session. Its deadline is
// the send time of the last request that kept it alive, plus the TTL, minus
// a safety margin: the service acted after the request was sent, so the
// deadline falls before the service can end it (docs/protocol.md, "Expiry
// and your own deadline").
//
// The deadline is kept on two clocks, a monotonic one and the wall clock,
// and the earlier wins: a host or VM that was suspended stops the monotonic
// clock (and every timer) while the wall clock, and the service's clock, go
// on. The expiry timer sleeps at most a second at a time and looks at both
// clocks when it wakes, and every read of the signal looks first, so a
// process that wakes from a suspension sees the loss before anything else.
import { LeaseLostError, JetlockError, UnavailableError } from "../errors.js";
import type { Clock } from "../types.js";

export const systemClock: Clock = {
  monotonic: () => performance.now(),
  wall: () => Date.now(),
};

/** A moment on both clocks: when a request was sent. */
export interface Stamp {
  mono: number;
  wall: number;
}

export function stamp(clock: Clock): Stamp {
  return { mono: clock.monotonic(), wall: clock.wall() };
}

/** The longest the expiry timer sleeps before it looks at the clocks again. */
const checkEveryMs = 1000;

export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, Math.max(0, ms));
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** timeoutSignal is AbortSignal.timeout for any duration: whole milliseconds, at least 1, within a timer's range. */
export function timeoutSignal(ms: number): AbortSignal {
  return AbortSignal.timeout(Math.max(1, Math.min(Math.ceil(ms), 2 ** 31 - 1)));
}

export function jitter(ms: number): number {
  return ms / 2 + Math.random() * (ms / 2);
}

export class Life {
  readonly #what: string;
  readonly #margin: number;
  readonly #clock: Clock;
  readonly #controller = new AbortController();
  #ttl = 0;
  #mono = Infinity; // deadline on the monotonic clock
  #wall = Infinity; // deadline on the wall clock
  /** The end of a hold cap, on both clocks (Infinity when none). Never changed once set. */
  holdMono = Infinity;
  holdWall = Infinity;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #armed = false;
  #renewed: { resolve: () => void; reject: (err: unknown) => void }[] = [];
  /** Aborted to stop the keep-alive loop. */
  readonly stopper = new AbortController();
  /** Settled when the keep-alive loop has returned (at once when there is none). */
  done: Promise<void> = Promise.resolve();

  constructor(what: string, marginMs: number, clock: Clock) {
    this.#what = what;
    this.#margin = marginMs;
    this.#clock = clock;
  }

  get ttl(): number {
    return this.#ttl;
  }

  /** setHold sets the end of a hold cap: holdMs after sent, minus the margin. */
  setHold(sent: Stamp, holdMs: number): void {
    const d = holdMs - Math.min(this.#margin, holdMs / 4);
    this.holdMono = sent.mono + d;
    this.holdWall = sent.wall + d;
    this.#mono = Math.min(this.#mono, this.holdMono);
    this.#wall = Math.min(this.#wall, this.holdWall);
  }

  /** setDeadline moves the deadline after a request sent at sent kept it alive for ttlMs. */
  setDeadline(sent: Stamp, ttlMs: number): void {
    if (this.#controller.signal.aborted) return; // a loss is final
    const d = ttlMs - Math.min(this.#margin, ttlMs / 4);
    this.#ttl = ttlMs;
    this.#mono = Math.min(sent.mono + d, this.holdMono);
    this.#wall = Math.min(sent.wall + d, this.holdWall);
    const waiting = this.#renewed;
    this.#renewed = [];
    for (const w of waiting) w.resolve();
    if (this.#armed) this.#rearm();
  }

  /** The deadline as a wall-clock Date (the earlier of the two clocks' deadlines, seen from now). */
  get deadline(): Date {
    return new Date(this.#clock.wall() + this.remaining());
  }

  /** remaining returns how long until the deadline, by the clock that ends it first (Infinity when none). */
  remaining(): number {
    return Math.min(this.#mono - this.#clock.monotonic(), this.#wall - this.#clock.wall());
  }

  /** atHoldLimit: no renewal can move the deadline any more. */
  atHoldLimit(): boolean {
    return this.holdMono !== Infinity && this.#mono >= this.holdMono;
  }

  get signal(): AbortSignal {
    this.check();
    return this.#controller.signal;
  }

  /** The signal without looking at the clocks (for listeners). */
  get rawSignal(): AbortSignal {
    return this.#controller.signal;
  }

  /** renewed resolves when the deadline next moves, and rejects with the reason when it is lost first (or already). */
  renewed(): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.#controller.signal.aborted) reject(this.#controller.signal.reason);
      else this.#renewed.push({ resolve, reject });
    });
  }

  /** arm starts the expiry timer, once the holder is about to get what this keeps alive. */
  arm(): void {
    if (this.#armed) return;
    this.#armed = true;
    this.#rearm();
  }

  #rearm(): void {
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#controller.signal.aborted) return;
    const left = this.remaining();
    if (left === Infinity) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      if (!this.check()) this.#rearm();
    }, Math.max(0, Math.min(left, checkEveryMs)));
  }

  /** check marks it lost when the deadline has passed on either clock, and reports whether it is lost. */
  check(): boolean {
    if (this.#controller.signal.aborted) return true;
    if (this.remaining() > 0) return false;
    this.markLost(this.#expired());
    return true;
  }

  #expired(): Error {
    if (this.holdMono !== Infinity && this.#clock.monotonic() >= this.holdMono - 1) {
      return new LeaseLostError(`jetlock: lease lost: held for the longest the hold cap allows`);
    }
    return new LeaseLostError(`jetlock: lease lost: no ${this.#what} confirmed before the client's deadline`);
  }

  markLost(reason: Error): void {
    if (this.#controller.signal.aborted) return;
    if (this.#timer !== undefined) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.stopper.abort();
    this.#controller.abort(reason);
    const waiting = this.#renewed;
    this.#renewed = [];
    for (const w of waiting) w.reject(reason);
  }

  /**
   * keep keeps it alive until stopped or lost: renew sends one request, sent
   * at the stamp it is given, and moves the deadline on success. It runs at
   * a third of the TTL (±10%), never later than halfway to the deadline. A
   * request whose outcome is unknown is retried quickly until the deadline
   * (a transient outage does not end it); a refused one ends it at once.
   */
  keep(renew: (sent: Stamp, signal: AbortSignal) => Promise<void>): void {
    const loop = (async () => {
      const stop = this.stopper.signal;
      while (!stop.aborted && !this.check()) {
        if (this.atHoldLimit()) return; // it ends at the hold limit, by the expiry timer
        const ttl = this.#ttl;
        const wait = ttl / 3 - ttl / 30 + Math.random() * (ttl / 15);
        await sleep(Math.min(wait, this.remaining() / 2), stop);
        if (stop.aborted) return;
        const lost = await this.#renewUntilDeadline(renew);
        if (lost) {
          this.markLost(lost);
          return;
        }
      }
    })();
    // The loop rejects only on a bug of its own; then nothing renews, so the lease is lost.
    this.done = loop.catch((err) => this.markLost(new LeaseLostError(`jetlock: lease lost: ${this.#what} loop failed: ${err}`, { cause: err })));
  }

  async #renewUntilDeadline(renew: (sent: Stamp, signal: AbortSignal) => Promise<void>): Promise<Error | undefined> {
    let backoff = 50;
    let retryAfter = 0;
    const stop = this.stopper.signal;
    for (;;) {
      if (this.check() || stop.aborted) return undefined;
      const left = this.remaining();
      const signal = AbortSignal.any([stop, timeoutSignal(left)]);
      try {
        await renew(stamp(this.#clock), signal);
        return undefined;
      } catch (err) {
        if (err instanceof JetlockError && (err.code === "lease_lost" || err.code === "invalid_request")) {
          return new LeaseLostError(`jetlock: lease lost: ${this.#what} refused: ${err.message}`, { cause: err });
        }
        if (err instanceof JetlockError && err.code === "closed") {
          // Nothing can be sent any more: no renewal will come.
          return new LeaseLostError(`jetlock: lease lost: ${this.#what} impossible: ${err.message}`, { cause: err });
        }
        // Anything else leaves the outcome unknown: try again soon, until the deadline.
        retryAfter = err instanceof UnavailableError ? (err.retryAfterMs ?? 0) : 0;
      }
      await sleep(Math.min(Math.max(jitter(backoff), retryAfter), Math.max(0, this.remaining())), stop);
      backoff = Math.min(backoff * 2, 500);
    }
  }
}
