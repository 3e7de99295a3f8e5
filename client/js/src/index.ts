// @jetlock/client: the TypeScript client of jetlock, a lock service on
// NATS. See README.md; the wire contract is docs/protocol.md.
export { Jetlock, type JetlockOptions, type AcquireOptions, type Status, type Revocation } from "./client.js";
export { Lease } from "./lease.js";
export { Session, type SessionOptions } from "./session.js";
export { Semaphore, type SemaphoreStatus, type PermitStatus } from "./semaphore.js";
export { Election, Leadership, type ElectionOptions, type LeaderInfo, type LeaderChange } from "./election.js";
export { MemoryFence, StaleTokenError, FenceArgumentError } from "./fence.js";
export { type Clock } from "./life.js";
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
  type ErrorCode,
  type Holder,
} from "./errors.js";
