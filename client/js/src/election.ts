// Elections: a lock whose lease carries a value. Candidates queue FIFO
// (campaign); the holder leads and announces itself with its value
// (proclaim); anyone reads the leader (leader) or follows it (observe).
import { acquire, readAcquire } from "./internal/acquire.js";
import { toStatus, type Core, type SessionRef } from "./internal/core.js";
import type { Status } from "./types.js";
import { LeaseLostError } from "./errors.js";
import type { Fenced } from "./fence.js";
import type { Held } from "./internal/held.js";
import { BaseLease } from "./lease.js";
import { sleep } from "./internal/life.js";
import { checkMs, checkText, encodeResource, maxValueLen } from "./internal/validate.js";

function checkValue(value: string): string {
  return checkText("value", value, maxValueLen, true);
}

/** Options of an election, applied to every campaign. */
export interface ElectionOptions {
  /** The leadership's TTL (ms): how long a vanished leader keeps the election. Not with a session. */
  ttlMs?: number;
  owner?: string;
  /** A leader steps down at this hold cap (ms). */
  maxHoldMs?: number;
  /** A campaign retried with this id after a restart finds its leadership. Do not reuse it after resign. */
  requestId?: string;
  /** How long a campaign waits at most (then a LockedError). Default: no bound but its signal. */
  waitMs?: number;
}

/** An election's leader as the service sees it. */
export interface LeaderInfo {
  value: string;
  token: number;
  /** Shown to the leader's own tenant and to operators only. */
  owner?: string;
  expiresAt?: Date;
  inSession: boolean;
}

/** A change of an election's leader, as observe delivers it. */
export interface LeaderChange {
  /** false when the election has no leader: the one of `token` ended (token 0: none was seen). */
  leader: boolean;
  token: number;
  /** The leader's value; undefined without a leader. */
  value?: string;
  event: "elected" | "proclaimed" | "ended";
  /** The bucket revision of the write that made the change, when an event told it. */
  revision?: number;
  /** true when a status read found the change rather than an event: what happened in between was not seen. */
  resync: boolean;
}

/**
 * A Leadership is a won election: a lease whose token is the leader's fencing token (larger than every earlier
 * leader's) and whose signal aborts before anyone else could be elected.
 */
export class Leadership extends BaseLease implements Fenced {
  /** The election. */
  readonly election: Election;
  /** The leader's fencing token. Unchanged by renewals and proclaim. */
  readonly token: number;
  readonly #held: Held;

  private constructor(held: Held, election: Election) {
    super(held);
    this.#held = held;
    this.election = election;
    this.token = held.token;
  }

  /** @internal */
  static create(held: Held, election: Election): Leadership {
    return new Leadership(held, election);
  }

  /** The name a fence keeps the leader's token under: the election's name. */
  get fenceKey(): string {
    return this.election.name;
  }

  /** The leader's value, as last proclaimed. */
  get value(): string {
    return this.#held.value ?? "";
  }

  /** proclaim replaces the leader's value without a new election: the token stays; observers see "proclaimed". */
  async proclaim(value: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    await this.#held.proclaim(checkValue(value), opts.signal);
  }

  /** resign ends the leadership: the signal aborts, and the next candidate is elected in the same write. */
  resign(opts: { signal?: AbortSignal } = {}): Promise<boolean> {
    return this.release(opts);
  }
}

// observe's timings.
const observeBuffer = 1024;
const observeResyncMs = 5000; // a status read when nothing suggests a gap
const observeSoonMs = 100; // after a sign of a gap, or a read that events overtook

/** Election is one election, named like a resource. Make one per candidate; one that only reads campaigns for nothing. */
export class Election {
  readonly #core: Core;
  readonly #session?: SessionRef;
  readonly name: string;
  readonly #opts: ElectionOptions;
  #leader?: Leadership;

  /** @internal */
  static create(core: Core, session: SessionRef | undefined, name: string, opts: ElectionOptions): Election {
    return new Election(core, session, name, opts);
  }

  private constructor(core: Core, session: SessionRef | undefined, name: string, opts: ElectionOptions) {
    this.#core = core;
    this.#session = session;
    this.name = name;
    this.#opts = opts;
    readAcquire(opts, session); // the options are checked once, here
    checkMs("waitMs", opts.waitMs);
  }

  /**
   * campaign stands with value (1–1024 bytes, shown to everyone: an address) and waits in the FIFO queue until
   * elected, the signal aborts (nothing is left queued or granted), or waitMs passes (a LockedError). When this
   * Election leads already, it returns that leadership, proclaiming value if it differs.
   */
  async campaign(value: string, opts: { signal?: AbortSignal; waitMs?: number } = {}): Promise<Leadership> {
    checkValue(value);
    const current = this.#current();
    if (current) {
      if (current.value === value) return current;
      try {
        await current.proclaim(value, opts);
        return current;
      } catch (err) {
        if (!(err instanceof LeaseLostError)) throw err;
        // Lost meanwhile: campaign anew.
      }
    }
    this.#leader = await acquire(
      this.#core,
      () => ({ ...readAcquire({ ...this.#opts, signal: opts.signal }, this.#session), resource: this.name, value }),
      opts.waitMs ?? this.#opts.waitMs ?? null,
      (h) => Leadership.create(h, this),
    );
    return this.#leader;
  }

  #current(): Leadership | undefined {
    const ld = this.#leader;
    return ld && !ld.signal.aborted ? ld : undefined;
  }

  /** The leadership campaign won last, while it is not lost or resigned. */
  get leadership(): Leadership | undefined {
    return this.#current();
  }

  /** proclaim replaces the value of the leadership campaign won last; a LeaseLostError when this Election does not lead. */
  async proclaim(value: string, opts: { signal?: AbortSignal } = {}): Promise<void> {
    const ld = this.#current();
    if (!ld) throw new LeaseLostError(`jetlock: not the leader of election ${this.name}`);
    await ld.proclaim(value, opts);
  }

  /** resign ends the leadership campaign won last; false when this Election does not lead. */
  async resign(opts: { signal?: AbortSignal } = {}): Promise<boolean> {
    const ld = this.#leader;
    if (!ld) return false;
    try {
      return await ld.resign(opts);
    } finally {
      if (this.#leader === ld) this.#leader = undefined;
    }
  }

  /** leader reads the current leader, or null when there is none. A read: never decide from it that you lead. */
  async leader(opts: { signal?: AbortSignal } = {}): Promise<LeaderInfo | null> {
    const st = await this.#status(opts.signal);
    if (!st.held) return null;
    return { value: st.value ?? "", token: st.token, owner: st.owner, expiresAt: st.expiresAt, inSession: st.inSession };
  }

  async #status(signal?: AbortSignal): Promise<Status> {
    return toStatus(await this.#core.request<any>("status", { resource: this.name }, { signal, about: this.name }));
  }

  /**
   * observe follows the leader: first the current state (a status read), then every change, in revision order,
   * never going back to an older leader or value. Events are at most once; a missed one is made up for by a status
   * read (every few seconds, and at once after a sign of a gap: a reconnect, dropped events, an event about a leader
   * never seen), delivered with resync: true. The iterator ends when the signal aborts, the connection closes or
   * the client is closed, and leaves no subscription, listener or timer behind; break out of the loop to stop early.
   */
  async *observe(opts: { signal?: AbortSignal } = {}): AsyncGenerator<LeaderChange, void, undefined> {
    const jl = this.#core;
    const nc = jl.nc;
    const signal = opts.signal;
    if (signal?.aborted || nc.isClosed() || jl.closed) return;
    const subject = `${jl.prefix}.events.${encodeResource(this.name)}`;
    const events: Uint8Array[] = [];
    let gap = false;
    let wake = () => {};
    const poke = () => wake();
    let ncClosed = false;
    const sub = nc.subscribe(subject, {
      callback: (err, m) => {
        if (err) {
          ncClosed = true; // the subscription is gone (refused, or closed)
        } else {
          if (events.length >= observeBuffer) {
            events.shift();
            gap = true;
          }
          events.push(m.data);
        }
        poke();
      },
    });
    // One watcher of the connection per client, shared by every observer: an observer that ends leaves nothing
    // registered on the connection.
    const unwatch = jl.watch((e) => {
      if (e === "reconnect") gap = true;
      else ncClosed = true;
      poke();
    });
    signal?.addEventListener("abort", poke);
    const ended = () => !!signal?.aborted || ncClosed || nc.isClosed() || jl.closed;

    const st = { held: false, token: 0, value: "", rev: 0 };
    const out: LeaderChange[] = [];
    const deliver = (c: LeaderChange) => {
      if (out.length >= observeBuffer) out.shift();
      out.push(c);
    };
    const decoder = new TextDecoder();
    // event applies one event, and reports whether it suggests that events were missed.
    const event = (data: Uint8Array): boolean => {
      let ev: { resource?: string; event?: string; token?: number; value?: string; revision?: number };
      try {
        ev = JSON.parse(decoder.decode(data));
      } catch {
        return false;
      }
      if (ev.resource !== this.name || !ev.token || typeof ev.revision !== "number" || ev.revision < st.rev) return false;
      switch (ev.event) {
        case "elected":
        case "proclaimed": {
          if (ev.token < st.token || (ev.token === st.token && !st.held)) return false; // an earlier or ended leader's
          const elected = !st.held || ev.token !== st.token;
          st.rev = ev.revision;
          const value = ev.value ?? "";
          if (!elected && value === st.value) return false; // a repeat
          st.held = true;
          st.token = ev.token;
          st.value = value;
          deliver({ leader: true, token: ev.token, value, event: elected ? "elected" : "proclaimed", revision: ev.revision, resync: false });
          return elected && ev.event === "proclaimed"; // a proclaim of a leader whose election was not seen
        }
        case "ended": {
          if (ev.token < st.token || (ev.token === st.token && !st.held)) return false;
          const missed = ev.token !== st.token;
          const was = st.held;
          st.held = false;
          st.token = ev.token;
          st.value = "";
          st.rev = ev.revision;
          if (was) deliver({ leader: false, token: ev.token, event: "ended", revision: ev.revision, resync: false });
          return missed;
        }
      }
      return false;
    };
    // resync applies the events that arrived, reads the status, applies what it finds, and returns when to
    // read again; undefined when the read failed.
    const resync = async (first: boolean): Promise<number | undefined> => {
      if (!first) while (events.length > 0) event(events.shift()!);
      let s: Status;
      try {
        s = await this.#status(signal); // bounded by the client's timeout
      } catch {
        return undefined;
      }
      // Events that arrived during the read may be older or newer than what it found: read again soon.
      const overtaken = events.length > 0;
      if (first) {
        if (s.held) {
          Object.assign(st, { held: true, token: s.token, value: s.value ?? "", rev: s.token });
          deliver({ leader: true, token: s.token, value: s.value ?? "", event: "elected", resync: true });
        } else {
          Object.assign(st, { held: false, token: 0, value: "" });
          deliver({ leader: false, token: 0, event: "ended", resync: true });
        }
        return overtaken ? observeSoonMs : observeResyncMs;
      }
      if (s.held && s.token > st.token) {
        // A leader newer than any seen: certain, whatever overtook it.
        Object.assign(st, { held: true, token: s.token, value: s.value ?? "", rev: Math.max(st.rev, s.token) });
        deliver({ leader: true, token: s.token, value: s.value ?? "", event: "elected", resync: true });
      } else if (s.held && s.token === st.token && st.held && (s.value ?? "") !== st.value) {
        if (overtaken) return observeSoonMs;
        st.value = s.value ?? "";
        deliver({ leader: true, token: s.token, value: st.value, event: "proclaimed", resync: true });
      } else if (!s.held && st.held) {
        if (overtaken) return observeSoonMs;
        st.held = false;
        st.value = "";
        deliver({ leader: false, token: st.token, event: "ended", resync: true });
      }
      return observeResyncMs;
    };
    const pause = (ms: number) =>
      new Promise<void>((resolve) => {
        const t = setTimeout(done, Math.max(0, ms));
        function done() {
          clearTimeout(t);
          wake = () => {};
          resolve();
        }
        wake = done;
      });

    try {
      // The subscription must reach the server before the first status read, or a change between the two
      // could be missed until the next read.
      const flushed = new AbortController();
      await Promise.race([
        nc.flush().finally(() => flushed.abort()),
        sleep(jl.timeoutMs, signal ? AbortSignal.any([signal, flushed.signal]) : flushed.signal),
      ]).catch(() => undefined);
      let next: number | undefined;
      while (!ended()) {
        const r = await resync(true);
        if (r !== undefined) {
          next = jl.clock.monotonic() + r;
          break;
        }
        await pause(1000);
      }
      while (!ended()) {
        while (out.length > 0) {
          yield out.shift()!;
          if (ended()) return;
        }
        if (events.length > 0) {
          if (event(events.shift()!)) next = Math.min(next!, jl.clock.monotonic() + observeSoonMs);
          continue;
        }
        if (gap) {
          gap = false;
          next = Math.min(next!, jl.clock.monotonic() + observeSoonMs);
        }
        const now = jl.clock.monotonic();
        if (now >= next!) {
          const r = await resync(false);
          next = jl.clock.monotonic() + (r ?? 1000);
          continue;
        }
        await pause(next! - now);
      }
    } finally {
      wake = () => {};
      signal?.removeEventListener("abort", poke);
      unwatch();
      if (!nc.isClosed()) sub.unsubscribe();
    }
  }
}
