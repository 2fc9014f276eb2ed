/**
 * Effect keys: `v1.<key id>.<hex HMAC-SHA256>` over a versioned, domain-separated label and the operation id.
 *
 * The key depends only on the secret, its key id and the operation id: never on the caller, the arguments or
 * the approval, so it survives re-approval and policy rotation, and nobody outside the service can choose or
 * predict it. The key id travels inside the key, so a rotated-out secret can still verify old keys.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { EffectKeySecrets } from '../config/index.js';
import { ActionLedgerError } from '../core/errors.js';

const LABEL = 'actionledger/effect-key/v1';
const FORMAT = /^v1\.([a-z0-9][a-z0-9-]{0,15})\.([0-9a-f]{64})$/;

export class EffectKeyer {
  readonly #keys: EffectKeySecrets;

  constructor(keys: EffectKeySecrets) {
    if (!keys.secrets.has(keys.active))
      throw new ActionLedgerError('secret_missing', `active effect key ${keys.active} has no secret`);
    this.#keys = keys;
  }

  get activeKeyId(): string {
    return this.#keys.active;
  }

  /** Mints the effect key of `operationId` with the active secret. */
  derive(operationId: string, keyId: string = this.#keys.active): string {
    const secret = this.#keys.secrets.get(keyId);
    if (secret === undefined) throw new ActionLedgerError('secret_missing', `no secret for effect key id ${keyId}`);
    const mac = createHmac('sha256', secret.reveal())
      .update(`${LABEL}\u0000${keyId}\u0000${operationId}`, 'utf8')
      .digest('hex');
    return `v1.${keyId}.${mac}`;
  }

  /** True when `effectKey` is the key this service mints for `operationId` (constant-time compare). */
  verify(operationId: string, effectKey: string): boolean {
    const m = FORMAT.exec(effectKey);
    if (m === null || !this.#keys.secrets.has(m[1] ?? '')) return false;
    const expected = Buffer.from(this.derive(operationId, m[1]));
    const actual = Buffer.from(effectKey);
    return expected.length === actual.length && timingSafeEqual(expected, actual);
  }
}
