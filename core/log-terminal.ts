/**
 * Logs for a person at a terminal. pino writes each line as JSON (its redaction already applied); at a terminal
 * {@link prettyDestination} turns every line into one a person reads (`12:00:01.234 INFO  service: actionledger
 * listening host=127.0.0.1 port=7420`, an error's stack indented below it) before it is written. Anywhere else
 * (a pipe, a file, a log collector) the lines stay JSON, exactly as pino wrote them.
 */
import { isatty } from 'node:tty';
import { pino } from 'pino';

/**
 * Whether a person is reading `fd`: `ACTIONLEDGER_TERMINAL=1` says yes and `=0` says no whatever `fd` is (tests,
 * a supervisor that gives a pseudo-terminal, a fleet worker told its parent's answer); otherwise, whether `fd`
 * is a terminal.
 */
export function atTerminal(env: NodeJS.ProcessEnv, fd: number): boolean {
  const forced = env.ACTIONLEDGER_TERMINAL;
  if (forced === '1') return true;
  if (forced === '0') return false;
  return isatty(fd);
}

const LEVELS: Readonly<Record<number, string>> = {
  10: 'TRACE',
  20: 'DEBUG',
  30: 'INFO',
  40: 'WARN',
  50: 'ERROR',
  60: 'FATAL',
};

/** Fields every line carries or shows in its own place, left out of the `key=value` list. */
const OWN_PLACE = new Set(['level', 'time', 'pid', 'hostname', 'name', 'msg', 'err', 'v']);

function value(v: unknown): string {
  if (typeof v === 'string') return /^[^\s"=]+$/u.test(v) ? v : JSON.stringify(v);
  return JSON.stringify(v) ?? String(v);
}

function clock(time: unknown): string {
  const d = typeof time === 'number' ? new Date(time) : new Date();
  return d.toISOString().slice(11, 23);
}

/** One JSON log line as a person reads it; a line that is not a JSON object is returned as it came. */
export function prettyLine(json: string): string {
  let o: Record<string, unknown>;
  try {
    const parsed: unknown = JSON.parse(json);
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return json.trimEnd();
    o = parsed as Record<string, unknown>;
  } catch {
    return json.trimEnd();
  }
  const level = LEVELS[o.level as number] ?? value(o.level ?? '');
  const name = typeof o.name === 'string' ? `${o.name}: ` : '';
  const fields = Object.entries(o)
    .filter(([k]) => !OWN_PLACE.has(k))
    .map(([k, v]) => `${k}=${value(v)}`);
  const err = o.err as { stack?: unknown; message?: unknown; code?: unknown } | undefined;
  const errBody =
    typeof err?.stack === 'string' ? err.stack : typeof err?.message === 'string' ? err.message : value(err);
  const errText =
    err === undefined
      ? ''
      : `\n    ${errBody.replaceAll('\n', '\n    ')}` + (err.code === undefined ? '' : `\n    code=${value(err.code)}`);
  const msg = typeof o.msg === 'string' ? o.msg : '';
  return `${clock(o.time)} ${level.padEnd(5)} ${name}${msg}${fields.length === 0 ? '' : `  ${fields.join(' ')}`}${errText}`;
}

/**
 * A pino destination that writes each line as {@link prettyLine} says, synchronously, to `fd` (or to `write`,
 * for tests): a line is on the terminal before the next statement runs, as with the JSON destination it replaces.
 */
export function prettyDestination(target: number | ((text: string) => void)): { write(line: string): void } {
  // pino's own synchronous destination (sonic-boom) writes to the fd: it retries a write the fd cannot take yet.
  const fd = typeof target === 'number' ? pino.destination({ fd: target, sync: true }) : null;
  const out = fd === null ? (target as (text: string) => void) : (text: string) => void fd.write(text);
  return {
    write(chunk: string) {
      for (const line of chunk.split('\n')) if (line !== '') out(`${prettyLine(line)}\n`);
    },
  };
}
