/**
 * The connection one worker's claims run on: a pool connection held from the first claim until the worker
 * closes, whose session pins the planner to the claim's index plan (`claimSessionSettings` in
 * dispatcher/queries.ts) and runs the claim as a named statement, planned once.
 *
 * Why a connection of its own: planning the claim cost about as much server time as running it (measured in
 * docs/architecture.md, "Where an operation's database time goes"). A named statement on a shared pool
 * connection would be planned once, but PostgreSQL's generic plan for it, built over a small or young queue,
 * deletes the outbox rows and updates the operations through hash joins over sequential scans of both tables,
 * and keeps that plan until the next ANALYZE. Here the session's planner settings rule those scans and joins
 * out whatever the statistics say, and they touch no other statement: this connection runs nothing else, and it
 * is destroyed, never given back to the pool, when the worker closes or the connection fails.
 *
 * States:
 *   closed   - no connection (before the first claim, after a failure, after `close()`)
 *   open     - a connection with the settings applied; claims run on it one at a time (the producer never
 *              sends two at once)
 * A connection that failed (an 'error' event while idle, a connection error, or a named statement the server
 * no longer has) is destroyed; the next claim opens a new one. A named statement the server no longer has
 * (SQLSTATE 26000, a pooler that moved the session) or can no longer run (0A000, a migration changed the type
 * of a column it returns) ran nothing: the claim is sent once more, on a new connection.
 */
import { isConnectionError, SQLSTATE, sqlState, type Pool, type PoolClient } from '../core/db.js';

export class ClaimSession<Row> {
  readonly #pool: Pool;
  readonly #settings: string;
  readonly #statement: { name: string; text: string };
  #client: PoolClient | undefined;
  /** The error the open connection reported while idle, if any: it is destroyed before the next claim. */
  #lost: Error | undefined;
  /** The claim in flight: `close()` destroys the connection only after it has settled. */
  #busy: Promise<unknown> | undefined;
  readonly #onError = (err: Error): void => {
    this.#lost ??= err;
  };

  constructor(pool: Pool, settings: string, statement: { name: string; text: string }) {
    this.#pool = pool;
    this.#settings = settings;
    this.#statement = statement;
  }

  /** Runs the claim with `values`; throws what the database threw (a connection failure, a timeout, ...). */
  async claim(values: unknown[]): Promise<Row[]> {
    const run = this.#claim(values);
    this.#busy = run.catch(() => undefined);
    try {
      return await run;
    } finally {
      this.#busy = undefined;
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
        if (stale || isConnectionError(err) || this.#lost !== undefined) this.#destroy();
        if (stale && attempt === 1) continue;
        throw err;
      }
    }
  }

  /**
   * Destroys the connection, after the claim in flight (if any) has settled. Safe to repeat. A later claim
   * opens a new connection.
   */
  async close(): Promise<void> {
    await this.#busy;
    this.#destroy();
  }

  async #open(): Promise<PoolClient> {
    if (this.#client !== undefined && this.#lost !== undefined) this.#destroy();
    if (this.#client !== undefined) return this.#client;
    const client = await this.#pool.connect();
    client.on('error', this.#onError);
    try {
      await client.query(this.#settings);
    } catch (err) {
      client.off('error', this.#onError);
      client.release(true);
      this.#lost = undefined;
      throw err;
    }
    this.#client = client;
    return client;
  }

  /** Gives the connection back to the pool to be closed: its session's settings must not reach other statements. */
  #destroy(): void {
    const client = this.#client;
    this.#client = undefined;
    this.#lost = undefined;
    if (client === undefined) return;
    client.off('error', this.#onError);
    client.release(true);
  }
}
