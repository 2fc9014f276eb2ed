/**
 * `actionledger profile keygen|sign|verify`: make a signing key, sign a dispatch profile, and check a signed
 * profile exactly as the dispatcher does at start-up. The signature format is cosign's (`sign-blob --key`,
 * P-256) or raw Ed25519, so a profile signed with cosign verifies here and one signed here needs no cosign.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { ActionLedgerError } from '../../core/errors.js';
import {
  generateProfileKeyPair,
  loadVerifiedProfile,
  publicKeyPemOf,
  signProfile,
  verifyProfile,
  type ProfileKeyKind,
} from '../../core/profile.js';
import { printJson, printRefusal, usageError, type Command } from '../cli-util.js';

const USAGE = [
  'actionledger profile keygen --kind ecdsa-p256|ed25519 --out-dir DIR',
  '       actionledger profile sign --profile FILE --key PRIVATE.pem [--out FILE.sig]',
  '       actionledger profile verify --profile FILE --signature FILE.sig --key PUBLIC.pem',
].join('\n');

export const PRIVATE_KEY_FILE = 'profile-signing.key';
export const PUBLIC_KEY_FILE = 'profile-signing.pub';

type Values = Record<string, string | undefined>;

/** Parses one subcommand's options (all strings, all required unless listed optional); a string is a usage error. */
function options(argv: string[], required: string[], optional: string[] = []): Values | string {
  try {
    const { values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: Object.fromEntries([...required, ...optional].map((k) => [k, { type: 'string' as const }])),
    });
    const v: Values = values;
    const missing = required.filter((k) => v[k] === undefined || v[k] === '');
    if (missing.length > 0) return `missing --${missing.join(', --')}`;
    return v;
  } catch (err) {
    return (err as Error).message;
  }
}

async function readInput(path: string, what: string): Promise<Buffer> {
  try {
    return await readFile(path);
  } catch (cause) {
    throw new ActionLedgerError(
      'profile_invalid',
      `cannot read the ${what} file ${path}: ${(cause as NodeJS.ErrnoException).code ?? 'error'}`,
      { cause },
    );
  }
}

async function keygen(argv: string[]): Promise<number> {
  const v = options(argv, ['kind', 'out-dir']);
  if (typeof v === 'string') return usageError('profile keygen', v, USAGE);
  const kind = v.kind;
  if (kind !== 'ecdsa-p256' && kind !== 'ed25519') {
    return usageError('profile keygen', `--kind must be ecdsa-p256 or ed25519, not ${JSON.stringify(kind)}`, USAGE);
  }
  const dir = v['out-dir'] ?? '';
  const privatePath = join(dir, PRIVATE_KEY_FILE);
  const publicPath = join(dir, PUBLIC_KEY_FILE);
  try {
    const pair = generateProfileKeyPair(kind satisfies ProfileKeyKind);
    await mkdir(dir, { recursive: true, mode: 0o700 });
    try {
      // 'wx': never overwrite a signing key someone may still depend on.
      await writeFile(privatePath, pair.privateKeyPem, { mode: 0o600, flag: 'wx' });
      await writeFile(publicPath, pair.publicKeyPem, { mode: 0o644, flag: 'wx' });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') {
        return usageError('profile keygen', `a key already exists in ${dir}; refusing to overwrite it`, USAGE);
      }
      throw err;
    }
    printJson({ ok: true, kind, private_key: privatePath, public_key: publicPath });
    return 0;
  } catch (err) {
    return printRefusal(err);
  }
}

async function sign(argv: string[]): Promise<number> {
  const v = options(argv, ['profile', 'key'], ['out']);
  if (typeof v === 'string') return usageError('profile sign', v, USAGE);
  try {
    const profileBytes = await readInput(v.profile ?? '', 'profile');
    const privateKeyPem = (await readInput(v.key ?? '', 'private key')).toString('utf8');
    const signature = signProfile({ profileBytes, privateKeyPem });
    // Check the result the way the dispatcher will, so a profile that would be refused at start-up is
    // refused now, before anyone ships its signature.
    const profile = verifyProfile({ profileBytes, signature, publicKeyPem: publicKeyPemOf(privateKeyPem) });
    if (v.out === undefined) {
      process.stdout.write(`${signature}\n`);
      return 0;
    }
    await writeFile(v.out, `${signature}\n`, { mode: 0o644 });
    printJson({ ok: true, profile_id: profile.profileId, sha256: profile.sha256, signature: v.out });
    return 0;
  } catch (err) {
    return printRefusal(err);
  }
}

async function verify(argv: string[]): Promise<number> {
  const v = options(argv, ['profile', 'signature', 'key']);
  if (typeof v === 'string') return usageError('profile verify', v, USAGE);
  try {
    const profile = await loadVerifiedProfile({
      profilePath: v.profile ?? '',
      signaturePath: v.signature ?? '',
      publicKeyPath: v.key ?? '',
    });
    printJson({ ok: true, profile_id: profile.profileId, sha256: profile.sha256 });
    return 0;
  } catch (err) {
    return printRefusal(err);
  }
}

const SUBCOMMANDS: Record<string, (argv: string[]) => Promise<number>> = { keygen, sign, verify };

export const profileCommand: Command = {
  summary: 'make a profile signing key, sign a dispatch profile, or verify a signed one',
  usage: USAGE,
  async run(argv) {
    const [name, ...rest] = argv;
    const sub = name === undefined ? undefined : SUBCOMMANDS[name];
    if (sub === undefined) {
      return usageError(
        'profile',
        name === undefined ? 'missing subcommand' : `unknown subcommand ${JSON.stringify(name)}`,
        USAGE,
      );
    }
    return sub(rest);
  },
};
