/**
 * Effect-key secrets: resolved once at start from the environment, each at least 32 bytes. The embedded
 * default (no database URL) generates a missing secret into its data folder with mode 0600 and says so;
 * with a real database a missing secret refuses start (`secret_missing`).
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from './types.js';
import { ActionLedgerError } from '../core/errors.js';
import { Secret } from '../core/secret.js';

export const MIN_SECRET_BYTES = 32;

export interface EffectKeySecrets {
  readonly active: string;
  readonly secrets: ReadonlyMap<string, Secret>;
}

export function resolveEffectKeySecrets(
  config: Config,
  env: NodeJS.ProcessEnv,
  options: { embedded: boolean; onGenerated?: (path: string, keyId: string) => void },
): EffectKeySecrets {
  const secrets = new Map<string, Secret>();
  const problems: string[] = [];
  for (const [id, { secretEnv }] of Object.entries(config.effectKeys.keys)) {
    let value = env[secretEnv];
    if ((value === undefined || value === '') && options.embedded) {
      const path = join(config.dataDir, `effect-key-${id}.secret`);
      if (!existsSync(path)) {
        try {
          writeFileSync(path, randomBytes(32).toString('hex') + '\n', { mode: 0o600, flag: 'wx' });
          options.onGenerated?.(path, id);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        }
      }
      value = readFileSync(path, 'utf8').trim();
    }
    if (value === undefined || value === '') {
      problems.push(`effect key ${id}: environment variable ${secretEnv} is not set`);
      continue;
    }
    const bytes = Buffer.from(value, 'utf8');
    if (bytes.byteLength < MIN_SECRET_BYTES) {
      problems.push(
        `effect key ${id}: ${secretEnv} holds ${bytes.byteLength} bytes, at least ${MIN_SECRET_BYTES} are required`,
      );
      continue;
    }
    secrets.set(id, new Secret(bytes));
  }
  if (problems.length > 0) {
    throw new ActionLedgerError(
      'secret_missing',
      `effect-key secrets are missing or too short:\n  - ${problems.join('\n  - ')}`,
      {
        details: { problems },
      },
    );
  }
  return { active: config.effectKeys.active, secrets };
}
