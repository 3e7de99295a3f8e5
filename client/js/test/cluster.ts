// Test helpers: a real lockd --dev (a three-node NATS cluster with the
// service) on free loopback ports, a Go program that uses the Go client,
// a pausable TCP path, and an `eventually` poll.
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { createServer, connect as tcpConnect, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

/** The repository's root: this file is client/js/build/test/cluster.js once built. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

let buildDir: string | undefined;

/** goBuild builds a Go command of the repository once per process (JETLOCK_LOCKD / JETLOCK_GOHELPER name prebuilt ones). */
function goBuild(pkg: string, name: string, env: string): string {
  const given = process.env[env];
  if (given) return given;
  buildDir ??= mkdtempSync(join(tmpdir(), "jetlock-ts-bin-"));
  const out = join(buildDir, name);
  if (!existsSync(out)) {
    execFileSync("go", ["build", "-o", out, pkg], { cwd: repoRoot, stdio: ["ignore", "inherit", "inherit"] });
  }
  return out;
}

export function lockdBinary(): string {
  return goBuild("./service/cmd/lockd", "lockd", "JETLOCK_LOCKD");
}

export function goHelperBinary(): string {
  return goBuild("./client/js/testdata/gohelper", "gohelper", "JETLOCK_GOHELPER");
}

/** freePort asks the kernel for a free loopback port. */
export async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((ok) => srv.listen(0, "127.0.0.1", ok));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((ok) => srv.close(() => ok()));
  return port;
}

/** A running lockd --dev. */
export class Cluster {
  readonly ports: number[];
  readonly dir: string;
  readonly extra: string[];
  #proc?: ChildProcess;
  #log: string[] = [];

  private constructor(ports: number[], dir: string, extra: string[]) {
    this.ports = ports;
    this.dir = dir;
    this.extra = extra;
  }

  /** start builds lockd if needed and starts lockd --dev on three free loopback ports; extra are more serve flags. */
  static async start(extra: string[] = []): Promise<Cluster> {
    const ports = [await freePort(), await freePort(), await freePort()];
    const c = new Cluster(ports, mkdtempSync(join(tmpdir(), "jetlock-ts-dev-")), extra);
    await c.restart();
    return c;
  }

  /** The NATS URLs of the three nodes. */
  get servers(): string[] {
    return this.ports.map((p) => `nats://127.0.0.1:${p}`);
  }

  get running(): boolean {
    return this.#proc !== undefined && this.#proc.exitCode === null && this.#proc.signalCode === null;
  }

  /** restart starts lockd again on the same ports and data (after kill), and resolves when it serves. */
  async restart(): Promise<void> {
    const args = ["--dev", "--dev-ports", this.ports.join(","), "--dev-dir", this.dir, ...this.extra];
    const proc = spawn(lockdBinary(), args, { stdio: ["ignore", "pipe", "pipe"] });
    children.add(proc);
    this.#proc = proc;
    const lines = createInterface({ input: proc.stdout! });
    createInterface({ input: proc.stderr! }).on("line", (l) => this.#remember(l));
    await new Promise<void>((ok, fail) => {
      const t = setTimeout(() => fail(new Error(`lockd did not serve within 90 s:\n${this.#log.join("\n")}`)), 90_000);
      lines.on("line", (l) => {
        this.#remember(l);
        if (l.includes("jetlock is serving.")) {
          clearTimeout(t);
          ok();
        }
      });
      proc.on("exit", (code, sig) => {
        clearTimeout(t);
        fail(new Error(`lockd exited (${code ?? sig}):\n${this.#log.join("\n")}`));
      });
    });
  }

  #remember(l: string) {
    this.#log.push(l);
    if (this.#log.length > 200) this.#log.shift();
  }

  /** kill stops the service and the whole cluster at once (SIGKILL), leaving its data for restart. */
  async kill(): Promise<void> {
    const p = this.#proc;
    if (!p || !this.running) return;
    const exited = new Promise<void>((ok) => p.once("exit", () => ok()));
    p.kill("SIGKILL");
    await exited;
    children.delete(p);
  }

  /** stop kills lockd and removes its data. */
  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** eventually polls cond until it holds, every 50 ms, for at most limitMs (a bound, not an expectation of speed). */
export async function eventually(what: string, cond: () => boolean | Promise<boolean>, limitMs = 30_000): Promise<void> {
  const end = Date.now() + limitMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > end) throw new Error(`gave up waiting for ${what} after ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

let counter = 0;
/** unique returns a resource name no other test uses. */
export function unique(prefix: string): string {
  return `ts/${prefix}/${process.pid}-${++counter}`;
}

/**
 * A Path is a TCP forwarder on loopback between a client and one NATS node, that a test can pause (bytes are held,
 * as for a holder whose host froze, then delivered on resume) without closing the connection.
 */
export class Path {
  readonly #server: Server;
  readonly #pairs = new Set<[Socket, Socket]>();
  #paused = false;
  port = 0;

  private constructor(server: Server) {
    this.#server = server;
  }

  static async open(targetPort: number): Promise<Path> {
    const p = new Path(createServer());
    p.#server.on("connection", (client) => {
      const upstream = tcpConnect(targetPort, "127.0.0.1");
      const pair: [Socket, Socket] = [client, upstream];
      p.#pairs.add(pair);
      if (p.#paused) {
        client.pause();
        upstream.pause();
      }
      client.pipe(upstream);
      upstream.pipe(client);
      const end = () => {
        client.destroy();
        upstream.destroy();
        p.#pairs.delete(pair);
      };
      client.on("error", end).on("close", end);
      upstream.on("error", end).on("close", end);
    });
    await new Promise<void>((ok) => p.#server.listen(0, "127.0.0.1", ok));
    p.port = (p.#server.address() as { port: number }).port;
    return p;
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  /** pause stops forwarding in both directions; nothing is lost. */
  pause(): void {
    this.#paused = true;
    for (const [a, b] of this.#pairs) {
      a.pause();
      b.pause();
    }
  }

  resume(): void {
    this.#paused = false;
    for (const [a, b] of this.#pairs) {
      a.resume();
      b.resume();
    }
  }

  close(): void {
    for (const [a, b] of this.#pairs) {
      a.destroy();
      b.destroy();
    }
    this.#server.close();
  }
}

/**
 * GoHelper runs client/js/testdata/gohelper: a Go program that uses the Go client on the cluster, driven by
 * lines on its stdin ("ID OP ARGS...") and answering "ID RESULT..." on its stdout.
 */
export class GoHelper {
  readonly #proc: ChildProcess;
  readonly #waiting = new Map<string, (line: string) => void>();
  #next = 0;

  constructor(servers: string[]) {
    this.#proc = spawn(goHelperBinary(), [servers.join(",")], { stdio: ["pipe", "pipe", "inherit"] });
    children.add(this.#proc);
    createInterface({ input: this.#proc.stdout! }).on("line", (l) => {
      const sp = l.indexOf(" ");
      const id = sp < 0 ? l : l.slice(0, sp);
      const f = this.#waiting.get(id);
      if (f) {
        this.#waiting.delete(id);
        f(sp < 0 ? "" : l.slice(sp + 1));
      }
    });
  }

  /** send sends one command and resolves with its answer (without the id). */
  send(...words: string[]): Promise<string> {
    const id = String(++this.#next);
    const p = new Promise<string>((ok) => this.#waiting.set(id, ok));
    this.#proc.stdin!.write(`${id} ${words.join(" ")}\n`);
    return p;
  }

  async close(): Promise<void> {
    const exited = new Promise<void>((ok) => this.#proc.once("exit", () => ok()));
    this.#proc.stdin!.end();
    await exited;
    children.delete(this.#proc);
  }
}
