/**
 * The console's forms: bodies posted as application/x-www-form-urlencoded, read strictly (each field once, text
 * only), and the CSRF check every POST passes before its fields are used.
 */
import type { FastifyRequest } from 'fastify';
import { ActionLedgerError } from '../../core/errors.js';
import { checkCsrf } from './session.js';

export type Form = Record<string, string>;

/** A form body: each field once, text only. Throws `invalid_request`. */
export function parseForm(body: string): Form {
  const out: Form = {};
  for (const [k, v] of new URLSearchParams(body)) {
    if (Object.hasOwn(out, k))
      throw new ActionLedgerError('invalid_request', `the field ${k} was sent twice`, { details: { field: k } });
    out[k] = v;
  }
  return out;
}

/** The form of a POST, with its CSRF token checked first. */
export function form(request: FastifyRequest): Form {
  const type = (request.headers['content-type'] ?? '').split(';')[0]?.trim().toLowerCase();
  if (type !== 'application/x-www-form-urlencoded')
    throw new ActionLedgerError('unsupported_media_type', 'the console takes HTML forms only');
  const body = (request.body ?? {}) as Form;
  checkCsrf(request, body.csrf);
  return body;
}
