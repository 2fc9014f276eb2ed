/**
 * Runs compiled test files as plain Node processes, `jobs` at a time, each with its own process group and a
 * deadline. node-tap's own runner starts every file with its process-info loader, which records each module
 * the file imports through an off-thread hook: about half a second of CPU per file, with nothing here using what
 * it records. Each file still uses node-tap (`import t from 'tap'`) and prints TAP; the whole output of a file is
 * kept under `.tap/test-results/`, and a failed file's is printed.
 *
 * Files run longest first by the durations the last run kept in `.tap/durations.json` (alphabetically on a fresh
 * clone), so the slowest file does not start last.
 */
import { spawn } from 'node:child_process';
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

function lastDurations(): Record<string, number> {
  try {
    return JSON.parse(readFileSync(DURATIONS, 'utf8')) as Record<string, number>;
  } catch {
    return {};
  }
}

/** Runs every file; prints one line per file and the failures' output; resolves to the exit code. */
export async function runFiles(o: RunOptions): Promise<number> {
  const before = lastDurations();
  const queue = [...o.files].sort((a, b) => (before[b] ?? 0) - (before[a] ?? 0) || a.localeCompare(b));
  const results: FileResult[] = [];
  const running = new Set<number>();
  const stopAll = (): void => {
    for (const pid of running) {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  };
  const onSignal = (): void => {
    stopAll();
    process.exit(130);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
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

function runOne(file: string, o: RunOptions, running: Set<number>): Promise<FileResult> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const child = spawn(process.execPath, ['--enable-source-maps', file], {
      env: { ...o.env, TAP_TIMEOUT: String(o.timeoutS) },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true, // its own process group: a deadline kills what it started too
    });
    const pid = child.pid ?? 0;
    running.add(pid);
    const chunks: Buffer[] = [];
    child.stdout.on('data', (c: Buffer) => chunks.push(c));
    child.stderr.on('data', (c: Buffer) => chunks.push(c));
    let why: string | null = null;
    const deadline = setTimeout(
      () => {
        why = `killed after ${o.timeoutS + 30} s`;
        try {
          process.kill(-pid, 'SIGKILL');
        } catch {
          // gone
        }
      },
      (o.timeoutS + 30) * 1000,
    );
    // Whatever the file left behind in its group (a fleet it did not stop) goes with it, and with it any
    // handle on the output pipes, so 'close' follows at once.
    child.on('exit', () => {
      try {
        process.kill(-pid, 'SIGKILL');
      } catch {
        // nothing left
      }
    });
    child.on('close', (code, signal) => {
      clearTimeout(deadline);
      running.delete(pid);
      const out = Buffer.concat(chunks).toString('utf8');
      const path = resultPath(file);
      mkdirSync(dirname(path), { recursive: true });
      writeFileSync(path, out);
      const asserts = (out.match(/^\s*(?:not )?ok \d+/gm) ?? []).length;
      const failed = (out.match(/^\s*not ok \d+(?!.*# (?:TODO|SKIP))/gm) ?? []).length;
      if (why === null && code !== 0) why = signal !== null ? `signal ${signal}` : `exit ${code}`;
      resolve({
        file,
        ok: code === 0 && failed === 0 && why === null,
        seconds: (Date.now() - t0) / 1000,
        asserts,
        failed,
        why,
      });
    });
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
