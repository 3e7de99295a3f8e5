// Typed errors. Every error the client throws for the service's answers
// is a JetlockError whose `code` is the wire contract's code
// (docs/protocol.md, "Errors"); test with `instanceof` or with `code`.

/** The contract's error codes, plus the client's own "released", "session_closed" and "closed". */
export type ErrorCode =
  | "locked"
  | "lease_lost"
  | "forbidden"
  | "unavailable"
  | "invalid_request"
  | "too_many_waiters"
  | "internal"
  | "released"
  | "session_closed"
  | "closed";

/** A JetlockError is an error answered by the service, or one the client raises with the same meaning. */
export class JetlockError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = "JetlockError";
  }
}

/** A held resource and who holds it, in a LockedError. */
export interface Holder {
  /** The held resource (for a lock set, the member). */
  resource: string;
  /** The holder's owner text, when the service shows it to you (your own tenant, or an operator). */
  owner?: string;
  /** The holder's fencing token of `resource`. */
  token: number;
  /** The service's view of the holder's expiry, for display. */
  expiresAt?: Date;
}

/** `locked`: the resource (or a member of the set, or every permit) is held by another lease. */
export class LockedError extends JetlockError {
  /** The resource, or for a set the first held member, or the semaphore. */
  readonly resource: string;
  /** The holder of `resource` ({@link holders}[0]); absent when the service names none. */
  readonly holder?: Holder;
  /** Every held resource asked for, with its holder (one for a lock; each held member for a set). */
  readonly holders: Holder[];
  /** For a semaphore, its number of permits (none free); otherwise undefined. */
  readonly limit?: number;
  constructor(message: string, resource: string, holders: Holder[], limit?: number) {
    super("locked", message);
    this.name = "LockedError";
    this.resource = resource;
    this.holders = holders;
    this.holder = holders[0];
    this.limit = limit;
  }
}

/** `lease_lost`: the lease (or session) is no longer current; stop using it. */
export class LeaseLostError extends JetlockError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("lease_lost", message, options);
    this.name = "LeaseLostError";
  }
}

/** `forbidden`: an admin request from a sender that is not an operator, or a publish the NATS server refused. Nothing changed. */
export class ForbiddenError extends JetlockError {
  constructor(message: string, options?: { cause?: unknown }) {
    super("forbidden", message, options);
    this.name = "ForbiddenError";
  }
}

/** `unavailable`: the outcome is unknown (no quorum, no reply, overload); retried with the same ids. */
export class UnavailableError extends JetlockError {
  /** How long the service asked the caller to wait before trying again, when it said. */
  readonly retryAfterMs?: number;
  constructor(message: string, retryAfterMs?: number, options?: { cause?: unknown }) {
    super("unavailable", message, options);
    this.name = "UnavailableError";
    this.retryAfterMs = retryAfterMs;
  }
}

/** `invalid_request`: malformed or out of bounds; nothing changed. The client raises it too, before sending. */
export class InvalidRequestError extends JetlockError {
  constructor(message: string) {
    super("invalid_request", message);
    this.name = "InvalidRequestError";
  }
}

/** `too_many_waiters`: a cap on waiters, leases or sessions is reached; try later. */
export class TooManyWaitersError extends JetlockError {
  constructor(message: string) {
    super("too_many_waiters", message);
    this.name = "TooManyWaitersError";
  }
}

/** `internal`: a bug in the service (it logged the details), or a reply the client cannot use. */
export class InternalError extends JetlockError {
  constructor(message: string) {
    super("internal", message);
    this.name = "InternalError";
  }
}

/** The reason of a lease's signal after release(): the holder ended it. */
export class ReleasedError extends JetlockError {
  constructor(message = "jetlock: lease released") {
    super("released", message);
    this.name = "ReleasedError";
  }
}

/** The reason of a session's signal after close(), and what an acquire on a closed session throws. */
export class SessionClosedError extends JetlockError {
  constructor(message = "jetlock: session closed") {
    super("session_closed", message);
    this.name = "SessionClosedError";
  }
}

/**
 * `closed`: the client was closed (a call made after close(), or a call close() ended: a wait is cancelled at the
 * service first), or the NATS connection it uses was closed under it. Nothing is retried after it.
 */
export class ClientClosedError extends JetlockError {
  constructor(message = "jetlock: client closed", options?: { cause?: unknown }) {
    super("closed", message, options);
    this.name = "ClientClosedError";
  }
}

/** The error body of a reply (docs/protocol.md, "Errors"). */
export interface WireError {
  code?: string;
  message?: string;
  holder?: { resource?: string; owner?: string; token?: number; expires_at?: string };
  holders?: { resource?: string; owner?: string; token?: number; expires_at?: string }[];
  retry_after_ms?: number;
}

const statusCodes: Record<string, ErrorCode> = {
  "400": "invalid_request",
  "403": "forbidden",
  "409": "locked",
  "410": "lease_lost",
  "429": "too_many_waiters",
  "500": "internal",
  "503": "unavailable",
};

function parseDate(s: string | undefined): Date | undefined {
  if (!s) return undefined;
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? undefined : d;
}

/** fromWire turns an error reply (its header code and body) into the matching typed error. */
export function fromWire(headerCode: string, headerText: string, body: WireError | undefined, about: string): JetlockError {
  const code = body?.code ?? statusCodes[headerCode] ?? "internal";
  const text = `jetlock: ${body?.message || headerText || code}`;
  switch (code) {
    case "locked": {
      const holders: Holder[] = [];
      const one = (h: NonNullable<WireError["holder"]>): Holder => ({
        resource: h.resource ?? about,
        owner: h.owner || undefined,
        token: h.token ?? 0,
        expiresAt: parseDate(h.expires_at),
      });
      if (body?.holders?.length) {
        for (const h of body.holders) holders.push(one(h));
        holders.sort((a, b) => (a.resource < b.resource ? -1 : a.resource > b.resource ? 1 : 0));
      } else if (body?.holder) {
        holders.push(one(body.holder));
      }
      return new LockedError(text, holders[0]?.resource ?? about, holders);
    }
    case "lease_lost":
      return new LeaseLostError(text);
    case "forbidden":
      return new ForbiddenError(text);
    case "unavailable":
      return new UnavailableError(text, typeof body?.retry_after_ms === "number" ? body.retry_after_ms : undefined);
    case "invalid_request":
      return new InvalidRequestError(text);
    case "too_many_waiters":
      return new TooManyWaitersError(text);
    default:
      return new InternalError(text);
  }
}
