// The resource's side of fencing: keep the highest token accepted per
// resource, accept equal or larger ones, refuse smaller ones, in the same
// step as the write (docs/protocol.md, "Fencing tokens").

/** A token was refused: a newer holder's token was accepted already; the caller has lost the lock. */
export class StaleTokenError extends Error {
  readonly resource: string;
  readonly token: number;
  /** The highest token accepted for the resource; always larger than token. */
  readonly highest: number;
  constructor(resource: string, token: number, highest: number) {
    super(`fence: stale token ${token} for resource ${JSON.stringify(resource)}: token ${highest} already accepted`);
    this.name = "StaleTokenError";
    this.resource = resource;
    this.token = token;
    this.highest = highest;
  }
}

/** An argument that can never be accepted: an empty resource, or a token that is not a positive safe integer. */
export class FenceArgumentError extends Error {
  constructor(message: string) {
    super(`fence: invalid argument: ${message}`);
    this.name = "FenceArgumentError";
  }
}

/**
 * What a fence takes: a lease whose work is fenced by one token (a lock's Lease, a Permit, a Leadership; for a lock
 * set, SetLease.fenced(resource)).
 */
export interface Fenced {
  /** The name the fence keeps the token under. */
  readonly fenceKey: string;
  /** The fencing token: strictly larger than every earlier grant's under fenceKey. */
  readonly token: number;
}

interface Entry {
  highest: number;
  /** The tail of the chain of checks of this resource: each runs after the one before it. */
  tail: Promise<void>;
}

/**
 * MemoryFence keeps the highest accepted token per resource in process memory, for a resource that lives in one
 * process (a file, a device, an in-memory table), as client/fence's Memory does in Go. Its state is lost with the
 * process; it keeps one small entry per resource ever seen.
 */
export class MemoryFence {
  readonly #entries = new Map<string, Entry>();
  #rejected = 0;

  /**
   * do checks token for resource and, if it is accepted (at least the highest accepted so far), runs fn before
   * any other check of the same resource proceeds, so that no newer token can be accepted while fn runs: "check,
   * then write" is one step. A smaller token rejects with a StaleTokenError and fn does not run. The token stays
   * recorded even if fn fails: a token handed out makes every smaller one stale. fn must not call do or check on
   * the same resource (it would wait for itself).
   */
  async do<T>(resource: string, token: number, fn?: () => Promise<T> | T): Promise<T | undefined> {
    validate(resource, token);
    let e = this.#entries.get(resource);
    if (!e) this.#entries.set(resource, (e = { highest: 0, tail: Promise.resolve() }));
    const entry = e;
    const before = entry.tail;
    let done!: () => void;
    entry.tail = new Promise<void>((resolve) => (done = resolve));
    await before;
    try {
      if (token < entry.highest) {
        this.#rejected++;
        throw new StaleTokenError(resource, token, entry.highest);
      }
      entry.highest = token;
      return fn ? await fn() : undefined;
    } finally {
      done();
    }
  }

  /** guard is do(lease.fenceKey, lease.token, fn): fn runs only while no newer token of the lease's name was accepted. */
  guard<T>(lease: Fenced, fn?: () => Promise<T> | T): Promise<T | undefined> {
    return this.do(lease.fenceKey, lease.token, fn);
  }

  /** check accepts token for resource when it is at least the highest accepted so far (recording it), else rejects with a StaleTokenError. */
  async check(resource: string, token: number): Promise<void> {
    await this.do(resource, token);
  }

  /** highest returns the highest token accepted for resource, 0 if none. For display and tests only. */
  highest(resource: string): number {
    return this.#entries.get(resource)?.highest ?? 0;
  }

  /** How many tokens this fence has refused as stale. */
  get rejected(): number {
    return this.#rejected;
  }
}

function validate(resource: string, token: number): void {
  if (typeof resource !== "string" || resource === "") throw new FenceArgumentError("resource is empty");
  if (!Number.isSafeInteger(token) || token <= 0) {
    // Every jetlock token is a bucket revision, at least 1: a zero token almost always means a forgotten one.
    throw new FenceArgumentError(`token ${String(token)}: want a positive integer below 2^53`);
  }
}
