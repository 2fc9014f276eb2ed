/**
 * Runs compiled test files as plain Node processes, `jobs` at a time, each with its own process group, a mark in
 * its environment (what it leaves running is killed when it exits) and a deadline. node-tap's own runner starts every file with its process-info loader, which records each module
 * the file imports through an off-thread hook: about half a second of CPU per file, with nothing here using what
 * it records. Each file still uses node-tap (`import t from 'tap'`) and prints TAP; the whole output of a file is
 * kept under `.tap/test-results/`, and a failed file's is printed.
 *
 * Files run longest first by the durations the last run kept in `.tap/durations.json` (on a fresh clone, by the
 * ones committed in `test/durations.json`), so the slowest file does not start last.
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

export interface RunOptions {
  files: string[];
  jobs: number;
  timeoutS: number;
  env: NodeJS.ProcessEnv;
}

interface FileResult {
  file: string;
  ok: boolean;
  seconds: number;
  asserts: number;
  failed: number;
  why: string | null;
}

const RESULTS = '.tap/test-results';
const DURATIONS = '.tap/durations.json';
const COMMITTED_DURATIONS = 'test/durations.json';

/** `dist/test/**\/*.test.js` under `root`, sorted. */
export function testFiles(root: string): string[] {
  const out: string[] = [];
  const walk = (dir: string): void => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else if (name.endsWith('.test.js')) out.push(path);
    }
  };
  walk(root);
  return out.sort();
}

/** This checkout's last run's durations, else the ones committed with the tests (a fresh clone has no run). */
function lastDurations(): Record<string, number> {
  for (const path of [DURATIONS, COMMITTED_DURATIONS]) {
    try {
      return JSON.parse(readFileSync(path, 'utf8')) as Record<string, number>;
    } catch {
      // next
    }
  }
  return {};
}

/** Runs every file; prints one line per file and the failures' output; resolves to the exit code. */
export async function runFiles(o: RunOptions): Promise<number> {
  if (o.files.length === 0) {
    process.stdout.write('# no test files found (is dist/test built?)\n');
    return 1;
  }
  const before = lastDurations();
  const queue = [...o.files].sort((a, b) => (before[b] ?? 0) - (before[a] ?? 0) || a.localeCompare(b));
  const results: FileResult[] = [];
  const running = new Map<number, string>(); // pid -> the file's mark
  let interrupted = false;
  // Ctrl-C or SIGTERM: no new file starts, the running ones and whatever they started are killed, and the caller
  // still drops its databases and stops its PostgreSQL.
  const onSignal = (): void => {
    interrupted = true;
    queue.length = 0;
    for (const [pid, mark] of running) killLeftovers(pid, mark);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const started = Date.now();
  const worker = async (): Promise<void> => {
    for (let file = queue.shift(); file !== undefined; file = queue.shift()) {
      const r = await runOne(file, o, running);
      results.push(r);
      const counts = `${r.asserts - r.failed}/${r.asserts} ok`;
      process.stdout.write(
        `${r.ok ? 'ok' : 'not ok'} ${results.length} - ${file} # ${counts}, ${r.seconds.toFixed(1)} s${r.why === null ? '' : ` (${r.why})`}\n`,
      );
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, o.jobs) }, worker));
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  if (interrupted) {
    process.stdout.write('\n# interrupted: the files still running were killed\n');
    return 130;
  }

  const durations = { ...before };
  for (const r of results) durations[r.file] = r.seconds;
  mkdirSync(dirname(DURATIONS), { recursive: true });
  writeFileSync(DURATIONS, JSON.stringify(durations, null, 2) + '\n');

  const failed = results.filter((r) => !r.ok);
  for (const r of failed) {
    process.stdout.write(`\n# ---- ${r.file} (${r.why ?? 'failed'}) ----\n`);
    process.stdout.write(failureExcerpt(readFileSync(resultPath(r.file), 'utf8')));
  }
  const asserts = results.reduce((s, r) => s + r.asserts, 0);
  const failedAsserts = results.reduce((s, r) => s + r.failed, 0);
  process.stdout.write(
    `\n# files: ${results.length - failed.length} of ${results.length} passed; assertions and subtests: ${asserts - failedAsserts} of ${asserts} ok; ${((Date.now() - started) / 1000).toFixed(0)} s\n`,
  );
  return failed.length === 0 ? 0 : 1;
}

function resultPath(file: string): string {
  return join(RESULTS, `${relative('.', file)}.tap`);
}

/**
 * Kills what a test file left behind: its process group, and every process carrying its mark in the environment
 * (a service or PostgreSQL cluster it started in a session of its own).
 */
function killLeftovers(pid: number, mark: string): void {
  if (pid > 0) {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // the group is gone
    }
  }
  const needle = `AL_TEST_RUN_MARK=${mark}\0`;
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/environ`, 'latin1').includes(needle)) process.kill(Number(entry), 'SIGKILL');
    } catch {
      // exited meanwhile, or not ours to read
    }
  }
}

function runOne(file: string, o: RunOptions, running: Map<number, string>): Promise<FileResult> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const mark = randomUUID();
    const chunks: Buffer[] = [];
    let why: string | null = null;
    let settled = false;
    let pid = 0;
    const finish = (code: number | null, signal: NodeJS.Signals | null): void => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      clearTimeout(drain);
      running.delete(pid);
      const out = Buffer.concat(chunks).toString('utf8');
      const path = resultPath(file);
      mkdirSync(dirname(path), { recursive: true });
      writeFileSync(path, out);
      const asserts = (out.match(/^\s*(?:not )?ok \d+/gm) ?? []).length;
      const failed = (out.match(/^\s*not ok \d+(?!.*# (?:TODO|SKIP))/gm) ?? []).length;
      if (why === null && code !== 0) why = signal !== null ? `signal ${signal}` : `exit ${String(code)}`;
      // node-tap ends a file's output with its top-level plan; without one the file never ran its tests.
      if (why === null && !/^1\.\.\d+/m.test(out)) why = 'no TAP plan in its output';
      resolve({
        file,
        ok: code === 0 && failed === 0 && why === null,
        seconds: (Date.now() - t0) / 1000,
        asserts,
        failed,
        why,
      });
    };
    let drain: NodeJS.Timeout | undefined;
    const deadline = setTimeout(
      () => {
        why = `killed after ${o.timeoutS + 30} s`;
        killLeftovers(pid, mark);
      },
      (o.timeoutS + 30) * 1000,
    );
    const child = spawn(process.execPath, ['--enable-source-maps', file], {
      env: { ...o.env, TAP_TIMEOUT: String(o.timeoutS), AL_TEST_RUN_MARK: mark },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true, // its own process group
    });
    pid = child.pid ?? 0;
    if (pid > 0) running.set(pid, mark);
    child.stdout.on('data', (c: Buffer) => chunks.push(c));
    child.stderr.on('data', (c: Buffer) => chunks.push(c));
    child.on('error', (err) => {
      why = `could not start: ${err.message}`;
      finish(null, null);
    });
    child.on('exit', (code, signal) => {
      // What it left behind goes, and with it any copy of the output pipes, so 'close' follows at once; if a
      // pipe is still held after 5 s, the result is taken from what was read.
      killLeftovers(pid, mark);
      drain = setTimeout(() => {
        child.stdout.destroy();
        child.stderr.destroy();
        finish(code, signal);
      }, 5000);
    });
    child.on('close', (code, signal) => finish(code, signal));
  });
}

/** The failed tests of a file's TAP, with their diagnostics; the tail of the output when none is marked. */
function failureExcerpt(out: string): string {
  const lines = out.split('\n');
  const keep: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^\s*not ok \d+/.test(lines[i] ?? '')) continue;
    keep.push(...lines.slice(i, i + 40));
    i += 39;
  }
  return (keep.length > 0 ? keep : lines.slice(-60)).join('\n') + '\n';
}
