/**
 * Whether the database takes writes, as the serving process last saw it: `/readyz` answers from it, the API's
 * 503s carry its Retry-After, and `actionledger_database_writable` exposes it.
 *
 * A database can answer reads and still refuse every write: out of disk (SQLSTATE 53100), read-only (25006: a
 * standby, `default_transaction_read_only`), or gone. A read-only readiness check would call such a service
 * ready, and with no traffic nothing else would notice. So a probe writes: every `http.write_probe_interval_ms`
 * it inserts one row into `write_probe` (sql/0016) and rolls it back. The row is wider than half a heap page and
 * the aborted rows before it still hold their pages, so the insert extends the table by a page: on a full disk
 * that write fails like any other, and nothing is ever committed.
 *
 * States:
 *
 *   unknown ──probe ok──▶ writable ──probe failed, or a real write refused (storage_full,
 *                                     database_read_only, database_unavailable)──▶ refused(reason)
 *   refused ──probe ok──▶ writable                      (only a probe's success recovers: one write that
 *                                                        happened to fit in a free page proves nothing)
 *
 * A real write refused flips the state at once, without waiting for the next probe; any other failure of a
 * real write (a conflict, a statement timeout) is no verdict on the database and changes nothing.
 */
import { Gauge, type Registry } from 'prom-client';
import type { Pool, PoolClient } from '../db/index.js';
import { asActionLedgerError, type ErrorCode } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import { Service } from '../core/service.js';

/** The codes of a real write that say the database refuses writes (docs/errors.md). */
export const WRITE_REFUSALS: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'storage_full',
  'database_read_only',
  'database_unavailable',
]);

/** Wider than half of an 8 KB heap page, so one row fills a page (see sql/0016_write_probe.sql). */
const PADDING_BYTES = 5000;

export interface WriteState {
  /** null until the first probe has answered. */
  readonly writable: boolean | null;
  /** Why writes are refused (an error code); null while writable or unknown. */
  readonly reason: ErrorCode | null;
  /** The SQLSTATE of the failure, when the database gave one. */
  readonly sqlstate: string | null;
  /** When the state last changed. */
  readonly since: Date;
}

/** What the API reads: the state, the Retry-After a refused write answers with, and where real failures go. */
export interface WriteHealth {
  state(): WriteState;
  /** Seconds a caller should wait before retrying a write the database refused: about one probe interval. */
  readonly retryAfterS: number;
  /** A real write failed: a write refusal flips the state at once; anything else is ignored. */
  report(err: unknown): void;
}

export interface WriteProbeOptions {
  pool: Pool;
  schemaQuoted: string;
  intervalMs: number;
  log: Logger;
  /** Where `actionledger_database_writable` is registered (the process's registry). */
  registry: Registry;
}

const GAUGE = 'actionledger_database_writable';

export class WriteProbe extends Service implements WriteHealth {
  readonly #options: WriteProbeOptions;
  readonly #gauge: Gauge<'reason'>;
  readonly #sql: string;
  #state: WriteState = { writable: null, reason: null, sqlstate: null, since: new Date() };
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | null = null;

  constructor(options: WriteProbeOptions) {
    super();
    this.#options = options;
    // One gauge per registry: an embedder may build more than one server over one runtime.
    const existing = options.registry.getSingleMetric(GAUGE);
    this.#gauge =
      (existing as Gauge<'reason'> | undefined) ??
      new Gauge({
        name: GAUGE,
        help: 'Whether the database took the last write probe (1) or refuses writes (0, with the reason: storage_full, database_read_only, database_unavailable, ...); absent until the first probe.',
        labelNames: ['reason'],
        registers: [options.registry],
      });
    // One round trip; the ROLLBACK is skipped when the INSERT fails, and #probe sends it then.
    this.#sql = `BEGIN; INSERT INTO ${options.schemaQuoted}.write_probe (padding) VALUES (repeat('x', ${PADDING_BYTES})); ROLLBACK`;
  }

  get retryAfterS(): number {
    return Math.max(1, Math.ceil(this.#options.intervalMs / 1000));
  }

  state(): WriteState {
    return this.#state;
  }

  /** Probes once now (awaited, so a service is not called ready before it has written), then every interval. */
  protected async onStart(): Promise<void> {
    await this.probe();
    this.#timer = setInterval(() => void this.probe(), this.#options.intervalMs);
    this.#timer.unref();
  }

  /** Stops the timer; a probe in flight finishes. */
  protected async onStop(): Promise<void> {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    await this.#running;
  }

  report(err: unknown): void {
    const coded = asActionLedgerError(err);
    if (!WRITE_REFUSALS.has(coded.code)) return;
    this.#set(false, coded.code, sqlstateOf(coded.details));
  }

  /** One probe; never rejects. A probe already in flight is joined, not doubled. */
  probe(): Promise<void> {
    this.#running ??= this.#probe().finally(() => (this.#running = null));
    return this.#running;
  }

  async #probe(): Promise<void> {
    let client: PoolClient | undefined;
    try {
      client = await this.#options.pool.connect();
      await client.query(this.#sql);
      client.release();
      client = undefined;
      this.#set(true, null, null);
    } catch (err) {
      // The failed INSERT left its transaction open: roll it back, or drop the connection if that fails too.
      let broken: Error | undefined;
      if (client !== undefined)
        await client.query('ROLLBACK').catch((e: unknown) => (broken = e instanceof Error ? e : new Error(String(e))));
      client?.release(broken);
      const coded = asActionLedgerError(err);
      this.#set(false, coded.code, sqlstateOf(coded.details));
    }
  }

  #set(writable: boolean, reason: ErrorCode | null, sqlstate: string | null): void {
    const before = this.#state;
    if (before.writable === writable && before.reason === reason) return;
    this.#state = { writable, reason, sqlstate, since: new Date() };
    this.#gauge.reset();
    this.#gauge.set({ reason: reason ?? '' }, writable ? 1 : 0);
    const { log } = this.#options;
    if (!writable)
      log.warn({ code: reason, sqlstate }, 'the database refuses writes: not ready until a write succeeds');
    else if (before.writable === false) log.info({ was: before.reason }, 'the database takes writes again: ready');
  }
}

function sqlstateOf(details: Record<string, unknown> | undefined): string | null {
  const s = details?.sqlstate;
  return typeof s === 'string' ? s : null;
}
