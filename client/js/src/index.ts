// @jetlock/client: the TypeScript client of jetlock, a lock service on
// NATS. See README.md; the wire contract is docs/protocol.md. Only what
// this module exports is the package's API: the other modules are its
// internals.
export { Jetlock, type JetlockOptions, type Revocation } from "./client.js";
export { type AcquireOptions, type Clock, type Status } from "./types.js";
export { BaseLease, Lease, SetLease } from "./lease.js";
export { Session, type SessionOptions } from "./session.js";
export { Semaphore, Permit, type SemaphoreStatus, type PermitStatus } from "./semaphore.js";
export { Election, Leadership, type ElectionOptions, type LeaderInfo, type LeaderChange } from "./election.js";
export { MemoryFence, StaleTokenError, FenceArgumentError, type Fenced } from "./fence.js";
export {
  JetlockError,
  LockedError,
  LeaseLostError,
  ForbiddenError,
  UnavailableError,
  InvalidRequestError,
  TooManyWaitersError,
  InternalError,
  ReleasedError,
  SessionClosedError,
  ClientClosedError,
  type ErrorCode,
  type Holder,
} from "./errors.js";
