/**
 * `actionledger profile keygen|sign|verify`: make a signing key, sign a dispatch profile, and check a signed
 * profile exactly as the dispatcher does at start-up. The signature format is cosign's (`sign-blob --key`,
 * P-256) or raw Ed25519, so a profile signed with cosign verifies here and one signed here needs no cosign.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ActionLedgerError } from '../../core/errors.js';
import {
  generateProfileKeyPair,
  loadVerifiedProfile,
  publicKeyPemOf,
  signProfile,
  verifyProfile,
  type ProfileKeyKind,
} from '../../protocol/index.js';
import {
  EXIT,
  JSON_ALWAYS,
  parseCommand,
  printJson,
  printRefusal,
  runSubcommand,
  stringValues,
  usageError,
  type Command,
} from '../cli-util.js';

export const PRIVATE_KEY_FILE = 'profile-signing.key';
export const PUBLIC_KEY_FILE = 'profile-signing.pub';

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

const keygenCommand: Command = {
  name: 'profile keygen',
  summary: 'make a profile signing key pair (never overwrites one)',
  options: {
    kind: {
      type: 'string',
      value: 'ecdsa-p256|ed25519',
      required: true,
      description: 'key type (ecdsa-p256 is cosign-compatible)',
    },
    'out-dir': {
      type: 'string',
      value: 'DIR',
      required: true,
      description: `directory for ${PRIVATE_KEY_FILE} (mode 0600) and ${PUBLIC_KEY_FILE}; created when missing`,
    },
    json: JSON_ALWAYS,
  },
  examples: ['actionledger profile keygen --kind ecdsa-p256 --out-dir ./keys'],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  notes: 'A key already in DIR is a usage error (exit 2): a signing key someone may depend on is never replaced.',
  run: keygen,
};

async function keygen(argv: string[]): Promise<number> {
  const v = parseCommand(keygenCommand, argv);
  if (typeof v === 'number') return v;
  const kind = v.values.kind;
  if (kind !== 'ecdsa-p256' && kind !== 'ed25519') {
    return usageError(keygenCommand, `--kind must be ecdsa-p256 or ed25519, not ${JSON.stringify(kind)}`);
  }
  const dir = String(v.values['out-dir']);
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
        return usageError(keygenCommand, `a key already exists in ${dir}; refusing to overwrite it`);
      }
      throw err;
    }
    printJson({ ok: true, kind, private_key: privatePath, public_key: publicPath });
    return EXIT.ok;
  } catch (err) {
    return printRefusal(err);
  }
}

const signCommand: Command = {
  name: 'profile sign',
  summary: 'sign a dispatch profile, after checking it exactly as the dispatcher will',
  options: {
    profile: { type: 'string', value: 'FILE', required: true, description: 'the dispatch profile (JSON) to sign' },
    key: { type: 'string', value: 'PRIVATE.pem', required: true, description: 'the private signing key' },
    out: {
      type: 'string',
      value: 'FILE.sig',
      description: 'write the signature here and print a JSON result',
      default: 'the base64 signature alone on stdout',
    },
    json: {
      type: 'boolean',
      description: 'without --out: print one JSON document holding the signature (signature_base64)',
      default: 'off',
    },
  },
  examples: [
    'actionledger profile sign --profile profile.json --key keys/profile-signing.key --out profile.json.sig',
    'actionledger profile sign --profile profile.json --key keys/profile-signing.key > profile.json.sig',
  ],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  run: sign,
};

async function sign(argv: string[]): Promise<number> {
  const parsed = parseCommand(signCommand, argv);
  if (typeof parsed === 'number') return parsed;
  const v = stringValues(parsed.values);
  try {
    const profileBytes = await readInput(v.profile ?? '', 'profile');
    const privateKeyPem = (await readInput(v.key ?? '', 'private key')).toString('utf8');
    const signature = signProfile({ profileBytes, privateKeyPem });
    // Check the result the way the dispatcher will, so a profile that would be refused at start-up is
    // refused now, before anyone ships its signature.
    const profile = verifyProfile({ profileBytes, signature, publicKeyPem: publicKeyPemOf(privateKeyPem) });
    if (v.out === undefined) {
      if (parsed.values.json === true)
        printJson({ ok: true, profile_id: profile.profileId, sha256: profile.sha256, signature_base64: signature });
      else process.stdout.write(`${signature}\n`);
      return EXIT.ok;
    }
    await writeFile(v.out, `${signature}\n`, { mode: 0o644 });
    printJson({ ok: true, profile_id: profile.profileId, sha256: profile.sha256, signature: v.out });
    return EXIT.ok;
  } catch (err) {
    return printRefusal(err);
  }
}

const verifyCommand: Command = {
  name: 'profile verify',
  summary: 'check a signed dispatch profile exactly as the dispatcher does at start-up',
  options: {
    profile: { type: 'string', value: 'FILE', required: true, description: 'the dispatch profile (JSON)' },
    signature: { type: 'string', value: 'FILE.sig', required: true, description: 'its signature (base64)' },
    key: { type: 'string', value: 'PUBLIC.pem', required: true, description: 'the public key to check it with' },
    json: JSON_ALWAYS,
  },
  examples: [
    'actionledger profile verify --profile profile.json --signature profile.json.sig --key keys/profile-signing.pub',
  ],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  run: verify,
};

async function verify(argv: string[]): Promise<number> {
  const parsed = parseCommand(verifyCommand, argv);
  if (typeof parsed === 'number') return parsed;
  const v = stringValues(parsed.values);
  try {
    const profile = await loadVerifiedProfile({
      profilePath: v.profile ?? '',
      signaturePath: v.signature ?? '',
      publicKeyPath: v.key ?? '',
    });
    printJson({ ok: true, profile_id: profile.profileId, sha256: profile.sha256 });
    return EXIT.ok;
  } catch (err) {
    return printRefusal(err);
  }
}

export const profileCommand: Command = {
  name: 'profile',
  summary: 'make a profile signing key, sign a dispatch profile, or verify a signed one',
  options: {},
  examples: [...keygenCommand.examples, ...signCommand.examples.slice(0, 1), ...verifyCommand.examples],
  exits: [EXIT.ok, EXIT.refused, EXIT.usage],
  subcommands: new Map([
    ['keygen', keygenCommand],
    ['sign', signCommand],
    ['verify', verifyCommand],
  ]),
  run(argv) {
    return runSubcommand(this, argv);
  },
};
