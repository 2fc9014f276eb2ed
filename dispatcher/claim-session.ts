/**
 * The connection one worker's claims run on: a connection of its own, outside the pool, opened by the first
 * claim and closed when the worker closes. Its planner settings are startup parameters
 * ({@link CLAIM_SESSION_OPTIONS}), and the claim is a named statement on it, planned once.
 *
 * Why a connection of its own: planning the claim cost about as much server time as running it (measured in
 * docs/performance.md, "Where an operation's database time goes"). A named statement on a shared pool
 * connection would be planned once, but PostgreSQL's generic plan for it, built over a small or young queue,
 * deletes the outbox rows and updates the operations through hash joins over sequential scans of both tables,
 * and keeps that plan until the next ANALYZE. On this connection the planner settings rule those scans and joins
 * out whatever the statistics say. They are given when the connection opens, never with SET: no pool ever lends
 * this connection to another statement, and no SET can reach another client's server connection through a
 * pooler. The session is read back after connecting; where the settings did not take (a pooler dropped them, or
 * refused them and the connection was opened without), the claim runs there as unnamed text, planned at every
 * call. Only the claim runs on it (with what it fires: the transition
 * trigger's lookup and its insert into the claim listing, operation_claims, and the history row's foreign-key
 * check, key lookups and a keyed insert all).
 *
 * States:
 *   closed   - no connection (before the first claim, after a failure, after `close()`)
 *   open     - a connection; claims run on it one at a time (the producer never sends two at once)
 *   closing  - `close()` was called with a claim in flight: the connection ends when that claim settles
 * A connection that failed (an 'error' event while idle, a connection error, or a named statement the server no
 * longer has) is closed; the next claim opens a new one. A named statement the server no longer has (SQLSTATE
 * 26000) or can no longer run (0A000, a migration changed the type of a column it returns) ran nothing: the
 * claim is sent once more, on a new connection. A claim has no timer of its own on the client (nor had the pool's):
 * one the client gives up could still commit on the server (a commit waiting for a synchronous standby is past
 * the statement timeout). A server gone silent is found by TCP keepalive (about 20 s after the wire went quiet),
 * which then ends a claim in flight as a lost connection: a claim that may have committed unseen, like any reply
 * lost with its connection. Its operations wait, never sent, until the reconciler takes the claims this worker
 * never listed in its heartbeat (`orphan_after_ms`).
 */
import pg from 'pg';
import { isConnectionError, parseConnectionString, SQLSTATE, sqlState, type Pool } from '../db/index.js';

/**
 * The claim connection's planner settings, as startup parameters: the generic plan forced (planned once), and
 * sequential and bitmap scans, hash and merge joins, sorts and materialized inner scans ruled out, which leaves
 * the claim's index plan (walk outbox_available_idx in order, then find each operation, outbox row and history
 * row by key). Over a queue of 20 analyzed rows the planner otherwise chose hash joins over sequential scans of
 * outbox and operations for the generic plan.
 */
const CLAIM_SETTINGS: readonly (readonly [string, string])[] = [
  ['plan_cache_mode', 'force_generic_plan'],
  ['enable_seqscan', 'off'],
  ['enable_bitmapscan', 'off'],
  ['enable_hashjoin', 'off'],
  ['enable_mergejoin', 'off'],
  ['enable_sort', 'off'],
  ['enable_material', 'off'],
];

/** {@link CLAIM_SETTINGS} as a startup `options` value. */
export const CLAIM_SESSION_OPTIONS = CLAIM_SETTINGS.map(([name, value]) => `-c ${name}=${value}`).join(' ');

/** True when the session has every claim setting (a server without one of them answers false, not an error). */
const READ_BACK = `SELECT ${CLAIM_SETTINGS.map(([name, value]) => `coalesce(current_setting('${name}', true) = '${value}', false)`).join(' AND ')} AS pinned`;

/**
 * A claim connection whose server went away without a word (a failover, a dropped network path) is found by TCP
 * keepalive probes starting after this long idle on the wire (Node then probes every second, ten times), not after
 * the system's default of two hours.
 */
const KEEPALIVE_DELAY_MS = 10_000;

/** A connection for claims, and whether its session has the claim settings (else the claim runs unnamed). */
export interface ClaimConnection {
  client: pg.Client;
  pinned: boolean;
}

/**
 * Opens a connection like `pool`'s (same server, credentials, TLS, statement timeout), outside it, with the claim
 * settings added to its startup options and `:claims` to its application name, made by the pool's `Client` class.
 * The options and application name the pool's connections get are kept, the claim settings after them: the
 * connection string is read as node-postgres reads it (its parameters over the pool's config, then `PGOPTIONS`
 * and `PGAPPNAME`), and passed on already read. `pinned` says whether the session has every setting, read back
 * from it: a pooler in front of PostgreSQL may drop them, and a server or pooler that refuses them at connect (its
 * message names them: "unsupported startup parameter", "unrecognized configuration parameter", "command-line
 * options") gets a connection without them; the next connection, after this one fails or closes, offers them
 * again. The client keeps a listener for 'error' events, so a failure while nobody uses it cannot end the process.
 */
export async function openClaimConnection(pool: Pool): Promise<ClaimConnection> {
  const poolConfig = pool.options as pg.PoolConfig;
  // As node-postgres builds a client's parameters: the connection string's over the config's (the config's
  // enumerable fields: pg-pool keeps a password given beside a connection string off them, and node-postgres then
  // takes the string's); without a connection string, the config, password included.
  const merged: Record<string, unknown> = poolConfig.connectionString
    ? { ...poolConfig, ...(parseConnectionString(poolConfig.connectionString) as Record<string, unknown>) }
    : { ...poolConfig, password: poolConfig.password };
  delete merged.connectionString;
  // Empty counts as unset, as node-postgres reads them.
  const baseOptions = (merged.options as string | undefined) || process.env.PGOPTIONS || undefined;
  const name = (merged.application_name as string | undefined) || process.env.PGAPPNAME || 'actionledger';
  const Client = (pool as Pool & { Client?: typeof pg.Client }).Client ?? pg.Client;
  const open = async (withSettings: boolean): Promise<pg.Client> => {
    const client = new Client({
      ...(merged as pg.ClientConfig),
      application_name: `${name}:claims`,
      options: [baseOptions, withSettings ? CLAIM_SESSION_OPTIONS : undefined]
        .filter((o) => o !== undefined && o !== '')
        .join(' '),
      keepAlive: true,
      keepAliveInitialDelayMillis: KEEPALIVE_DELAY_MS,
    });
    client.on('error', () => undefined);
    try {
      await client.connect();
    } catch (err) {
      await client.end().catch(() => undefined);
      throw err;
    }
    return client;
  };
  let client: pg.Client;
  try {
    client = await open(true);
  } catch (err) {
    if (!refusedSettings(err)) throw err;
    client = await open(false);
  }
  try {
    const { rows } = await client.query<{ pinned: boolean }>(READ_BACK);
    return { client, pinned: rows[0]?.pinned === true };
  } catch (err) {
    await client.end().catch(() => undefined);
    throw err;
  }
}

/**
 * A server (or a pooler in front of it) that turned down the startup options rather than the connection. Told by
 * the message, not the SQLSTATE alone: a pooler sends 08P01 for its own troubles too (no free client slot), and
 * such a connection must not lose its settings for good.
 */
function refusedSettings(err: unknown): boolean {
  return /unsupported startup parameter|unrecognized configuration parameter|command-line options/i.test(
    (err as Error | null)?.message ?? '',
  );
}

export class ClaimSession<Row> {
  readonly #connect: () => Promise<ClaimConnection>;
  readonly #statement: { name: string; text: string };
  readonly #onUnpinned: () => void;
  #open: ClaimConnection | undefined;
  /** The error the open connection reported while idle, if any: it is closed before the next claim. */
  #lost: Error | undefined;
  /** The claim in flight, if any. */
  #busy: Promise<unknown> | undefined;
  #closing = false;

  /**
   * `connect` opens a connection for claims (`openClaimConnection`); `onUnpinned` is called for each one opened
   * without the claim settings, on which the claim runs unnamed, planned at every call.
   */
  constructor(
    connect: () => Promise<ClaimConnection>,
    statement: { name: string; text: string },
    onUnpinned: () => void = () => undefined,
  ) {
    this.#connect = connect;
    this.#statement = statement;
    this.#onUnpinned = onUnpinned;
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
      const { client, pinned } = await this.#connection();
      try {
        const { rows } = await client.query<Row & object>(
          pinned ? { ...this.#statement, values } : { text: this.#statement.text, values },
        );
        return rows;
      } catch (err) {
        const state = sqlState(err);
        const stale = state === SQLSTATE.invalidStatementName || state === SQLSTATE.featureNotSupported;
        if (stale || isConnectionError(err) || this.#lost !== undefined) this.#end();
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

  async #connection(): Promise<ClaimConnection> {
    if (this.#open !== undefined && this.#lost !== undefined) this.#end();
    if (this.#open !== undefined) return this.#open;
    const opened = await this.#connect();
    const { client } = opened;
    // Only the open connection's errors count: a late one from a connection already closed changes nothing.
    client.on('error', (err: Error) => {
      if (this.#open?.client === client) this.#lost ??= err;
    });
    this.#open = opened;
    this.#lost = undefined;
    if (!opened.pinned) this.#onUnpinned();
    return opened;
  }

  #end(): void {
    const client = this.#open?.client;
    this.#open = undefined;
    this.#lost = undefined;
    // Errors of a connection being closed are of no interest (its listeners stay, so none goes unhandled).
    client?.end().catch(() => undefined);
  }
}
