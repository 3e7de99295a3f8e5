// The package as Node users get it: `npm pack`, then `npm install` of the
// tarball in a fresh ESM project, imported from plain JavaScript and
// type-checked from TypeScript (await using, and a lock set refused where
// a fenced token is needed). And its surface: no internal name in the
// published declarations, no import circle in src.
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { repoRoot } from "./cluster.js";

const pkgDir = join(repoRoot, "client", "js");
let work: string;
let tarball: string;
let unpacked: string;

function run(cmd: string, args: string[], cwd: string): string {
  try {
    return execFileSync(cmd, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 180_000 });
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(" ")} in ${cwd}: ${e.message}\n${e.stdout ?? ""}\n${e.stderr ?? ""}`);
  }
}

before(() => {
  work = mkdtempSync(join(tmpdir(), "jetlock-ts-pack-"));
  // npm pack runs the prepare script (tsc): the tarball carries what it builds.
  const out = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", work], pkgDir)) as { filename: string }[];
  tarball = join(work, out[0]!.filename);
  unpacked = join(work, "unpacked");
  mkdirSync(unpacked);
  run("tar", ["-xzf", tarball, "-C", unpacked], work);
});

after(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

function files(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...files(p));
    else out.push(p);
  }
  return out;
}

// What the issue found public, and what the internals are called: none may be in the published declarations.
const internalNames = [
  "call",
  "retry",
  "run",
  "readAcquire",
  "background",
  "abandon",
  "newLife",
  "owned",
  "start",
  "open",
  "openSession",
  "throwIfEnded",
  "rawSignal",
  "Core",
  "Held",
  "Keeper",
  "Life",
  "SessionRef",
  "AcquireSpec",
  "GrantReply",
  "proclaimValue",
  "create",
];

describe("the package", () => {
  it("npm pack carries the README, the ESM build and its declarations, and no internal declaration", () => {
    const root = join(unpacked, "package");
    const packed = files(root).map((f) => relative(root, f));
    for (const want of ["package.json", "README.md", "dist/index.js", "dist/index.d.ts", "dist/lease.d.ts", "dist/internal/core.js"]) {
      assert.ok(packed.includes(want), `the tarball has ${want} (it has ${packed.join(", ")})`);
    }
    assert.deepEqual(
      packed.filter((f) => f.startsWith("dist/internal/") && !f.endsWith(".js")),
      [],
      "internal modules ship as code only",
    );
    const decls = packed.filter((f) => f.endsWith(".d.ts"));
    for (const d of decls) {
      // The declarations without their comments, which may use these words in prose.
      const text = readFileSync(join(root, d), "utf8").replace(/\/\*[\s\S]*?\*\//g, "").replace(/\/\/.*$/gm, "");
      for (const name of internalNames) {
        // A declared member, method, property, class, function or type of that name.
        const re = new RegExp(`(^|[\\s{,(;])(?:readonly |static |get |set |async |declare |abstract )*${name}\\s*[?(<:=]|\\b(?:class|function|interface|type|const|let) ${name}\\b`, "m");
        assert.ok(!re.test(text), `${d} declares the internal name ${name}`);
      }
      // Every module a declaration imports is in the tarball.
      for (const m of text.matchAll(/from "(\.[^"]+)"/g)) {
        const target = resolve(dirname(join(root, d)), m[1]!.replace(/\.js$/, ".d.ts"));
        assert.ok(existsSync(target), `${d} imports ${m[1]}, which the tarball lacks`);
        assert.ok(!relative(root, target).startsWith("dist/internal/"), `${d} imports an internal module`);
      }
    }
  });

  it("npm install of the tarball in a fresh ESM project imports from JavaScript, and type-checks from TypeScript", () => {
    const app = join(work, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", private: true, type: "module" }));
    // The client's dependencies are in npm's cache after its own npm ci: the registry is asked only if not.
    run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", tarball], app);
    const out = run(
      "node",
      [
        "--input-type=module",
        "-e",
        `import { Jetlock, Lease, SetLease, MemoryFence, ClientClosedError } from "@jetlock/client";
         console.log(typeof Jetlock.connect, typeof Lease, typeof SetLease, typeof MemoryFence, new ClientClosedError().code);
         try { await import("@jetlock/client/dist/internal/core.js"); console.log("internal importable"); }
         catch (err) { console.log(err.code); }`,
      ],
      app,
    );
    assert.equal(out.trim(), "function function function function closed\nERR_PACKAGE_PATH_NOT_EXPORTED");

    writeFileSync(
      join(app, "main.ts"),
      `import { Jetlock, Lease, MemoryFence, Session, type SetLease } from "@jetlock/client";

// @ts-expect-error leases come from the client, never from their constructor
export const forgedLease = () => new Lease();
// @ts-expect-error sessions too
export const forgedSession = () => new Session();

export async function work(jl: Jetlock): Promise<number> {
  const fence = new MemoryFence();
  await using lease = await jl.acquire("orders/1", { ttlMs: 10_000, signal: AbortSignal.timeout(5000) });
  await fence.guard(lease, () => "write");
  await fence.do(lease.fenceKey, lease.token);
  await using set = await jl.acquireAll(["accounts/1", "accounts/2"]);
  // @ts-expect-error a lock set has no single token
  await fence.do("accounts/1", set.token);
  // @ts-expect-error a lock set is not a fenced lease
  await fence.guard(set);
  await fence.guard(set.fenced("accounts/1")!);
  const permit = await jl.semaphore("encoders", 3).acquire();
  await fence.guard(permit);
  await using session = await jl.session({ ttlMs: 15_000 });
  const ld = await session.election("scheduler").campaign("10.0.0.7:8080");
  await fence.guard(ld);
  const held: Lease = lease;
  const whole: SetLease = set;
  return held.token + whole.tokens.size + permit.permit;
}
`,
    );
    writeFileSync(
      join(app, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          lib: ["ES2023", "ESNext.Disposable"],
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          noEmit: true,
          skipLibCheck: false,
          types: ["node"],
          typeRoots: [join(pkgDir, "node_modules", "@types")],
        },
        files: ["main.ts"],
      }),
    );
    run(process.execPath, [join(pkgDir, "node_modules", "typescript", "bin", "tsc"), "-p", app], app);
  });
});

describe("the package installed as a directory", () => {
  it("npm install of client/js (a link; its prepare script builds dist/) imports from JavaScript", () => {
    const app = join(work, "app-dir");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app-dir", version: "1.0.0", private: true, type: "module" }));
    // Without dist/ (a fresh checkout after npm ci of the client, less its build): the install must build it.
    rmSync(join(pkgDir, "dist"), { recursive: true, force: true });
    run("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", pkgDir], app);
    assert.ok(existsSync(join(pkgDir, "dist", "index.js")), "the install ran the prepare script");
    const out = run("node", ["--input-type=module", "-e", `import { Jetlock } from "@jetlock/client"; console.log(typeof Jetlock.connect);`], app);
    assert.equal(out.trim(), "function");
  });
});

describe("the source", () => {
  it("has no import circle among the modules of src (type imports included)", () => {
    const src = join(pkgDir, "src");
    const mods = files(src).filter((f) => f.endsWith(".ts"));
    const edges = new Map<string, string[]>();
    for (const m of mods) {
      const text = readFileSync(m, "utf8");
      const to: string[] = [];
      for (const i of text.matchAll(/^(?:import|export)\b[^;]*?from\s+"(\.[^"]+)"/gms)) {
        to.push(resolve(dirname(m), i[1]!.replace(/\.js$/, ".ts")));
      }
      edges.set(m, to);
    }
    assert.ok(edges.size >= 10, "found the modules");
    const state = new Map<string, "open" | "done">();
    const path: string[] = [];
    const visit = (m: string) => {
      if (state.get(m) === "done") return;
      if (state.get(m) === "open") {
        const cycle = path.slice(path.indexOf(m)).concat(m).map((p) => relative(src, p));
        assert.fail(`import circle: ${cycle.join(" -> ")}`);
      }
      state.set(m, "open");
      path.push(m);
      for (const t of edges.get(m) ?? []) {
        assert.ok(edges.has(t), `${relative(src, m)} imports ${relative(src, t)}, which is not in src`);
        visit(t);
      }
      path.pop();
      state.set(m, "done");
    };
    for (const m of mods) visit(m);
  });

  it("the index exports nothing from the internal modules", () => {
    const index = readFileSync(join(pkgDir, "src", "index.ts"), "utf8");
    assert.doesNotMatch(index, /from "\.\/internal\//);
  });
});
