/**
 * The development sandbox that `npm start` runs when `sandbox.enabled` is set (the shipped example config):
 * a generated dev CA with server and client certificates, a profile-signing key and a signed dispatch
 * profile, the gate's built-in authorization service (deciding from the database, as in production) and the
 * sandbox provider, all on loopback. The fault-injecting SandboxAuthorizer stays for the dispatcher's tests. Generated once into
 * `<data dir>/sandbox` and reused. A production configuration leaves the sandbox off and never runs this.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from '../config/index.js';
import type { Logger } from '../core/log.js';
import { generateProfileKeyPair, signProfile } from '../protocol/index.js';
import { createPool } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { AuthorizationService } from '../gate/index.js';
import { loadOrCreateDevPki } from './pki.js';
import { SandboxProvider } from './provider.js';

export interface DevSandbox {
  /** Environment for the workers: provider credentials the sandbox generated for tools that had none set. */
  env: Record<string, string>;
  provider: SandboxProvider;
  authorizer: AuthorizationService;
  stop(): Promise<void>;
}

function writeOnce(path: string, make: () => string, mode = 0o644): string {
  if (!existsSync(path)) writeFileSync(path, make(), { mode });
  return readFileSync(path, 'utf8');
}

/** Starts one of the sandbox's servers; a taken port becomes `port_in_use` naming its setting. */
async function listenOn(server: { start(): Promise<void> }, port: number, setting: string): Promise<void> {
  try {
    await server.start();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    throw new ActionLedgerError(
      'port_in_use',
      `port ${port} (${setting}) is in use; set ${setting} in the configuration to a free port`,
      { cause: err, details: { port, setting } },
    );
  }
}

/**
 * Starts the sandbox on the service's database (`databaseUrl`). All or nothing: on failure whatever it
 * started is stopped again.
 * @throws ActionLedgerError `port_in_use` naming `sandbox.provider_port` or `sandbox.authorizer_port`.
 */
// eslint-disable-next-line max-lines-per-function -- all or nothing: every start step and the stop of what it started are in one place
export async function startDevSandbox(
  config: Config,
  env: NodeJS.ProcessEnv,
  log: Logger,
  databaseUrl: string,
): Promise<DevSandbox> {
  const dir = join(config.dataDir, 'sandbox');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const pki = await loadOrCreateDevPki(join(dir, 'pki'));
  const profilePaths = config.dispatcher.profile;
  if (profilePaths === null) throw new Error('sandbox enabled but no dispatch profile path');
  const keyPath = join(dir, 'profile-signing.key');
  const privateKeyPem = writeOnce(
    keyPath,
    () => {
      const pair = generateProfileKeyPair('ed25519');
      writeFileSync(profilePaths.publicKeyPath, pair.publicKeyPem);
      return pair.privateKeyPem;
    },
    0o600,
  );
  const profile = Buffer.from(
    JSON.stringify(
      {
        profile_id: 'sandbox-dev',
        authorization_url: `https://localhost:${config.sandbox.authorizerPort}/v1/authorize`,
        maximum_authorization_age_seconds: 60,
        maximum_authorization_ttl_seconds: 120,
        maximum_clock_skew_seconds: 5,
        authorization_http_timeout_seconds: 5,
        provider_http_timeout_seconds: 10,
        authorization_response_max_bytes: 16384,
        provider_response_max_bytes: 65536,
      },
      null,
      2,
    ) + '\n',
  );
  writeFileSync(profilePaths.path, profile);
  writeFileSync(profilePaths.signaturePath, signProfile({ profileBytes: profile, privateKeyPem }) + '\n');

  const tokenPath = join(dir, 'provider-token');
  const generated = writeOnce(tokenPath, () => randomBytes(24).toString('base64url'), 0o600).trim();
  const workerEnv: Record<string, string> = {};
  let token: string | undefined;
  for (const route of config.tools.values()) {
    if (route.credentialEnv === null) continue;
    const value = env[route.credentialEnv];
    token ??= value !== undefined && value !== '' ? value : generated;
    if (value === undefined || value === '') workerEnv[route.credentialEnv] = generated;
  }
  const tls = { cert: pki.server.cert, key: pki.server.key, ca: pki.ca.cert };
  // Every configured tool path on this provider's port is served (issue_refund and its compensation, void_refund):
  // the tools written as paths alone, which the configuration resolved against sandbox.provider_port.
  const paths = [
    ...new Set(
      [...config.tools.values()]
        .map((r) => new URL(r.endpoint))
        .filter((u) => (u.port === '' ? 443 : Number(u.port)) === config.sandbox.providerPort)
        .map((u) => u.pathname),
    ),
  ];
  const [first, ...extraPaths] = paths;
  const provider = new SandboxProvider({
    tls,
    port: config.sandbox.providerPort,
    ...(first === undefined ? {} : { path: first, extraPaths }),
    ...(token === undefined ? {} : { token }),
    // What it applied survives a restart, so readback and verify agree with the ledger in development too.
    journal: join(dir, 'provider-effects.jsonl'),
  });
  // The service decides from the same database as the fleet.
  const pool = createPool(databaseUrl, {
    max: 4,
    statementTimeoutMs: config.database.statementTimeoutMs,
    applicationName: 'actionledger:authorizer',
  });
  const authorizer = new AuthorizationService({ config, pool, tls, port: config.sandbox.authorizerPort });
  try {
    await listenOn(provider, config.sandbox.providerPort, 'sandbox.provider_port');
    await listenOn(authorizer, config.sandbox.authorizerPort, 'sandbox.authorizer_port');
  } catch (err) {
    await provider.stop().catch(() => undefined);
    await authorizer.stop().catch(() => undefined);
    await pool.end().catch(() => undefined);
    throw err;
  }
  log.info(
    { provider: provider.url, authorizer: authorizer.url, pki: pki.dir },
    'sandbox provider and authorizer running (development only)',
  );
  return {
    env: workerEnv,
    provider,
    authorizer,
    stop: async () => {
      await provider.stop();
      await authorizer.stop();
      await pool.end();
    },
  };
}
