// The client's core, which the package does not export: requests, their
// retries and bounds, and what the client must end when it closes. Every
// public object (Jetlock, a lease, a session, a semaphore, an election)
// holds the core of the client that made it.
import { errors as natsErrors, type NatsConnection } from "@nats-io/transport-node";
import { randomBytes } from "node:crypto";
import {
  ClientClosedError,
  ForbiddenError,
  InternalError,
  JetlockError,
  UnavailableError,
  fromWire,
  type WireError,
} from "../errors.js";
import type { Clock, Status } from "../types.js";
import { jitter, sleep, type Life } from "./life.js";

/** The options the core runs with, checked by Jetlock's constructor. */
export interface CoreOptions {
  prefix: string;
  timeoutMs: number;
  safetyMarginMs: number;
  retries: number;
  maxSetSize: number;
  clock: Clock;
}

/** What a lease bound to a session needs of it. */
export interface SessionRef {
  readonly id: string;
  readonly life: Life;
  /** The signal, after a look at the clocks. */
  readonly signal: AbortSignal;
  remaining(): number;
  renewed(): Promise<void>;
  throwIfEnded(): void;
}

/** Something the client keeps alive and ends when it closes: a lease or a session. */
export interface Kept {
  end(bound: AbortSignal): Promise<unknown>;
}

/** A connection event that an observer follows. */
export type ConnectionEvent = "reconnect" | "closed";

export function newRequestId(): string {
  return randomBytes(16).toString("hex");
}

function parseDate(s: string | undefined): Date | undefined {
  if (!s) return undefined;
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? undefined : d;
}

export function toStatus(r: any): Status {
  return {
    resource: r.resource,
    held: !!r.held || r.held === undefined,
    owner: r.owner || undefined,
    token: r.token ?? 0,
    expiresAt: parseDate(r.expires_at),
    waiters: r.waiters ?? 0,
    holdUntil: parseDate(r.hold_until),
    inSession: !!r.in_session,
    sessionOwner: r.session_owner || undefined,
    setSize: r.set_size || undefined,
    value: r.value || undefined,
    permit: r.permit || undefined,
  };
}

export function aborted(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/** A bound on one call: its signal aborts with an UnavailableError when the time is up, or with the caller's reason. */
export interface Bound {
  readonly signal: AbortSignal;
  /** Stops the timer (a bound never keeps Node alive on its own, but a finished call clears it). */
  done(): void;
}

export class Core {
  readonly nc: NatsConnection;
  readonly prefix: string;
  readonly timeoutMs: number;
  readonly safetyMarginMs: number;
  readonly retries: number;
  readonly maxSetSize: number;
  readonly clock: Clock;
  readonly #owned: boolean;
  /** Cleanup running after the call that started it returned (cancels, releases): close() waits for it. */
  readonly #background = new Set<Promise<unknown>>();
  /** Requests waiting for a reply, by subject: a publish the server refuses fails them at once. */
  readonly #pending = new Map<string, Set<(err: Error) => void>>();
  /** Every request waiting for a reply: close() fails them. */
  readonly #calls = new Set<(err: Error) => void>();
  /** The leases and sessions still kept: close() ends them. */
  readonly #kept = new Set<Kept>();
  readonly #watchers = new Set<(e: ConnectionEvent) => void>();
  readonly #statusIt: AsyncIterable<{ type: string }> & { stop(): void };
  #closed?: ClientClosedError;
  #closing?: Promise<void>;

  constructor(nc: NatsConnection, opts: CoreOptions, owned: boolean) {
    this.nc = nc;
    this.#owned = owned;
    this.prefix = opts.prefix;
    this.timeoutMs = opts.timeoutMs;
    this.safetyMarginMs = opts.safetyMarginMs;
    this.retries = opts.retries;
    this.maxSetSize = opts.maxSetSize;
    this.clock = opts.clock;
    this.#statusIt = nc.status() as AsyncIterable<{ type: string }> & { stop(): void };
    this.#watchStatus();
    nc.closed().then(
      () => this.#emit("closed"),
      () => this.#emit("closed"),
    );
  }

  /** Whether close() was called. */
  get closed(): boolean {
    return this.#closed !== undefined;
  }

  /** throwIfClosed throws the error a call on a closed client (or a closed connection) gets. */
  throwIfClosed(): void {
    if (this.#closed) throw this.#closed;
    if (this.nc.isClosed()) throw new ClientClosedError("jetlock: client closed: the NATS connection is closed");
  }

  /** watch calls fn on a reconnect and once when the connection or the client closes; the result stops it. */
  watch(fn: (e: ConnectionEvent) => void): () => void {
    this.#watchers.add(fn);
    return () => this.#watchers.delete(fn);
  }

  #emit(e: ConnectionEvent): void {
    for (const fn of [...this.#watchers]) fn(e);
  }

  /** keep registers what close() must end; the result forgets it (on release or loss). */
  keep(k: Kept): () => void {
    this.#kept.add(k);
    return () => this.#kept.delete(k);
  }

  /** background runs cleanup after the call that needs it has returned, bounded in time; close() waits for it. */
  background(p: Promise<unknown>): void {
    const q = p.catch(() => undefined).finally(() => this.#background.delete(q));
    this.#background.add(q);
  }

  /** The number of cleanups still running. */
  get pendingCleanup(): number {
    return this.#background.size;
  }

  /**
   * bound returns the bound of one call: the caller's signal, and the client's timeout (plus extraMs: a wait's own
   * length) after which the call rejects with an UnavailableError. Infinity leaves only the signal.
   */
  bound(what: string, signal: AbortSignal | undefined, extraMs = 0): Bound {
    const total = this.timeoutMs + extraMs;
    if (total === Infinity) return { signal: signal ?? new AbortController().signal, done: () => {} };
    const c = new AbortController();
    const t = setTimeout(
      () => c.abort(new UnavailableError(`jetlock: service unavailable: ${what}: no answer within ${total} ms (the outcome is unknown)`)),
      Math.min(total, 2 ** 31 - 1),
    );
    t.unref();
    return { signal: signal ? AbortSignal.any([signal, c.signal]) : c.signal, done: () => clearTimeout(t) };
  }

  #watchStatus(): void {
    (async () => {
      for await (const s of this.#statusIt) {
        if (s.type === "disconnect" || s.type === "reconnect") {
          // A reply to a request sent before the connection dropped, or while it was down, may never come (the
          // server that would route it, or the service instance that was serving it, is gone): fail the requests
          // now as unknown outcomes, which their callers send again with the same ids.
          const lost = new UnavailableError("jetlock: service unavailable: the connection to the NATS server dropped");
          for (const waiting of this.#pending.values()) for (const fail of waiting) fail(lost);
          if (s.type === "reconnect") this.#emit("reconnect");
          continue;
        }
        if (s.type !== "error") continue;
        const err = (s as { error?: unknown }).error;
        if (err instanceof natsErrors.PermissionViolationError && err.operation === "publish") {
          const waiting = this.#pending.get(err.subject);
          if (!waiting) continue;
          const refused = new ForbiddenError(`jetlock: permission denied: publish to ${JSON.stringify(err.subject)} refused by the NATS server`, { cause: err });
          for (const fail of waiting) fail(refused);
        }
      }
    })().catch(() => undefined);
  }

  /**
   * call sends one request and returns its decoded reply. An error reply becomes the matching typed error; no
   * reply (timeout, no responders, a dropped connection) becomes UnavailableError: the outcome is unknown. A
   * closed client or connection is a ClientClosedError. When signal aborts, call rejects with its reason at once.
   * cleanup marks a request that close() itself needs (a cancel, a release): it is sent on a closed client.
   * background marks a renewal or keepalive: close() stops its loop rather than failing it.
   */
  async call<T>(op: string, body: object, opts: { extraMs?: number; signal?: AbortSignal; about?: string; cleanup?: boolean; background?: boolean } = {}): Promise<T> {
    if (!opts.cleanup || this.nc.isClosed()) this.throwIfClosed();
    const subject = `${this.prefix}.v1.${op}`;
    const signal = opts.signal;
    if (signal?.aborted) throw aborted(signal);
    const data = new TextEncoder().encode(JSON.stringify(body));
    let fail!: (err: unknown) => void;
    const failed = new Promise<never>((_, reject) => (fail = reject));
    failed.catch(() => undefined);
    const onAbort = () => fail(aborted(signal!));
    signal?.addEventListener("abort", onAbort, { once: true });
    let set = this.#pending.get(subject);
    if (!set) this.#pending.set(subject, (set = new Set()));
    set.add(fail);
    if (!opts.cleanup && !opts.background) this.#calls.add(fail);
    try {
      let msg;
      try {
        const req = this.nc.request(subject, data, { timeout: this.timeoutMs + (opts.extraMs ?? 0) });
        req.catch(() => undefined);
        msg = await Promise.race([req, failed]);
      } catch (err) {
        if (err instanceof JetlockError || signal?.aborted) throw err;
        for (let e: unknown = err; e instanceof Error; e = e.cause) {
          if (e instanceof natsErrors.PermissionViolationError) {
            throw new ForbiddenError(`jetlock: permission denied: publish to ${JSON.stringify(subject)} refused by the NATS server`, { cause: err });
          }
        }
        if (this.#closed) throw this.#closed;
        if (this.nc.isClosed()) throw new ClientClosedError("jetlock: client closed: the NATS connection is closed", { cause: err });
        throw new UnavailableError(`jetlock: service unavailable: ${op} request: ${(err as Error).message}`, undefined, { cause: err });
      }
      const code = msg.headers?.get("Nats-Service-Error-Code");
      let reply: any;
      try {
        reply = msg.data.length > 0 ? JSON.parse(new TextDecoder().decode(msg.data)) : {};
      } catch {
        if (!code) throw new InternalError(`jetlock: internal service error: ${op}: bad reply`);
      }
      if (code) {
        throw fromWire(code, msg.headers?.get("Nats-Service-Error") ?? "", reply?.error as WireError | undefined, opts.about ?? "");
      }
      return reply as T;
    } finally {
      signal?.removeEventListener("abort", onAbort);
      set.delete(fail);
      this.#calls.delete(fail);
      if (set.size === 0) this.#pending.delete(subject);
    }
  }

  /**
   * retry runs fn until it throws something other than UnavailableError, at most 1+retries times (or, with
   * untilMono, until then), with jittered backoff, or the service's retry_after_ms when longer. When signal
   * aborts it rejects with the signal's reason.
   */
  async retry<T>(fn: () => Promise<T>, signal?: AbortSignal, untilMono?: number): Promise<T> {
    let backoff = 50;
    for (let attempt = 0; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        if (signal?.aborted) throw aborted(signal);
        if (!(err instanceof UnavailableError)) throw err;
        const now = this.clock.monotonic();
        if (untilMono === undefined ? attempt >= this.retries : now >= untilMono) throw err;
        let pause = Math.max(jitter(backoff), err.retryAfterMs ?? 0);
        if (untilMono !== undefined) pause = Math.min(pause, untilMono - now);
        await sleep(pause, signal);
        if (signal?.aborted) throw aborted(signal);
        backoff = Math.min(backoff * 2, 1000);
      }
    }
  }

  /** request is call with retries, the whole bounded by the client's timeout and the caller's signal. */
  async request<T>(op: string, body: object, opts: { signal?: AbortSignal; about?: string } = {}): Promise<T> {
    this.throwIfClosed();
    const b = this.bound(op, opts.signal);
    try {
      return await this.retry(() => this.call<T>(op, body, { signal: b.signal, about: opts.about }), b.signal);
    } finally {
      b.done();
    }
  }

  /**
   * close ends what the client started: every call waiting for a reply rejects with a ClientClosedError (an
   * acquire's wait is cancelled at the service), the leases and sessions still kept are released, and the
   * cleanup still running is waited for, all within one timeout; then the connection is closed if the client
   * opened it.
   */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#closed = new ClientClosedError();
    for (const fail of [...this.#calls]) fail(this.#closed);
    // The calls just failed start their cancels on the next turns.
    await new Promise((r) => setImmediate(r));
    const b = this.bound("close", undefined);
    const expired = new Promise<void>((r) => b.signal.addEventListener("abort", () => r(), { once: true }));
    try {
      const ended = Promise.allSettled([...this.#kept].map((k) => k.end(b.signal)));
      await Promise.race([ended, expired]);
      while (this.#background.size > 0 && !b.signal.aborted) {
        await Promise.race([Promise.allSettled([...this.#background]), expired]);
      }
    } finally {
      b.done();
      this.#statusIt.stop();
      this.#emit("closed");
      this.#watchers.clear();
      if (this.#owned && !this.nc.isClosed()) await this.nc.close();
    }
  }
}
