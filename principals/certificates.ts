/**
 * Client certificates mapped to principals: the other credential the API accepts when its listener serves
 * TLS with a client CA (`http.tls.client_ca_file`). A mapping names the certificate by its SHA-256
 * fingerprint, the principal, and the one tenant it acts in; it ends when revoked or when the certificate
 * expires. The TLS handshake proves the caller holds the key of a certificate the CA issued; the mapping
 * decides who that is, so a certificate the CA issued but nobody mapped authenticates nobody.
 */
import { X509Certificate } from 'node:crypto';
import type { Config } from '../config/index.js';
import { bindQueries, type Pool } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { identifier } from '../core/identifier.js';
import type { AuditWriter } from '../gate/index.js';
import { audited, mustExist } from './audited.js';
import { principalQueries } from './queries.js';
import type { Authenticated } from './store.js';

export interface CertificateRow {
  fingerprint_sha256: string;
  principal_id: string;
  tenant_id: string;
  subject: string;
  not_after: Date;
  created_at: Date;
  created_by: string;
  revoked_at: Date | null;
  active: boolean;
}

const FINGERPRINT = /^[0-9a-f]{64}$/;

/** The lowercase hex SHA-256 fingerprint of a certificate, from its PEM or from `fingerprint256` (AA:BB:...). */
export function certificateFingerprint(pemOrColonHex: string): string {
  if (/^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$/.test(pemOrColonHex))
    return pemOrColonHex.replaceAll(':', '').toLowerCase();
  return new X509Certificate(pemOrColonHex).fingerprint256.replaceAll(':', '').toLowerCase();
}

export class PrincipalCertificates {
  readonly #config: Config;
  readonly #pool: Pool;
  readonly #audit: AuditWriter;
  readonly #q: Readonly<typeof principalQueries>;

  constructor(config: Config, pool: Pool, audit: AuditWriter) {
    this.#config = config;
    this.#pool = pool;
    this.#audit = audit;
    this.#q = bindQueries(principalQueries, config.schemaQuoted);
  }

  /**
   * Maps a certificate (PEM) to the principal in the tenant, where it must hold a role. Returns its
   * fingerprint. Throws `invalid_request` (not a certificate, or expired), `not_found`, `permission_denied`,
   * `operation_conflict` (the certificate is mapped already).
   */
  async add(principalId: string, tenantId: string, pem: string, actor: string): Promise<string> {
    const [id, tenant] = [identifier('principal_id', principalId), identifier('tenant_id', tenantId)];
    let cert: X509Certificate;
    try {
      cert = new X509Certificate(pem);
    } catch (cause) {
      throw new ActionLedgerError('invalid_request', 'not a PEM certificate', {
        cause,
        details: { field: 'certificate' },
      });
    }
    const notAfter = new Date(cert.validTo);
    if (!(notAfter.getTime() > Date.now()))
      throw new ActionLedgerError('invalid_request', `the certificate expired at ${notAfter.toISOString()}`, {
        details: { field: 'certificate' },
      });
    const fingerprint = certificateFingerprint(pem);
    await audited(
      this.#pool,
      this.#audit,
      {
        action: 'principal',
        outcome: 'certificate_mapped',
        context: { tenant_id: tenant, principal_id: id },
        subjectId: fingerprint,
      },
      actor,
      async (c) => {
        await mustExist(c, this.#q, id);
        if ((await c.query(this.#q.rolesHeld, [id, tenant])).rowCount === 0)
          throw new ActionLedgerError('permission_denied', `${id} holds no role in tenant ${tenant}: grant one first`);
        const inserted = await c.query(this.#q.certificateInsert, [
          fingerprint,
          id,
          tenant,
          cert.subject,
          notAfter,
          actor,
        ]);
        if (inserted.rowCount === 0)
          throw new ActionLedgerError('operation_conflict', 'that certificate is mapped already', {
            details: { fingerprint_sha256: fingerprint },
          });
      },
      () => ({ subject: cert.subject, not_after: notAfter.toISOString() }),
    );
    return fingerprint;
  }

  /** Ends a mapping; returns false when it had ended already. Throws `not_found`. */
  async revoke(fingerprint: string, actor: string): Promise<boolean> {
    const fp = fingerprint.toLowerCase();
    if (!FINGERPRINT.test(fp))
      throw new ActionLedgerError('not_found', 'no certificate is mapped with that fingerprint');
    return audited(
      this.#pool,
      this.#audit,
      { action: 'principal', outcome: 'certificate_revoked', subjectId: fp },
      actor,
      async (c) => {
        if ((await c.query(this.#q.certificateSelect, [fp])).rowCount === 0)
          throw new ActionLedgerError('not_found', 'no certificate is mapped with that fingerprint');
        return (await c.query(this.#q.certificateRevoke, [fp, actor])).rowCount !== 0;
      },
    );
  }

  async list(filter: { principal_id?: string; tenant_id?: string } = {}): Promise<CertificateRow[]> {
    const { rows } = await this.#pool.query<CertificateRow>(this.#q.certificateList, [
      filter.principal_id ?? null,
      filter.tenant_id ?? null,
    ]);
    return rows;
  }

  /**
   * The caller a verified client certificate stands for, with this request counted. Throws `unauthenticated`
   * (details.reason: unknown, expired, revoked).
   */
  async authenticate(fingerprint: string): Promise<Authenticated> {
    type Row = {
      fingerprint_sha256: string;
      principal_id: string;
      tenant_id: string;
      kind: Authenticated['kind'];
      roles: string[];
      revoked: boolean;
      expired: boolean;
      requests: number | null;
      window_left_s: number | null;
    };
    const { rows } = await this.#pool.query<Row>(this.#q.authenticateCertificate, [
      fingerprint,
      this.#config.api.rateLimit.windowS,
    ]);
    const row = rows[0];
    const refuse = (reason: string) =>
      new ActionLedgerError(
        'unauthenticated',
        `the client certificate is ${reason === 'unknown' ? 'not mapped to a principal' : reason}`,
        {
          details: { reason, credential: 'certificate' },
        },
      );
    if (row === undefined) throw refuse('unknown');
    if (row.revoked) throw refuse('revoked');
    if (row.expired) throw refuse('expired');
    return {
      token_id: `certificate:${row.fingerprint_sha256}`,
      principal_id: row.principal_id,
      tenant_id: row.tenant_id,
      kind: row.kind,
      roles: row.roles,
      requests: row.requests ?? 0,
      window_left_s: Math.max(1, row.window_left_s ?? 1),
    };
  }
}
