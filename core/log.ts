import { pino, type Logger } from 'pino';
import { traceLogFields, tracingOn } from './tracing.js';

export type { Logger };

/**
 * Structured JSON logs. Arguments, credentials and authenticated bodies are redacted by path, so a log line
 * can name an operation, tool, tenant and outcome without carrying what was sent.
 */
export function createLogger(options: {
  level: string;
  name: string;
  destination?: pino.DestinationStream;
  /** The deployment's cluster, a field on every line when named. */
  cluster?: string | null;
}): Logger {
  return pino(
    {
      name: options.name,
      level: options.level,
      base: { pid: process.pid, ...(options.cluster == null ? {} : { cluster: options.cluster }) },
      // While tracing is on, a line written in a sampled span carries its trace_id and span_id (a field the line
      // names itself wins). Off, no mixin: a line costs what it did.
      ...(tracingOn() ? { mixin: traceLogFields } : {}),
      redact: {
        paths: [
          'arguments',
          '*.arguments',
          'arguments_json',
          '*.arguments_json',
          'args',
          '*.args',
          'secret',
          '*.secret',
          'credential',
          '*.credential',
          'authorization',
          'headers.authorization',
          '*.headers.authorization',
          'body',
          '*.body',
          'password',
          '*.password',
        ],
        censor: '[redacted]',
      },
    },
    options.destination,
  );
}

/**
 * Logs a failure that repeats (a database that is down, a full disk) once per interval instead of once per
 * attempt: the first occurrence of a code is logged at once with its error; later ones within `intervalMs` are
 * only counted, and the next line after the interval says how many were suppressed. A recovery (`ok()`) after
 * failures is logged once too. Without this, a dead database wrote about 7 stack traces a second.
 *
 * The code is the error's SQLSTATE or errno (`err.code`), so a new kind of failure is never hidden behind an
 * old one.
 */
export class RepeatedFailureLog {
  readonly #log: Logger;
  readonly #msg: string;
  readonly #intervalMs: number;
  readonly #now: () => number;
  #last = new Map<string, { at: number; suppressed: number }>();
  #failing = 0;

  constructor(log: Logger, msg: string, options: { intervalMs?: number; now?: () => number } = {}) {
    this.#log = log;
    this.#msg = msg;
    this.#intervalMs = options.intervalMs ?? 30_000;
    this.#now = options.now ?? Date.now;
  }

  /** Records one failure; logs it (level `warn`) unless the same code was logged within the interval. */
  fail(err: unknown, fields: Record<string, unknown> = {}): void {
    this.#failing++;
    const rawCode = (err as { code?: unknown } | null)?.code;
    const code = typeof rawCode === 'string' ? rawCode : ((err as Error | null)?.name ?? 'error');
    const now = this.#now();
    const seen = this.#last.get(code);
    if (seen !== undefined && now - seen.at < this.#intervalMs) {
      seen.suppressed++;
      return;
    }
    this.#last.set(code, { at: now, suppressed: 0 });
    const message = (err as Error | null)?.message ?? String(err);
    // The first line of a run carries the error (and its stack); repeats carry its code, message and count.
    if (seen === undefined) this.#log.warn({ ...fields, err, code }, this.#msg);
    else
      this.#log.warn(
        { ...fields, code, error: message, repeated: seen.suppressed + 1, interval_ms: this.#intervalMs },
        this.#msg,
      );
  }

  /** Records a success: after failures, logs once that it recovered and how many failures there were. */
  ok(fields: Record<string, unknown> = {}): void {
    if (this.#failing === 0) return;
    this.#log.info({ ...fields, failures: this.#failing }, `${this.#msg}: recovered`);
    this.#failing = 0;
    this.#last = new Map();
  }
}
