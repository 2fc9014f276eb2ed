/**
 * The connection one worker's claims run on: a connection of its own, outside the pool, opened by the first
 * claim and closed when the worker closes. Its planner settings are startup parameters
 * ({@link CLAIM_SESSION_OPTIONS}), and the claim is a named statement on it, planned once.
 *
 * Why a connection of its own: planning the claim cost about as much server time as running it (measured in
 * docs/architecture.md, "Where an operation's database time goes"). A named statement on a shared pool
 * connection would be planned once, but PostgreSQL's generic plan for it, built over a small or young queue,
 * deletes the outbox rows and updates the operations through hash joins over sequential scans of both tables,
 * and keeps that plan until the next ANALYZE. On this connection the planner settings rule those scans and joins
 * out whatever the statistics say. They are given when the connection opens, never with SET, so they stay with
 * this connection: no pool ever lends it to another statement, and a pooler in front of PostgreSQL cannot pass
 * them on to another client's server connection (a pooler that does not forward startup parameters refuses or
 * drops them; then the claim runs with the server's settings). Only the claim runs on it (with what it fires:
 * the transition trigger's lookup and the history row's foreign-key check, key lookups both).
 *
 * States:
 *   closed   - no connection (before the first claim, after a failure, after `close()`)
 *   open     - a connection with the settings; claims run on it one at a time (the producer never sends two at
 *              once)
 *   closing  - `close()` was called with a claim in flight: the connection ends when that claim settles, and no
 *              claim starts
 * A connection that failed (an 'error' event while idle, a connection error, a client-side timeout, or a named
 * statement the server no longer has) is closed; the next claim opens a new one. A named statement the server
 * no longer has (SQLSTATE 26000) or can no longer run (0A000, a migration changed the type of a column it
 * returns) ran nothing: the claim is sent once more, on a new connection.
 */
import pg from 'pg';
import { isConnectionError, SQLSTATE, sqlState, type Pool } from '../core/db.js';

/**
 * The claim connection's planner settings, as startup parameters: the generic plan forced (planned once), and
 * sequential and bitmap scans, hash and merge joins and sorts ruled out, which leaves the claim's index plan
 * (walk outbox_available_idx in order, then find each operation, outbox row and history row by key). Over a
 * queue of 20 analyzed rows the planner otherwise chose hash joins over sequential scans of outbox and
 * operations for the generic plan.
 */
export const CLAIM_SESSION_OPTIONS = [
  'plan_cache_mode=force_generic_plan',
  'enable_seqscan=off',
  'enable_bitmapscan=off',
  'enable_hashjoin=off',
  'enable_mergejoin=off',
  'enable_sort=off',
]
  .map((setting) => `-c ${setting}`)
  .join(' ');

/** The client-side bound on one claim, beyond the server's statement timeout: a connection gone silent. */
const CLAIM_TIMEOUT_MARGIN_MS = 5_000;

/**
 * Opens a connection like `pool`'s (same server, credentials, TLS, statement timeout), outside it, with the claim
 * settings added to its startup options and `:claims` to its application name. The pool's `Client` class makes
 * it, so whatever the pool's clients are, this one is too.
 */
export async function openClaimConnection(pool: Pool): Promise<pg.Client> {
  const options = pool.options as pg.PoolConfig & { Client?: typeof pg.Client };
  const Client = options.Client ?? pg.Client;
  const statementTimeout = typeof options.statement_timeout === 'number' ? options.statement_timeout : 0;
  const client = new Client({
    ...options,
    // pg-pool keeps the password off the enumerable options.
    password: options.password,
    application_name: `${options.application_name ?? 'actionledger'}:claims`,
    options: [options.options, CLAIM_SESSION_OPTIONS].filter((o) => o !== undefined && o !== '').join(' '),
    ...(statementTimeout > 0 ? { query_timeout: statementTimeout + CLAIM_TIMEOUT_MARGIN_MS } : {}),
  });
  // Until the session takes it over: a failure while connecting rejects `connect()`, it must not crash the process.
  const early = (): void => undefined;
  client.on('error', early);
  try {
    await client.connect();
  } catch (err) {
    await client.end().catch(() => undefined);
    throw err;
  } finally {
    client.off('error', early);
  }
  return client;
}

export class ClaimSession<Row> {
  readonly #connect: () => Promise<pg.Client>;
  readonly #statement: { name: string; text: string };
  #client: pg.Client | undefined;
  /** The error the open connection reported while idle, if any: it is closed before the next claim. */
  #lost: Error | undefined;
  /** The claim in flight, if any. */
  #busy: Promise<unknown> | undefined;
  #closing = false;
  readonly #onError = (err: Error): void => {
    this.#lost ??= err;
  };

  /** `connect` opens a connection with the claim settings (`openClaimConnection`). */
  constructor(connect: () => Promise<pg.Client>, statement: { name: string; text: string }) {
    this.#connect = connect;
    this.#statement = statement;
  }

  /**
   * Runs the claim with `values`; throws what the database threw (a connection failure, a timeout, ...). The
   * producer sends one claim at a time; a claim after `close()` opens a new connection.
   */
  async claim(values: unknown[]): Promise<Row[]> {
    this.#closing = false;
    const run = this.#claim(values);
    const busy = run.catch(() => undefined);
    this.#busy = busy;
    try {
      return await run;
    } finally {
      if (this.#busy === busy) this.#busy = undefined;
      if (this.#closing) this.#end();
    }
  }

  async #claim(values: unknown[]): Promise<Row[]> {
    for (let attempt = 1; ; attempt++) {
      const client = await this.#open();
      try {
        const { rows } = await client.query<Row & object>({ ...this.#statement, values });
        return rows;
      } catch (err) {
        const state = sqlState(err);
        const stale = state === SQLSTATE.invalidStatementName || state === SQLSTATE.featureNotSupported;
        // Anything but an SQL error (a timeout of the client's own, a broken socket) leaves the session in doubt.
        if (stale || state === undefined || isConnectionError(err) || this.#lost !== undefined) this.#end();
        if (stale && attempt === 1) continue;
        throw err;
      }
    }
  }

  /**
   * Closes the connection: now when no claim is in flight, else as soon as that claim settles (never waiting
   * for it). Safe to repeat.
   */
  close(): void {
    if (this.#busy === undefined) this.#end();
    else this.#closing = true;
  }

  async #open(): Promise<pg.Client> {
    if (this.#client !== undefined && this.#lost !== undefined) this.#end();
    if (this.#client !== undefined) return this.#client;
    const client = await this.#connect();
    client.on('error', this.#onError);
    this.#client = client;
    this.#lost = undefined;
    return client;
  }

  #end(): void {
    const client = this.#client;
    this.#client = undefined;
    this.#lost = undefined;
    if (client === undefined) return;
    // Errors of a connection being closed are of no interest; the listener stays so none goes unhandled.
    client.end().catch(() => undefined);
  }
}
