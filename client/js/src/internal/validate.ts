// The contract's bounds on what a request carries (docs/protocol.md),
// checked before anything is sent: bad input is refused with
// invalid_request and nothing changes.
import { InvalidRequestError } from "../errors.js";

export const maxResourceLen = 200;
export const maxRequestIdLen = 128;
export const maxOwnerLen = 128;
export const maxValueLen = 1024;
export const maxReasonLen = 256;
export const maxLimit = 1000;
export const minSetSize = 2;
export const defaultMaxSetSize = 64;
export const maxSetSize = 256;
/** The largest wait_ms one request asks for; a longer wait is several requests with the same request_id. */
export const maxWaitChunkMs = 60_000;

const encoder = new TextEncoder();

export function byteLength(s: string): number {
  return encoder.encode(s).length;
}

function invalid(what: string): InvalidRequestError {
  return new InvalidRequestError(`jetlock: invalid request: ${what}`);
}

/** checkResource: 1–200 bytes of letters, digits and - _ . / = : @, not starting or ending with . or /. */
export function checkResource(r: unknown, field = "resource"): string {
  if (typeof r !== "string" || r === "") throw invalid(`${field} is required`);
  if (r.length > maxResourceLen) throw invalid(`${field} is ${r.length} bytes, at most ${maxResourceLen} allowed`);
  if (!/^[A-Za-z0-9\-_./=:@]+$/.test(r)) {
    throw invalid(`${field} ${JSON.stringify(r)} has a character outside letters, digits and - _ . / = : @`);
  }
  if (/^[./]|[./]$/.test(r)) throw invalid(`${field} must not start or end with '.' or '/'`);
  return r;
}

/** checkText: UTF-8 text of at most max bytes without control characters. */
export function checkText(field: string, s: unknown, max: number, required: boolean): string {
  if (s === undefined || s === "") {
    if (required) throw invalid(`${field} is required`);
    return "";
  }
  if (typeof s !== "string") throw invalid(`${field} must be a string`);
  if (!s.isWellFormed()) throw invalid(`${field} is not valid UTF-8`);
  const n = byteLength(s);
  if (n > max) throw invalid(`${field} is ${n} bytes, at most ${max} allowed`);
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) throw invalid(`${field} contains a control character`);
  }
  return s;
}

/** checkMs: a duration in milliseconds, an integer from min (when given) up; undefined stays undefined. */
export function checkMs(field: string, v: unknown, min = 1): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min) {
    throw invalid(`${field} ${String(v)}: want an integer number of milliseconds, at least ${min}`);
  }
  return v;
}

/** checkLimit: a semaphore's number of permits, 1–1000. */
export function checkLimit(limit: unknown): number {
  if (typeof limit !== "number" || !Number.isSafeInteger(limit) || limit < 1 || limit > maxLimit) {
    throw invalid(`limit ${String(limit)} outside [1, ${maxLimit}]`);
  }
  return limit;
}

/** checkSet: 2 to max names, each a valid resource, none twice; returned sorted, in a new array. */
export function checkSet(resources: unknown, max: number): string[] {
  if (!Array.isArray(resources)) throw invalid("resources must be an array of resource names");
  const n = resources.length;
  if (n < minSetSize || n > max) {
    const hint = n === 1 ? " (acquire one resource with acquire)" : "";
    throw invalid(`lock set: ${n} resources: a lock set has ${minSetSize} to ${max}${hint}`);
  }
  resources.forEach((r, i) => checkResource(r, `resources[${i}]`));
  const set = [...(resources as string[])].sort(compare);
  for (let i = 1; i < set.length; i++) {
    if (set[i] === set[i - 1]) throw invalid(`lock set: ${JSON.stringify(set[i])} named twice`);
  }
  return set;
}

/** compare orders strings by their bytes, as the service sorts a set (Go's string order). */
export function compare(a: string, b: string): number {
  // Resource names are ASCII, so UTF-16 order is byte order.
  return a < b ? -1 : a > b ? 1 : 0;
}

/** encodeResource maps a resource to its key form (docs/protocol.md, "The bucket"): an election's event subject uses it. */
export function encodeResource(r: string): string {
  let out = "";
  for (const b of encoder.encode(r)) {
    const c = String.fromCharCode(b);
    if (/[A-Za-z0-9\-_/]/.test(c)) out += c;
    else out += "=" + b.toString(16).toUpperCase().padStart(2, "0");
  }
  return out;
}
